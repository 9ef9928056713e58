"""Harness adapters behind one seam (:mod:`crosstalk.harness.base`)."""

"""Harness adapters behind one seam (:mod:`crosstalk.harness.base`), loaded from the
``crosstalk.harnesses`` entry-point group (:mod:`crosstalk.harness.loader`)."""

from crosstalk.harness.loader import GROUP, by_name, discoveries, identifiers, plugins, socket_dir
from crosstalk.harness.plugin import HarnessPlugin, ShimContext

__all__ = ["GROUP", "HarnessPlugin", "ShimContext", "by_name", "discoveries", "identifiers",
           "plugins", "socket_dir"]

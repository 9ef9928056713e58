"""``crosstalk watch``: every session and every message on this machine, live, read-only.

:mod:`~crosstalk.watch.model` is the picture as data, :mod:`~crosstalk.watch.feed` keeps it up
to date from the registry and the journals, :mod:`~crosstalk.watch.lines` prints it one line
per change (``--plain``/``--json``) and :mod:`~crosstalk.watch.app` draws it (textual).
"""

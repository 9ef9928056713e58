"""The package version, in one place (read by hatch at build time and by ``--version``)."""

__version__ = "0.1.0"

"""The package version, in the lowest layer so that any module can record it."""

__version__ = "0.1.0"

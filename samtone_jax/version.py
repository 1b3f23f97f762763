"""The package version (setup.py reads the same number)."""

__version__ = "0.1.0"

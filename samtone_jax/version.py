"""The package version (setup.py states the same number: keep the two equal)."""

__version__ = "0.1.0"

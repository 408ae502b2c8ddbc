"""geode's version (one place: the package, model files and caches read it here)."""

__version__ = "0.1.0"

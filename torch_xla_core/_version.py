"""The package's version, in one place: the build reads it from here
(pyproject.toml's regex provider, build/flavors.base_version) and the
modules import it from here (txc.__version__, _compat's error messages,
compile_cache's key). It imports nothing, so nothing circles through it."""
__version__ = "0.1.0"

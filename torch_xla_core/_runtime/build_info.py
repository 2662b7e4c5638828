"""Build facts of this install: the C++-ABI flavor and the versions in use.

Owns `build_info()`. The ABI is read from the compiled core
(`_C.cxx11_abi()`, the `_GLIBCXX_USE_CXX11_ABI` value its translation units
were compiled with), never from metadata; the version and its local label
come from the installed distribution's metadata, so the two can be checked
against each other (`flavor_consistent`). Imports only `_C` and
importlib.metadata, so it works while the rest of the package does not.
"""

from __future__ import annotations

import importlib.metadata as _md
from pathlib import Path

from torch_xla_core import _C

# The flavor matrix (build/flavors.toml): compiled ABI -> flavor name, and
# the local version label each flavor's wheel carries.
FLAVOR_BY_CXX11_ABI = {True: "cxx11", False: "precxx11"}
LOCAL_LABEL = {"cxx11": "", "precxx11": "precxx11"}
DIST_NAME = "torch_xla_core"


def _dist_version(name: str) -> str | None:
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return None


def _module_version(module: str) -> str | None:
    """Version of an importable module, without importing it when the
    distribution metadata says it (importing torch or jax is slow)."""
    v = _dist_version(module)
    if v is not None:
        return v
    try:
        mod = __import__(module)
    except Exception:  # not installed, or broken: report it as absent
        return None
    return getattr(mod, "__version__", None)


def flavor() -> str:
    """The flavor of the compiled core: "cxx11" or "precxx11"."""
    return FLAVOR_BY_CXX11_ABI[bool(_C.cxx11_abi())]


def build_info() -> dict:
    """What this install is: flavor, ABI, compiler and the versions in use.

    Keys: flavor ("cxx11" | "precxx11"), cxx11_abi (bool, from the compiled
    core), compiler, version (of torch_xla_core, with its local label),
    local_label, flavor_consistent (the label matches the compiled ABI;
    None when no distribution metadata is found, e.g. running from a source
    tree), torch, jax, jaxlib (None when not installed).
    """
    cxx11_abi = bool(_C.cxx11_abi())
    fl = FLAVOR_BY_CXX11_ABI[cxx11_abi]
    version = _dist_version(DIST_NAME)
    label = None if version is None else version.partition("+")[2]
    return {
        "flavor": fl,
        "cxx11_abi": cxx11_abi,
        "compiler": _C.compiler(),
        "version": version,
        "local_label": label,
        "flavor_consistent": None if label is None else label == LOCAL_LABEL[fl],
        "torch": _module_version("torch"),
        "jax": _module_version("jax"),
        "jaxlib": _module_version("jaxlib"),
    }


def get_include() -> str:
    """The folder holding the core's C++ API headers (the wheel's
    torch_xla_core/include): `#include <torch_xla_core/ops/registry.h>`."""
    return str(_pkg_dir() / "include")


def get_cmake_dir() -> str:
    """The folder of torch_xla_coreConfig.cmake, for find_package(torch_xla_core)
    (set torch_xla_core_DIR to it, or add it to CMAKE_PREFIX_PATH)."""
    return str(_pkg_dir() / "share" / "cmake" / "torch_xla_core")


def _pkg_dir():
    return Path(__file__).resolve().parent.parent  # the package's folder (this file is in _runtime/)


if __name__ == "__main__":  # python -m torch_xla_core._runtime.build_info
    import json

    print(json.dumps(build_info(), indent=2))

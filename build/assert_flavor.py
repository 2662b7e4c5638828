#!/usr/bin/env python3
"""Assert the installed torch_xla_core is the flavor that was asked for.

    python build/assert_flavor.py [FLAVOR]      # default: $TXC_ABI, else cxx11

cibuildwheel's test-command (and image smoke tests) run it after installing
the wheel. It loads only the compiled core and build_info, not the package
__init__ (which imports torch): the wheel can be checked with --no-deps, so
a test step never downloads torch. Exits non-zero, naming both flavors, when
the compiled ABI, the flavor or the version label disagree.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flavors  # noqa: E402  build/flavors.py: the matrix

MATRIX = flavors.load()


def main() -> int:
    want = MATRIX[(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(MATRIX.env_var))
                  or MATRIX.default]
    spec = importlib.util.find_spec("torch_xla_core")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        print("torch_xla_core is not installed", file=sys.stderr)
        return 1
    pkg = types.ModuleType("torch_xla_core")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["torch_xla_core"] = pkg
    from torch_xla_core._runtime import build_info

    info = build_info.build_info()
    version = md.version("torch_xla_core")
    print(json.dumps({**info, "from": pkg.__path__[0]}))
    label = version.partition("+")[2]
    errors = []
    if info["flavor"] != want.name or info["cxx11_abi"] != want.cxx11_abi:
        errors.append(f"compiled core is flavor {info['flavor']} "
                      f"(_GLIBCXX_USE_CXX11_ABI={int(info['cxx11_abi'])}), wanted {want.name}")
    if label != want.local_label:
        errors.append(f"version {version} carries label {label!r}; flavor {want.name} "
                      f"carries {want.local_label!r}")
    for e in errors:
        print(f"assert_flavor: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

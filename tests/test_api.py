"""The public API, snapshotted: `txc.*` and every documented module's public
names (the docs site's pages, ARCHITECTURE.md and docs/porting.md name them; the
site's API reference, docs/conf.py, has an entry for each), compared with
tests/api_snapshot.txt, so that moving modules around (issue 39's folders per
layer) cannot drop or rename a name unseen. A module's public names are its
__all__ where it has one, else the names not starting with "_" that are
defined in the package (third-party imports such as `torch` are not API).

After a deliberate API change, regenerate the snapshot and review its diff:

    python tests/test_api.py --write
"""
import importlib
import inspect
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent / "api_snapshot.txt"
PKG = "torch_xla_core"
# The documented modules (the compat layer's modules are added by walking it: docs/porting.md lists them all)
DOCUMENTED = ["amp", "checkpoint", "config", "data", "debug", "distributed", "distributed_checkpoint", "kernels",
              "launch", "memory", "metrics", "offload", "patched_linear", "profiler", "scan", "sharding",
              "compat.torch_xla"]


def _kind(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "value"


def _ours(obj) -> bool:
    """Whether obj belongs to the package (or is a plain value it defines),
    as opposed to a third-party name it imported."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__ == PKG or obj.__name__.startswith(PKG + ".")
    owner = getattr(obj, "__module__", None)
    if isinstance(owner, str) and (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)
                                   or type(obj).__module__ == "typing"):
        return owner == PKG or owner.startswith(PKG + ".")
    return True


def _public_names(mod) -> list[tuple[str, str]]:
    if hasattr(mod, "__all__"):
        names = list(mod.__all__)
        missing = [n for n in names if not hasattr(mod, n)]
        assert not missing, f"{mod.__name__}.__all__ names what it does not define: {missing}"
    else:
        names = [n for n in vars(mod) if not n.startswith("_") and _ours(getattr(mod, n))]
    names += [n for n in ("__version__",) if hasattr(mod, n)]
    return sorted((n, _kind(getattr(mod, n))) for n in names)


def _documented_modules() -> list[str]:
    mods = [PKG] + [f"{PKG}.{m}" for m in DOCUMENTED]
    compat = importlib.import_module(f"{PKG}.compat.torch_xla")
    mods += [m.name for m in pkgutil.walk_packages(compat.__path__, compat.__name__ + ".")
             if not any(p.startswith("_") for p in m.name.split("."))]
    return sorted(set(mods))


def api_lines() -> list[str]:
    """The API, one `module.name kind` a line. The root's names first, right
    after `import torch_xla_core` (importing a submodule later binds it on
    the root too): run in a fresh interpreter (api_lines_fresh) for a
    listing that does not depend on what else was imported."""
    root = importlib.import_module(PKG)
    lines = [f"{PKG}.{n} {kind}" for n, kind in _public_names(root)]
    for name in _documented_modules():
        if name != PKG:
            lines += [f"{name}.{n} {kind}" for n, kind in _public_names(importlib.import_module(name))]
    return lines


def api_lines_fresh() -> list[str]:
    p = subprocess.run([sys.executable, __file__, "--print"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_the_public_api_is_the_snapshot():
    want = SNAPSHOT.read_text().splitlines()
    have = api_lines_fresh()
    dropped = sorted(set(want) - set(have))
    added = sorted(set(have) - set(want))
    assert not dropped and not added, (
        "the public API differs from tests/api_snapshot.txt;\n"
        f"dropped or changed ({len(dropped)}):\n  " + "\n  ".join(dropped) +
        f"\nnew ({len(added)}):\n  " + "\n  ".join(added) +
        "\nif that is meant, run `python tests/test_api.py --write` and commit the snapshot's diff")


def test_the_snapshot_sees_the_documented_api():
    have = set(SNAPSHOT.read_text().splitlines())
    for line in ["torch_xla_core.sync function", "torch_xla_core.compile function", "torch_xla_core.__version__ value",
                 "torch_xla_core.sharding.Mesh class", "torch_xla_core.scan.scan_layers function",
                 "torch_xla_core.debug.explain_recompiles function", "torch_xla_core.metrics.short_report function",
                 "torch_xla_core.compat.torch_xla.core.xla_model.mark_step function"]:
        assert line in have, line
    assert "torch_xla_core.torch module" not in have and "torch_xla_core.jax module" not in have  # third-party


if __name__ == "__main__":
    if sys.argv[1:] == ["--print"]:
        print("\n".join(api_lines()))
    elif sys.argv[1:] == ["--write"]:
        lines = api_lines()
        SNAPSHOT.write_text("\n".join(lines) + "\n")
        print(f"wrote {SNAPSHOT} ({len(lines)} names)")
    else:
        sys.exit("usage: python tests/test_api.py --write   (rewrites tests/api_snapshot.txt; --print shows it)")

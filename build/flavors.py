"""Reads the release matrix (build/flavors.toml): the C++-ABI flavors and
the CPython versions, for the scripts in build/, the noxfile and the
packaging tests. Owns nothing else.

Load it by path (`runpy`/`importlib`) or with build/ on sys.path: never as
`build.flavors`, since a package named `build` would shadow pypa's build.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATRIX = Path(__file__).resolve().parent / "flavors.toml"
DIST = "torch_xla_core"
# The same pattern scikit-build-core's regex version provider uses.
_VERSION_RE = re.compile(r"""(?m)^__version__\s*=\s*['"](?P<value>[^'"]+)['"]""")


@dataclass(frozen=True)
class Flavor:
    name: str
    cxx11_abi: bool
    local_label: str
    build_dir: str
    wheelhouse: str
    image_suffix: str
    is_default: bool

    def version(self, base: str) -> str:
        """The wheel version of this flavor for the base version."""
        return f"{base}+{self.local_label}" if self.local_label else base

    def env(self, var: str) -> dict[str, str]:
        return {var: self.name}

    def wheelhouse_dir(self, root: Path = ROOT) -> Path:
        return root / self.wheelhouse

    def install_command(self, base: str) -> list[str]:
        """The documented install command for this flavor from its own
        wheelhouse folder. Always the exact version: `==0.1.0` alone would
        match `0.1.0+precxx11` too, and pip prefers the labelled one."""
        return ["pip", "install", f"{DIST}=={self.version(base)}",
                "-f", self.wheelhouse]


def cp_tag(version: str) -> str:
    """"3.12" -> "cp312", the CPython tag of wheels and cibuildwheel ids."""
    major, minor = version.split(".")
    return f"cp{major}{minor}"


@dataclass(frozen=True)
class Matrix:
    default: str
    env_var: str
    flavors: dict[str, Flavor]
    pythons: tuple[str, ...] = ()      # CPython versions of a release, "3.11", ...
    default_python: str = ""
    default_torch: str = ""            # [torch] default: the sessions', images' and release smoke's torch

    def cibw_build(self) -> str:
        """cibuildwheel's `build` selector for the Python list."""
        return " ".join(f"{cp_tag(v)}-*" for v in self.pythons)

    def classifiers(self) -> list[str]:
        return [f"Programming Language :: Python :: {v}" for v in self.pythons]

    def __iter__(self):
        return iter(self.flavors.values())

    def __getitem__(self, name: str) -> Flavor:
        try:
            return self.flavors[name]
        except KeyError:
            raise KeyError(f"unknown flavor {name!r}; build/flavors.toml has "
                           f"{sorted(self.flavors)}") from None

    def names(self) -> list[str]:
        return list(self.flavors)

    def by_abi(self, cxx11_abi: bool) -> Flavor:
        (f,) = [f for f in self if f.cxx11_abi == cxx11_abi]
        return f


def load(path: Path = MATRIX) -> Matrix:
    data = tomllib.loads(Path(path).read_text())
    default = data["default"]
    flavors = {
        name: Flavor(name=name, is_default=(name == default), **spec)
        for name, spec in data["flavors"].items()
    }
    if default not in flavors or flavors[default].local_label:
        raise ValueError(f"{path}: the default flavor {default!r} must exist "
                         "and carry no local label (a PyPI release can't)")
    if len({f.cxx11_abi for f in flavors.values()}) != len(flavors):
        raise ValueError(f"{path}: two flavors share one ABI")
    py = data["python"]
    versions = tuple(py["versions"])
    keys = [tuple(map(int, v.split("."))) for v in versions]
    if keys != sorted(set(keys)) or py["default"] not in versions:
        raise ValueError(f"{path}: [python] versions must be ascending and distinct "
                         f"and hold the default {py['default']!r}; got {list(versions)}")
    return Matrix(default=default, env_var=data["env"], flavors=flavors,
                  pythons=versions, default_python=py["default"],
                  default_torch=data.get("torch", {}).get("default", ""))


def base_version(root: Path = ROOT) -> str:
    """`__version__` of torch_xla_core/_version.py, as the build reads it."""
    text = (root / "torch_xla_core" / "_version.py").read_text()
    m = _VERSION_RE.search(text)
    if not m:
        raise ValueError("torch_xla_core/_version.py has no __version__ = '...'")
    return m["value"]

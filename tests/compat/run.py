#!/usr/bin/env python3
"""The compat matrix (`nox -s compat`; plain Python, usable without nox):
the built wheel in a venv per torch version, the compat suite
(tests/compat/test_compat.py) run in each, one table torch version x check.

    python tests/compat/run.py                       # every torch of TORCHES
    python tests/compat/run.py --torch 2.11 2.15     # CI: the oldest and the newest
    python tests/compat/run.py --torch 2.13 -k autocast
    python tests/compat/run.py --torch 2.14 --conformance-on 2.14   # + the conformance files

Venvs: CACHE/venvs/torch-X.Y (CACHE: $TXC_COMPAT_CACHE, default
~/.cache/torch_xla_core-compat), made once and reused while their
requirements (stamped in the venv) are unchanged: torch from the package
index (CUDA builds that run on the CPU, 4.5-5.5 GB with their nvidia-*
wheels; 2.13.0 is the CPU build pip finds in /opt/wheels), jax, numpy,
transformers 5.x, pytest. pip's own cache keeps nothing on these machines
(the index's responses are not cacheable), so the venvs are the cache; a
missing one costs 1-1.5 min here. PIP_CONSTRAINT=/dev/null lifts the
machine's torch<=2.14.1 cap for these pips only.

Per venv: torch_xla_core is uninstalled, the wheel (wheelhouse/<flavor>/,
made by build/wheels.py) installed with its dependencies, and the torch
version compared before and after (pip must keep the user's torch); then
pytest on a copy of tests/compat and tests/conformance (with tests/conftest.py)
outside the checkout (so that the wheel, not the source tree, is imported).
On the oldest and newest torch asked for: both ABI flavors (the other
flavor's wheel first, its import/build_info and training-step checks, then
the default flavor's wheel and the whole compat suite), and the OpInfo
conformance files (float32: tests/conformance/test_opinfo.py, bf16:
test_opinfo_bf16.py; a row each in the table, with its counts and its
first failing cases). Prints the table and the first line of each
failure; JSON to --json (default .nox/compat.json). Exit status 1 when a
check failed."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build"))
import flavors as fl  # noqa: E402  build/flavors.py

# The supported range, one torch per minor version: the newest patch the index
# serves (test_compat.py checks these cover _compat.TORCH_RANGE).
TORCHES = {"2.11": "2.11.0", "2.12": "2.12.1", "2.13": "2.13.0", "2.14": "2.14.1", "2.15": "2.15.0"}
DEPS = ["jax>=0.10.2,<0.12", "jaxlib>=0.10.2,<0.12", "numpy>=1.26", "transformers>=5,<6",
        "pytest>=8", "pytest-xdist>=3.5", "expecttest", "hypothesis"]
FLAVOR_CHECKS = "import_and_build_info or traced_training_step"
# The OpInfo conformance files (the suite's, held to their expected-failure
# lists), run where --conformance-on says; one table row each.
CONFORMANCE = {"conformance/test_opinfo.py": "OpInfo float32", "conformance/test_opinfo_bf16.py": "OpInfo bf16"}
PIP_ENV = {"PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off"}


def log(msg: str) -> None:
    print(f"[compat] {msg}", flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("TXC_COMPAT_CACHE", Path.home() / ".cache" / "torch_xla_core-compat"))


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], **kw)


def _pip(py: Path, *args, check=True):
    env = {**os.environ, **PIP_ENV}
    r = _run([py, "-m", "pip", *args], env=env, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"pip {' '.join(map(str, args))} failed:\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return r


def torch_version(py: Path) -> str:
    r = _run([py, "-c", "import importlib.metadata as m; print(m.version('torch'))"], capture_output=True, text=True)
    return r.stdout.strip() or f"(none: {r.stderr.strip().splitlines()[-1:]})"


def ensure_venv(minor: str) -> tuple[Path, float]:
    """The venv of one torch: (its python, seconds spent making it; 0 if reused)."""
    venv = cache_dir() / "venvs" / f"torch-{minor}"
    py = venv / "bin" / "python"
    stamp = venv / "txc-compat-requirements.txt"
    reqs = [f"torch=={TORCHES[minor]}", *DEPS]
    want = f"python {sys.version_info[0]}.{sys.version_info[1]}\n" + "\n".join(reqs) + "\n"
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py, 0.0
    t0 = time.perf_counter()
    log(f"torch {minor}: making {venv} ({' '.join(reqs)})")
    _run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    # --no-compile: no .pyc for the ~8000 modules of torch, transformers, jax, sympy (~25 CPU-seconds a venv
    # on this host); Python writes those the checks import, as they are imported
    _pip(py, "install", "-q", "--no-compile", *reqs)
    stamp.write_text(want)
    dt = time.perf_counter() - t0
    size = _run(["du", "-sh", venv], capture_output=True, text=True).stdout.split()[0]
    log(f"torch {minor}: venv made in {dt:.0f} s ({size})")
    return py, dt


def wheel_of(flavor: fl.Flavor) -> Path:
    whls = sorted(flavor.wheelhouse_dir().glob(f"{fl.DIST}-*.whl"))
    if len(whls) != 1:
        raise SystemExit(f"{flavor.wheelhouse}/ holds {len(whls)} wheels, not one: build it first "
                         f"(python build/wheels.py all --flavor {flavor.name}, or nox -s compat)")
    return whls[0]


def install_wheel(py: Path, whl: Path, with_deps: bool) -> str | None:
    """Installs whl in place of the venv's torch_xla_core; with_deps: as a user
    does (pip install <wheel>), which must keep the venv's torch. Returns
    what went wrong, or None."""
    before = torch_version(py)
    _pip(py, "uninstall", "-y", "-q", fl.DIST, check=False)
    r = _pip(py, "install", "-q", *([] if with_deps else ["--no-deps"]), whl, check=False)
    if r.returncode:
        return f"pip install {whl.name}: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    after = torch_version(py)
    if after != before:
        return f"pip install {whl.name} changed torch {before} -> {after}"
    return None


def run_suite(py: Path, flavor: str, kexpr: str | None, work: Path,
              conformance: bool = False) -> dict[str, tuple[str, str]]:
    """pytest on the copy of the suite in `work` (compat, and the conformance
    files if asked): {check: (outcome, first line)}."""
    xml = work / f"junit-{flavor}.xml"
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", work / "pytest.ini", "--rootdir", work,
           work / "compat", *([work / f for f in CONFORMANCE] if conformance else []), f"--junitxml={xml}",
           "-W", "ignore"]
    if kexpr:
        cmd += ["-k", kexpr]
    if conformance:  # the conformance files are most of the time: spread over the CPUs, as `pytest tests` does
        cmd += ["-n", str(min(len(os.sched_getaffinity(0)), 8)), "--dist", "loadgroup"]
    env = {**os.environ, "TXC_COMPAT": "1", "TXC_COMPAT_FLAVOR": flavor, "TXC_COMPAT_REPO": str(ROOT),
           "PJRT_DEVICE": "CPU"}
    env.pop("PYTHONPATH", None)
    r = _run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if not xml.exists():
        return {"pytest": ("fail", (r.stdout + r.stderr).strip().splitlines()[-1:][0] if (r.stdout + r.stderr).strip()
                           else f"exit {r.returncode}")}
    out, groups = {}, {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name").removeprefix("test_")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            text = (bad.get("message") or bad.text or "").strip()
            res = ("fail", text.splitlines()[0][:200] if text else "?")
        elif case.find("skipped") is not None:
            res = ("skip", (case.find("skipped").get("message") or "").splitlines()[0][:200])
        else:
            res = ("pass", "")
        group = next((g for f, g in CONFORMANCE.items()
                      if case.get("classname") == f.removesuffix(".py").replace("/", ".")), None)
        if group:  # a conformance file: one row, its counts and first failing cases
            groups.setdefault(group, []).append((name, res))
            name = group
        else:
            out[name] = res
        SECONDS[name] = SECONDS.get(name, 0.0) + float(case.get("time") or 0)
    for group, cases in groups.items():
        n = {o: sum(1 for _, (x, _) in cases if x == o) for o in ("pass", "fail", "skip")}
        fails = [c for c, (x, _) in cases if x == "fail"]
        line = f"{n['pass']} pass, {n['fail']} fail, {n['skip']} skip" + (
            ": " + ", ".join(fails[:6]) + (", ..." if len(fails) > 6 else "") if fails else "")
        out[group] = ("fail" if fails else "pass", line)
    return out


SECONDS: dict[str, float] = {}  # check -> seconds, this torch (run_suite adds to it)


def copy_suite(work: Path) -> None:
    for d in ("compat", "conformance"):
        shutil.copytree(ROOT / "tests" / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "run.py"))
    shutil.copy(ROOT / "tests" / "conftest.py", work / "conftest.py")  # the suite's setup, for the conformance files
    (work / "pytest.ini").write_text("[pytest]\n")


def table(results: dict[str, dict[str, tuple[str, str]]], versions: list[str]) -> str:
    checks = []
    for v in versions:
        for c in results.get(v, {}):
            if c not in checks:
                checks.append(c)
    w = max([len(c) for c in checks] + [5])
    lines = [f"{'check':<{w}}  " + "  ".join(f"{'torch ' + v:>10}" for v in versions)]
    lines.append("-" * len(lines[0]))
    for c in checks:
        cells = [results.get(v, {}).get(c, ("-", ""))[0] for v in versions]
        lines.append(f"{c:<{w}}  " + "  ".join(f"{x.upper() if x == 'fail' else x:>10}" for x in cells))
    fails = [(v, c, m) for v in versions for c, (o, m) in results.get(v, {}).items() if o == "fail"]
    if fails:
        lines += ["", "failures (torch, check: first line of the error):"]
        lines += [f"  {v}  {c}: {m}" for v, c, m in fails]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", nargs="+", default=list(TORCHES), choices=list(TORCHES))
    ap.add_argument("--flavors-on", nargs="*", default=None,
                    help="torch versions that also check the non-default ABI flavor (default: the oldest and "
                         "the newest asked for)")
    ap.add_argument("--conformance-on", nargs="*", default=None,
                    help="torch versions that also run the OpInfo conformance files (default: the oldest and the "
                         "newest asked for)")
    ap.add_argument("-k", default=None, help="pytest -k for the default flavor's run")
    ap.add_argument("--json", default=str(ROOT / ".nox" / "compat.json"))
    args = ap.parse_args(argv)
    matrix = fl.load()
    default = next(f for f in matrix if f.name == matrix.default)
    others = [f for f in matrix if f.name != matrix.default]
    wheels = {f.name: wheel_of(f) for f in matrix}
    versions = sorted(args.torch, key=lambda v: tuple(map(int, v.split("."))))
    ends = {versions[0], versions[-1]}
    flavors_on = set(args.flavors_on if args.flavors_on is not None else ends)
    conformance_on = set(args.conformance_on if args.conformance_on is not None else ends)
    results, timings = {}, {}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="txc-compat-") as tmp:
        work = Path(tmp)
        copy_suite(work)
        for v in versions:
            t0 = time.perf_counter()
            py, made = ensure_venv(v)
            res = results[v] = {}
            SECONDS.clear()
            if v in flavors_on:
                for f in others:
                    why = install_wheel(py, wheels[f.name], with_deps=False)
                    if why:
                        res[f"{f.name}: install"] = ("fail", why)
                        continue
                    for c, r in run_suite(py, f.name, FLAVOR_CHECKS, work).items():
                        res[f"{f.name}: {c}"] = r
            why = install_wheel(py, wheels[default.name], with_deps=True)
            res["pip install keeps torch"] = ("fail", why) if why else ("pass", "")
            if not why:
                res.update(run_suite(py, default.name, args.k, work, conformance=v in conformance_on))
            slow = sorted(SECONDS.items(), key=lambda kv: -kv[1])
            timings[v] = {"venv_s": round(made, 1), "total_s": round(time.perf_counter() - t0, 1),
                          "torch": torch_version(py), "tests_s": round(sum(SECONDS.values()), 1),
                          "slowest": [[c, round(t, 1)] for c, t in slow[:8]]}
            n = {o: sum(1 for x, _ in res.values() if x == o) for o in ("pass", "fail", "skip")}
            log(f"torch {v} ({timings[v]['torch']}): {n['pass']} pass, {n['fail']} fail, {n['skip']} skip "
                f"in {timings[v]['total_s']:.0f} s (venv {made:.0f} s, tests {timings[v]['tests_s']:.0f} s; slowest: "
                + ", ".join(f"{c} {t:.0f} s" for c, t in slow[:4]) + ")")
    print(table(results, versions), flush=True)
    log(f"{len(versions)} torch versions in {time.perf_counter() - t_all:.0f} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"results": {v: {c: list(r) for c, r in res.items()}
                                                        for v, res in results.items()},
                                           "timings": timings,
                                           "wheels": {k: w.name for k, w in wheels.items()}}, indent=1))
    return 1 if any(o == "fail" for res in results.values() for o, _ in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

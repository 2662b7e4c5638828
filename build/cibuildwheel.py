#!/usr/bin/env python3
"""Build every ABI flavor with cibuildwheel, in containers.

    python build/cibuildwheel.py [--flavor F ...] [--engine auto|docker|podman-local]

Owns picking the container route and running cibuildwheel once per flavor
(TXC_ABI=<flavor>, passed into the container by [tool.cibuildwheel]
environment-pass) into wheelhouse/cibuildwheel/<flavor>/, then the same
per-wheel checks as build/wheels.py. Routes, first that works:

  docker        a Docker daemon answers and the official manylinux_2_28
                image is present or can be pulled: the real release route,
                every Python of build/flavors.toml [python] (CIBW_BUILD);
  podman-local  podman with build/builder/containers.conf and the local
                manylinux-like image from build/builder/make-image.sh (made
                on demand): a local check, glibc 2.36, and only the Pythons
                that image holds (Debian's 3.11).

It says which route and image it used. cibuildwheel runs on a clean copy of
the tree (git's tracked and untracked-not-ignored files): it tars its
working directory into the container, and .nox/.skbuild must not go along.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import flavors as fl  # noqa: E402
import release  # noqa: E402
import wheels  # noqa: E402
from engine import BUILDER, builder_env, command_ok, docker_answers, no_docker_reason  # noqa: E402

ROOT = fl.ROOT
MATRIX = fl.load()
OUT = ROOT / "wheelhouse" / "cibuildwheel"
REAL_IMAGE = "quay.io/pypa/manylinux_2_28_x86_64"
LOCAL_IMAGE = "localhost/txc-manylinux-local:bookworm"


def log(msg: str) -> None:
    print(f"[cibuildwheel] {msg}", flush=True)


# The Pythons the local builder image has (build/builder/Containerfile).
LOCAL_IMAGE_PYTHONS = ("3.11",)


def pick_route(engine: str) -> tuple[str, dict[str, str], str]:
    """(route, extra env for cibuildwheel, why)."""
    if engine not in ("auto", "docker"):
        why = "docker not asked for"
    elif docker_answers():
        if command_ok(["docker", "image", "inspect", REAL_IMAGE], timeout=20) or \
                command_ok(["docker", "pull", REAL_IMAGE], timeout=300):
            return "docker", {"CIBW_CONTAINER_ENGINE": "docker", "CIBW_BUILD": MATRIX.cibw_build()}, \
                f"docker daemon answers; official image {REAL_IMAGE}, Pythons {MATRIX.cibw_build()}"
        why = f"docker answers but {REAL_IMAGE} cannot be pulled"
    else:
        why = no_docker_reason()
    if engine == "docker":
        raise SystemExit(f"[cibuildwheel] docker route not available: {why}")
    env = builder_env()
    # generous timeout: podman waits on the storage lock while another
    # buildah/podman job (an image build, a CI dry run) holds it
    if not command_ok(["podman", "image", "exists", LOCAL_IMAGE], env=env, timeout=600):
        log(f"{why}; making the local builder image {LOCAL_IMAGE} (build/builder/make-image.sh)")
        subprocess.run(["bash", str(BUILDER / "make-image.sh")], check=True,
                       env={**env, "IMAGE": LOCAL_IMAGE})
    local = [v for v in MATRIX.pythons if v in LOCAL_IMAGE_PYTHONS]
    env.update({"CIBW_CONTAINER_ENGINE": "podman",
                "CIBW_MANYLINUX_X86_64_IMAGE": LOCAL_IMAGE,
                "CIBW_BUILD": " ".join(f"{fl.cp_tag(v)}-manylinux_x86_64" for v in local)})
    skipped = [v for v in MATRIX.pythons if v not in local]
    return "podman-local", env, (f"{why}; podman with the local manylinux-like image "
                                 f"{LOCAL_IMAGE} (glibc 2.36, Python {', '.join(local)} only; "
                                 f"{', '.join(skipped)} need the real manylinux image: a local "
                                 "check, not a release build)")


def image_id(route: str, env: dict[str, str]) -> str:
    """The id of the image the route runs, for the report ('' if unknown)."""
    cmd = (["docker", "image", "inspect", "--format", "{{.Id}}", REAL_IMAGE]
           if route == "docker" else
           ["podman", "image", "inspect", "--format", "{{.Id}}", LOCAL_IMAGE])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _version_of(whl: Path) -> str:
    """cp312 -> "3.12"."""
    tag = wheels.parse_wheel_name(whl)["py"]
    return f"{tag[2]}.{tag[3:]}"


def export_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", action="append", choices=MATRIX.names())
    p.add_argument("--engine", choices=["auto", "docker", "podman-local"], default="auto")
    a = p.parse_args(argv)
    t_all = time.monotonic()
    route, env, why = pick_route(a.engine)
    image = REAL_IMAGE if route == "docker" else LOCAL_IMAGE
    iid = image_id(route, env)
    log(f"route: {route} -- {why}")
    log(f"image: {image} (id {iid[:12] or '?'})")
    env["SOURCE_DATE_EPOCH"] = wheels.source_date_epoch()
    env.setdefault("MAX_JOBS", "2")
    report = {"route": route, "why": why, "image": image, "image_id": iid, "flavors": {}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="txc-cibw-") as t:
        src = Path(t) / "src"
        export_tree(src)
        for name in a.flavor or MATRIX.names():
            f = MATRIX[name]
            out = OUT / name
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "cibuildwheel", "--platform", "linux",
                   "--output-dir", str(out), "."]
            log(f"{name}: {MATRIX.env_var}={name} cibuildwheel --output-dir {out.relative_to(ROOT)}")
            t0 = time.monotonic()
            rc = subprocess.run(cmd, cwd=src, env={**env, MATRIX.env_var: name}).returncode
            secs = time.monotonic() - t0
            entry = {"seconds": round(secs, 1), "rc": rc}
            if rc == 0:
                try:
                    whls = wheels.wheels_in(out)
                    if not whls:
                        raise wheels.CheckError(f"no wheel in {out}")
                    for whl in whls:  # one per Python; build_info with that Python if here
                        py = release.find_python(_version_of(whl))[0]
                        wheels.check_wheel(whl, f, python=str(py) if py else None)
                        log(f"{name}: OK {whl.name} (checked: label, tags, nm -D"
                            + (f", build_info with {py})" if py else ")"))
                    entry.update(wheel=" ".join(w.name for w in whls),
                                 bytes=sum(w.stat().st_size for w in whls), check="ok")
                    log(f"{name}: {len(whls)} wheel(s) in {secs:.0f} s")
                except wheels.CheckError as e:
                    entry["check"] = str(e)
                    failed = True
                    log(f"{name}: CHECK FAILED {e}")
            else:
                failed = True
                log(f"{name}: cibuildwheel failed (rc={rc}) after {secs:.0f} s")
            report["flavors"][name] = entry
    report["total_seconds"] = round(time.monotonic() - t_all, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, e in report["flavors"].items():
        log(f"  {name:9s} {'ok' if e.get('check') == 'ok' else 'FAILED':6s} {e['seconds']:6.0f} s  "
            f"{e.get('wheel', '-')}")
    log(f"route used: {route}, image {image}; total {report['total_seconds']:.0f} s; "
        f"report: {(OUT / 'report.json').relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

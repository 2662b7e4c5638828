#!/usr/bin/env python3
"""Build, tag, push and round-trip the container images of every C++-ABI flavor.

Owns the image side of a release and its CLI: the tag scheme, staging the
build context for docker/Dockerfile, building and pushing, and the
push/pull/run round trip through a local registry. The container engine is
build/engine.py, the base image build/base_image.py, the size table
build/image_sizes.py. The flavor matrix is
build/flavors.toml; the wheels come from build/wheels.py (wheelhouse/<flavor>/).

    python build/images.py build     [--flavor F ...] [--base IMG] [--push REGISTRY]
    python build/images.py push      REGISTRY [--flavor F ...]
    python build/images.py roundtrip [--flavor F ...]   # local registry, pull, smoke test
    python build/images.py base                         # only the local base image
    python build/images.py tags                         # print the tag scheme

Engine: docker when a daemon answers, else buildah (`bud --isolation chroot
--storage-driver vfs`, with build/builder/containers.conf + storage.conf).
Base: the public python:3.11-slim-bookworm when it is present or can be
pulled; otherwise a local stand-in, localhost/txc-python:3.11-slim-bookworm,
made here from a debootstrap'd Debian bookworm. It says which base it used.
Wheels: reused from wheelhouse/<flavor>/ when there is one of the current
version, else built with build/wheels.py. Dependencies (torch CPU, jax,
jaxlib, ...) are downloaded once with this machine's pip configuration into
docker/stage/deps-<platform>/ with a requirements.txt pinning them, so the
image build itself needs no index (torch's CPU wheel is not on PyPI).
A summary goes to docker/stage/report.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import flavors as fl  # noqa: E402  build/flavors.py, loaded by path
from base_image import PUBLIC_BASE, make_local_base, resolve_base  # noqa: E402
from engine import Engine, ImageError, log, pick_engine, run_cmd  # noqa: E402
from image_sizes import summary  # noqa: E402

ROOT = fl.ROOT
MATRIX = fl.load()
STAGE = ROOT / "docker" / "stage"       # git-ignored (docker/.gitignore)
REPORT = STAGE / "report.json"
REPO = "torch-xla-core"                  # image repository name
LOCAL = f"localhost/{REPO}"
# The image's Python: the matrix's default (build/flavors.toml [python]);
# the only one with a base image here (python:3.11-slim-bookworm or its
# local stand-in) and a torch CPU wheel. Tags name any Python of the list.
PYTHON = MATRIX.default_python
# Platforms an image is made for. `cpu` is built here; `tpu` adds the tpu
# extra (libtpu) to the same runtime stage, a tag of its own
# (r<v>_<py>_tpu_<flavor>); it needs a TPU VM to be smoke-tested, so it is
# only built when asked for (--platform tpu).
PLATFORMS = {"cpu": {"extras": [], "default": True},
             "tpu": {"extras": ["tpu"], "default": False}}
TORCH_PIN = f"torch=={MATRIX.default_torch}"  # build/flavors.toml [torch]: the default torch


# ------------------------------------------------------------------ tags
def tag(version: str, flavor: fl.Flavor, platform: str = "cpu", python: str = PYTHON) -> str:
    """`r<version>_<python>_<platform>_<flavor suffix>`, e.g. r0.1.0_3.11_cpu_cxx11.
    The flavor is always named, the default one included."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; known: {sorted(PLATFORMS)}")
    if python not in MATRIX.pythons:
        raise ValueError(f"Python {python!r} is not in build/flavors.toml [python] "
                         f"{list(MATRIX.pythons)}")
    return f"r{version}_{python}_{platform}_{flavor.image_suffix}"


def tags_for(version: str, flavor: fl.Flavor, platform: str = "cpu") -> list[str]:
    """Every tag an image carries: its own, plus `latest` for the default
    flavor on the default platform."""
    out = [tag(version, flavor, platform)]
    if flavor.is_default and PLATFORMS[platform]["default"]:
        out.append("latest")
    return out


def label_version(version: str, flavor: fl.Flavor) -> str:
    """org.opencontainers.image.version: the version with the flavor always
    spelled out (the default flavor's wheel carries none)."""
    return f"{version}+{flavor.name}"


def flavor_wheel(flavor: fl.Flavor, *, build_missing: bool = True) -> Path:
    """The flavor's wheel in wheelhouse/<flavor>/ of the current version;
    built with build/wheels.py only when it is missing or stale."""
    want = flavor.version(fl.base_version())
    d = flavor.wheelhouse_dir()
    ws = sorted(d.glob(f"{fl.DIST}-*.whl")) if d.is_dir() else []
    ok = [w for w in ws if w.name.split("-")[1] == want]
    if len(ws) == 1 and ok:
        log(f"{flavor.name}: reusing {d.relative_to(ROOT)}/{ok[0].name}")
        return ok[0]
    why = "no wheel" if not ws else f"{[w.name for w in ws]} is not exactly one {want} wheel"
    if not build_missing:
        raise ImageError(f"{d}: {why}; run `nox -s wheels`")
    log(f"{flavor.name}: {why}: building it (build/wheels.py all --flavor {flavor.name})")
    run_cmd([sys.executable, str(HERE / "wheels.py"), "all", "--flavor", flavor.name],
         env={**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")})
    return flavor_wheel(flavor, build_missing=False)


def wheel_requires(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    return re.findall(r"(?m)^Requires-Dist: (.+)$", text)


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def stage_deps(whl: Path, platform: str, *, refresh: bool = False) -> Path:
    """docker/stage/deps-<platform>/: wheels of every runtime dependency of
    the package (with the platform's extras) and requirements.txt pinning
    them, downloaded with this machine's pip configuration. Reused while
    the package's requirements are unchanged."""
    out = STAGE / f"deps-{platform}"
    extras = PLATFORMS[platform]["extras"]
    key = hashlib.sha256(json.dumps([wheel_requires(whl), extras]).encode()).hexdigest()
    stamp = out / ".requires.sha256"
    if not refresh and stamp.exists() and stamp.read_text().strip() == key \
            and (out / "requirements.txt").exists():
        log(f"deps: reusing {out.relative_to(ROOT)}/ (requirements unchanged)")
        return out
    out.mkdir(parents=True, exist_ok=True)
    req = f"{fl.DIST}{'[' + ','.join(extras) + ']' if extras else ''} @ {whl.resolve().as_uri()}"
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-d", str(out),
           req, TORCH_PIN]
    if Path("/opt/wheels").is_dir():   # this machine's torch CPU wheel
        cmd += ["--find-links", "/opt/wheels"]
    t0 = time.monotonic()
    run_cmd(cmd, capture_output=True)
    pins, seen = [], set()
    for w in sorted(out.glob("*.whl")):
        m = _WHEEL_NAME.match(w.name)
        name = m["name"].lower().replace("_", "-")
        if name == fl.DIST.replace("_", "-"):
            w.unlink()             # the package itself comes from wheelhouse/<flavor>/
            continue
        if name in seen:
            raise ImageError(f"{out}: two wheels of {name}; delete the folder and retry")
        seen.add(name)
        pins.append(f"{name}=={m['version']}")
    torch = [p for p in pins if p.startswith("torch==")]
    if not torch or "+cpu" not in torch[0]:
        raise ImageError(f"deps: torch is {torch}, not the CPU build; put torch's CPU wheel "
                         "in a find-links folder or add --extra-index-url "
                         "https://download.pytorch.org/whl/cpu to pip's configuration")
    (out / "requirements.txt").write_text(
        "# Written by build/images.py: the runtime dependencies of torch_xla_core\n"
        "# for the image, pinned to the wheels in this folder.\n" + "\n".join(pins) + "\n")
    stamp.write_text(key + "\n")
    log(f"deps: {len(pins)} wheels ({sum(w.stat().st_size for w in out.glob('*.whl')) / 2**20:.0f} MiB)"
        f" in {out.relative_to(ROOT)}/ in {time.monotonic() - t0:.0f} s")
    return out


# ------------------------------------------------------------------ build
def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def build_args(flavor: fl.Flavor, base_image: str, platform: str, deps: Path,
               wheelhouse: str = "wheelhouse", wheel_from: str = "wheelhouse") -> dict[str, str]:
    v = fl.base_version()
    return {
        "BASE_IMAGE": base_image,
        "ABI": flavor.name,
        "CXX11_ABI": "1" if flavor.cxx11_abi else "0",
        "VERSION": label_version(v, flavor),
        "WHEEL_VERSION": flavor.version(v),
        "PYTHON": PYTHON,
        "PLATFORM": platform,
        "DEPS": str(deps.relative_to(ROOT)),
        "WHEELHOUSE": wheelhouse,
        # Passed even at its default: buildah 1.28 resolves `FROM
        # wheel-${WHEEL_FROM}` only with build args from the command line.
        "WHEEL_FROM": wheel_from,
    }


def commit_labels() -> dict[str, str]:
    """The source revision and its time, set with --label at the image's
    commit rather than as the Dockerfile's REVISION/CREATED build args:
    the Dockerfile's LABEL step sits before the big layers, and a build arg
    that changes with every commit would make them miss the cache."""
    ct = git("log", "-1", "--format=%ct")
    created = (dt.datetime.fromtimestamp(int(ct), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
               if ct else "unknown")
    return {"org.opencontainers.image.revision": git("rev-parse", "HEAD") or "unknown",
            "org.opencontainers.image.created": created}


def build(engine: Engine, flavors: list[fl.Flavor], platform: str, base: str,
          report: dict, wheel_from: str = "wheelhouse") -> list[str]:
    """Builds each flavor's image; returns the local names it tagged."""
    base_image, why = resolve_base(engine, base)
    log(f"base: {why}")
    report.update(engine=engine.name, base=base_image, base_why=why,
                  base_bytes=engine.size(base_image))
    if wheel_from == "wheelhouse":
        wheels = {f.name: flavor_wheel(f) for f in flavors}
        deps = stage_deps(wheels[flavors[0].name], platform)
    else:   # compiled in the image; the deps still come from a wheel's metadata
        wheels = {f.name: Path("(built in the image)") for f in flavors}
        deps = stage_deps(flavor_wheel(MATRIX[MATRIX.default]), platform)
    version = fl.base_version()
    names = []
    for f in flavors:
        ts = [f"{LOCAL}:{t}" for t in tags_for(version, f, platform)]
        t0 = time.monotonic()
        res = engine.build(ts, build_args(f, base_image, platform, deps, wheel_from=wheel_from),
                           labels=commit_labels())
        secs = time.monotonic() - t0
        if res.returncode:
            raise ImageError(f"image build of flavor {f.name} failed (rc={res.returncode})")
        size = engine.size(ts[0])
        log(f"{f.name}: built {', '.join(ts)} in {secs:.0f} s, {size / 2**20:.0f} MiB")
        report.setdefault("images", {})[f.name] = {
            "tags": ts, "seconds": round(secs, 1), "bytes": size,
            "wheel": wheels[f.name].name, "labels": engine.labels(ts[0])}
        names += ts
    return names


def push(engine: Engine, registry: str, flavors: list[fl.Flavor], platform: str,
         report: dict, *, tls_verify: bool | None = None) -> list[str]:
    """Pushes each flavor's local tags to REGISTRY/torch-xla-core:<tag>."""
    registry = registry.rstrip("/")
    if tls_verify is None:   # plain http only for a registry on this machine
        tls_verify = not re.match(r"^(127\.0\.0\.1|localhost)(:\d+)?$", registry)
    version = fl.base_version()
    pushed = []
    t0 = time.monotonic()
    for f in flavors:
        for t in tags_for(version, f, platform):
            src, dest = f"{LOCAL}:{t}", f"{registry}/{REPO}:{t}"
            if not engine.exists(src):
                raise ImageError(f"{src} is not built; run `nox -s images` first")
            engine.push(src, dest, tls_verify=tls_verify)
            pushed.append(dest)
    log(f"pushed {len(pushed)} tags to {registry} in {time.monotonic() - t0:.0f} s")
    report["push"] = {"registry": registry, "tags": pushed,
                      "seconds": round(time.monotonic() - t0, 1)}
    return pushed


# ---------------------------------------------------------------- report
def write_report(report: dict) -> None:
    STAGE.mkdir(parents=True, exist_ok=True)
    old = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    old.update(report)
    REPORT.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


# -------------------------------------------------------------- roundtrip
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRegistry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1, storage in a temp dir."""

    def __init__(self):
        if not shutil.which("docker-registry"):
            raise ImageError("the round trip needs Debian's docker-registry "
                             "(apt-get install docker-registry)")
        self.tmp = tempfile.TemporaryDirectory(prefix="txc-registry-", dir="/var/tmp")
        self.port = _free_port()
        self.addr = f"127.0.0.1:{self.port}"
        cfg = Path(self.tmp.name) / "config.yml"
        cfg.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {self.tmp.name}/data
  delete:
    enabled: true
http:
  addr: {self.addr}
""")
        self.logf = open(Path(self.tmp.name) / "registry.log", "w")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(cfg)],
                                     stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.addr}/v2/", timeout=2) as r:
                    if r.status == 200:
                        log(f"local registry (docker-registry, pid {self.proc.pid}) on {self.addr}")
                        return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise ImageError("docker-registry did not answer on " + self.addr)

    def catalog(self) -> dict:
        with urllib.request.urlopen(f"http://{self.addr}/v2/_catalog", timeout=5) as r:
            repos = json.load(r)["repositories"]
        out = {}
        for repo in repos:
            with urllib.request.urlopen(f"http://{self.addr}/v2/{repo}/tags/list", timeout=5) as r:
                out[repo] = sorted(json.load(r)["tags"] or [])
        return out

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.logf.close()
        self.tmp.cleanup()


def wrong_flavor_check(engine: Engine, base_image: str, deps: Path, report: dict) -> None:
    """Builds the default flavor's image with the other flavor's wheel in
    its place: the build must fail at the import check."""
    right = MATRIX[MATRIX.default]
    other = next(f for f in MATRIX if f.name != right.name)
    wrong = STAGE / "wrong-flavor" / right.name
    shutil.rmtree(wrong.parent, ignore_errors=True)
    wrong.mkdir(parents=True)
    shutil.copy2(flavor_wheel(other, build_missing=False), wrong)
    t0 = time.monotonic()
    try:
        res = engine.build([f"{LOCAL}:wrong-flavor-check"],
                           build_args(right, base_image, "cpu", deps,
                                      wheelhouse=str(wrong.parent.relative_to(ROOT))),
                           quiet=True)
    finally:
        shutil.rmtree(wrong.parent, ignore_errors=True)
    out = (res.stdout or "") + (res.stderr or "")
    msg = next((ln for ln in out.splitlines() if "smoke: FAILED" in ln), "")
    if res.returncode == 0 or "installed core is 'precxx11'" not in msg \
            and "installed core is 'cxx11'" not in msg:
        engine.rmi(f"{LOCAL}:wrong-flavor-check")
        raise ImageError("an image build with the wrong flavor's wheel did not fail "
                         f"at the flavor check:\n{out[-3000:]}")
    log(f"wrong flavor rejected in {time.monotonic() - t0:.0f} s: {msg.strip()}")
    report["wrong_flavor_check"] = {"rejected": True, "message": msg.strip(),
                                    "seconds": round(time.monotonic() - t0, 1)}


def roundtrip(engine: Engine, flavors: list[fl.Flavor], report: dict, *,
              wrong_flavor: bool = True) -> None:
    """Local registry; push every tag; delete the local copies; pull them
    back by tag; run the smoke test (import, flavor, traced training steps)
    in each pulled image."""
    version = fl.base_version()
    t_all = time.monotonic()
    reg = LocalRegistry()
    try:
        pushed = push(engine, reg.addr, flavors, "cpu", report)
        cat = reg.catalog()
        log(f"registry catalog: {cat}")
        want = sorted(t.rsplit(":", 1)[1] for t in pushed)
        if sorted(cat.get(REPO, [])) != want:
            raise ImageError(f"registry holds {cat}, expected {REPO}: {want}")
        local_ids = {}
        for f in flavors:
            for t in tags_for(version, f, "cpu"):
                local_ids[t] = engine.q("inspect", "--type", "image", "--format",
                                        "{{.FromImageID}}", f"{LOCAL}:{t}").stdout.strip() \
                    if engine.name == "buildah" else ""
                engine.rmi(f"{LOCAL}:{t}", f"{reg.addr}/{REPO}:{t}")
                if engine.exists(f"{LOCAL}:{t}"):
                    raise ImageError(f"{LOCAL}:{t} still present after rmi")
        log(f"deleted the local copies of {len(local_ids)} tags")
        t0 = time.monotonic()
        for t in local_ids:
            ref = f"{reg.addr}/{REPO}:{t}"
            if not engine.pull(ref, tls_verify=False, timeout=600):
                raise ImageError(f"pulling {ref} failed")
        report["pull"] = {"seconds": round(time.monotonic() - t0, 1), "tags": list(local_ids)}
        log(f"pulled {len(local_ids)} tags back in {time.monotonic() - t0:.0f} s")
        report["smoke"] = {}
        for f in flavors:
            t = tag(version, f)
            ref = f"{reg.addr}/{REPO}:{t}"
            labels = engine.labels(ref)
            if labels.get("io.torch-xla-core.flavor") != f.name or \
                    labels.get("io.torch-xla-core.cxx11-abi") != ("1" if f.cxx11_abi else "0"):
                raise ImageError(f"{ref}: labels {labels} do not name flavor {f.name}")
            t0 = time.monotonic()
            res = engine.run(ref, ["python", "/opt/torch-xla-core/smoke.py", "--flavor", f.name])
            secs = time.monotonic() - t0
            sys.stdout.write(res.stdout)
            if res.returncode:
                raise ImageError(f"smoke test in {ref} failed:\n{res.stderr[-4000:]}")
            out = json.loads(res.stdout.strip().splitlines()[-1].split("smoke: OK ", 1)[1])
            if out["uid"] == 0:
                raise ImageError(f"{ref}: the smoke test ran as root; the image must set a user")
            log(f"{f.name}: smoke test OK in {secs:.0f} s in the pulled image "
                f"(uid {out['uid']}, losses {out['train']['losses']})")
            report["smoke"][f.name] = {"image": ref, "seconds": round(secs, 1), **out}
        # The pulled images become the local ones again.
        for t in local_ids:
            engine.tag(f"{reg.addr}/{REPO}:{t}", f"{LOCAL}:{t}")
            engine.rmi(f"{reg.addr}/{REPO}:{t}")
    finally:
        reg.close()
    if wrong_flavor:
        base_image = report.get("base") or resolve_base(engine, PUBLIC_BASE)[0]
        deps = stage_deps(flavor_wheel(MATRIX[MATRIX.default], build_missing=False), "cpu")
        wrong_flavor_check(engine, base_image, deps, report)
    report["roundtrip_seconds"] = round(time.monotonic() - t_all, 1)
    log(f"round trip OK in {time.monotonic() - t_all:.0f} s")


# ------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["build", "push", "roundtrip", "base", "tags"])
    p.add_argument("registry", nargs="?", help="push: REGISTRY (host[:port][/path])")
    p.add_argument("--flavor", action="append", choices=MATRIX.names())
    p.add_argument("--platform", default="cpu", choices=sorted(PLATFORMS))
    p.add_argument("--base", default=PUBLIC_BASE, help=f"base image (default {PUBLIC_BASE})")
    p.add_argument("--engine", default="auto", choices=["auto", "docker", "buildah"])
    p.add_argument("--push", metavar="REGISTRY", help="build: push afterwards")
    p.add_argument("--wheel-from", default="wheelhouse", choices=["wheelhouse", "source"],
                   help="build: take wheelhouse/<flavor>/ (default) or compile in the image")
    p.add_argument("--no-wrong-flavor-check", action="store_true")
    a = p.parse_args(argv)
    fls = [MATRIX[n] for n in (a.flavor or MATRIX.names())]
    if a.command == "tags":
        for f in fls:
            print(f.name, " ".join(tags_for(fl.base_version(), f, a.platform)))
        return 0
    report: dict = {}
    try:
        engine, why = pick_engine(a.engine)
        log(f"engine: {engine} ({why})")
        if a.command == "base":
            make_local_base(engine)
        elif a.command == "build":
            t0 = time.monotonic()
            build(engine, fls, a.platform, a.base, report, wheel_from=a.wheel_from)
            report["build_seconds"] = round(time.monotonic() - t0, 1)
            if a.push:
                push(engine, a.push, fls, a.platform, report)
            summary(engine, report)
        elif a.command == "push":
            if not a.registry:
                p.error("push needs REGISTRY")
            push(engine, a.registry, fls, a.platform, report)
        elif a.command == "roundtrip":
            report["base"] = resolve_base(engine, a.base)[0]
            roundtrip(engine, fls, report, wrong_flavor=not a.no_wrong_flavor_check)
    except ImageError as e:
        print(f"[images] FAILED: {e}", file=sys.stderr)
        write_report(report)
        return 1
    write_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

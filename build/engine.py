"""Container engines for build/: which one runs here, and the few operations
the image and wheel scripts need, for docker or buildah.

Owns the engine detection that build/images.py (images) and
build/cibuildwheel.py (cibuildwheel's container route) share: whether a
Docker daemon answers, and the environment that makes buildah and podman
work on this machine (build/builder/containers.conf + storage.conf: runc,
cgroupfs, vfs storage).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"
BUILDER = HERE / "builder"              # containers.conf / storage.conf for this machine


def log(msg: str) -> None:
    print(f"[images] {msg}", flush=True)


class ImageError(Exception):
    """A container or image step failed; the message says which and why."""


def command_ok(cmd, env=None, timeout=60) -> bool:
    """Whether cmd runs and exits 0 within timeout (False when it is missing)."""
    try:
        return subprocess.run(cmd, capture_output=True, env=env, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def docker_answers(timeout=20) -> bool:
    """A docker CLI is installed and its daemon answers."""
    return bool(shutil.which("docker")) and command_ok(["docker", "info"], timeout=timeout)


def no_docker_reason() -> str:
    return "no Docker daemon answers" if shutil.which("docker") else "no docker CLI"


def builder_env() -> dict[str, str]:
    """os.environ plus this machine's buildah/podman configuration."""
    return {**os.environ, "CONTAINERS_CONF": str(BUILDER / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(BUILDER / "storage.conf")}


def run_cmd(cmd, *, check=True, env=None, timeout=None, quiet=False, **kw):
    if not quiet:
        log("$ " + " ".join(str(c) for c in cmd))
    res = subprocess.run([str(c) for c in cmd], env=env, timeout=timeout,
                         text=True, **kw)
    if check and res.returncode:
        raise ImageError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed (rc={res.returncode})"
                         + (f":\n{(res.stdout or '')[-3000:]}{(res.stderr or '')[-3000:]}"
                            if kw.get("capture_output") else ""))
    return res


class Engine:
    """The few container operations this script needs, for docker or buildah."""

    def __init__(self, name: str):
        self.name = name
        self.env = builder_env() if name == "buildah" else dict(os.environ)
        self.cli = ["docker"] if name == "docker" else ["buildah", "--storage-driver", "vfs"]

    def __str__(self):
        return self.name

    def q(self, *args, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([*self.cli, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    def exists(self, image: str) -> bool:
        args = ["image", "inspect", image] if self.name == "docker" else \
            ["inspect", "--type", "image", image]
        return self.q(*args).returncode == 0

    def pull(self, image: str, *, tls_verify: bool = True, timeout=300) -> bool:
        if self.name == "docker":
            return self.q("pull", image, timeout=timeout).returncode == 0
        ref = image if "://" in image else f"docker://{image}"
        return self.q("pull", f"--tls-verify={str(tls_verify).lower()}", ref,
                      timeout=timeout).returncode == 0

    def build(self, tags: list[str], build_args: dict[str, str], *,
              labels: dict[str, str] | None = None, context: Path = ROOT,
              quiet=False) -> subprocess.CompletedProcess:
        # No --target: runtime is the last stage, and buildah 1.28 with
        # --target prunes the stage that `FROM wheel-${WHEEL_FROM}` names.
        cmd = [*self.cli, "build" if self.name == "docker" else "bud"]
        if self.name == "buildah":
            cmd += ["--isolation", "chroot", "--layers", "--force-rm"]
        cmd += ["-f", str(DOCKERFILE)]
        for k, v in build_args.items():
            cmd += ["--build-arg", f"{k}={v}"]
        for k, v in (labels or {}).items():
            cmd += ["--label", f"{k}={v}"]
        for t in tags:
            cmd += ["-t", t]
        cmd.append(str(context))
        log("$ " + " ".join(cmd))
        return subprocess.run(cmd, env=self.env, text=True,
                              capture_output=quiet, cwd=ROOT)

    def tag(self, src: str, dst: str) -> None:
        run_cmd([*self.cli, "tag", src, dst], env=self.env, quiet=True)

    def rmi(self, *images: str) -> None:
        for image in images:
            if self.exists(image):
                run_cmd([*self.cli, "rmi", image], env=self.env, quiet=True,
                     capture_output=True)

    def push(self, image: str, dest: str, *, tls_verify: bool = True) -> None:
        if self.name == "docker":
            self.tag(image, dest)
            run_cmd(["docker", "push", dest], env=self.env)
        else:
            run_cmd([*self.cli, "push", f"--tls-verify={str(tls_verify).lower()}", image,
                  f"docker://{dest}"], env=self.env)

    def size(self, image: str) -> int:
        """Bytes of the image's layers, uncompressed (what `images` shows)."""
        if self.name == "docker":
            out = self.q("image", "inspect", "--format", "{{.Size}}", image).stdout
        else:
            out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image],
                                 capture_output=True, text=True, env=self.env).stdout
        return int(out.strip() or 0)

    def labels(self, image: str) -> dict:
        if self.name == "docker":
            out = self.q("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout
            return json.loads(out or "{}") or {}
        # buildah's templates have no json function: read the whole record.
        # It pushes OCI manifests, so a pulled image's labels are in the OCI config.
        res = self.q("inspect", "--type", "image", image)
        if res.returncode:
            return {}
        data = json.loads(res.stdout)
        return ((data.get("OCIv1") or {}).get("config") or {}).get("Labels") \
            or ((data.get("Docker") or {}).get("config") or {}).get("Labels") or {}

    def run(self, image: str, cmd: list[str], timeout=600) -> subprocess.CompletedProcess:
        """Runs cmd in a fresh container of image, as the image's user."""
        if self.name == "docker":
            return subprocess.run(["docker", "run", "--rm", image, *cmd], capture_output=True,
                                  text=True, env=self.env, timeout=timeout)
        ctr = self.q("from", "--pull-never", image).stdout.strip()
        if not ctr:
            raise ImageError(f"buildah from {image} failed")
        try:
            return subprocess.run([*self.cli, "run", "--isolation", "chroot", ctr, "--", *cmd],
                                  capture_output=True, text=True, env=self.env, timeout=timeout)
        finally:
            self.q("rm", ctr)


def pick_engine(name: str = "auto") -> tuple[Engine, str]:
    """(engine, why): docker when its daemon answers, else buildah."""
    if name in ("auto", "docker") and docker_answers():
        return Engine("docker"), "a Docker daemon answers"
    why = no_docker_reason()
    if name == "docker":
        raise ImageError(f"docker asked for, but {why}")
    if not shutil.which("buildah"):
        raise ImageError(f"{why} and buildah is not installed "
                         "(apt-get install buildah podman runc)")
    return Engine("buildah"), f"{why}: buildah bud --isolation chroot --storage-driver vfs"

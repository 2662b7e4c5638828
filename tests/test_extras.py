"""The `tpu` and `cuda` extras: pinned to what our jax supports, and they
resolve. The pin check is fast (installed jax's metadata); the resolution
runs `pip install --dry-run --report` on the source tree and is marked
`packaging` (run with `pytest -m packaging`). Set TXC_SKIP_CUDA_RESOLVE=1 to
leave out the cuda resolution (pip fetches the CUDA wheels' metadata,
minutes on a slow link).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def _jax_extra(extra: str) -> dict[str, Requirement]:
    """jax's own requirements for one of its extras, from installed metadata."""
    out = {}
    for line in md.requires("jax") or []:
        r = Requirement(line)
        if r.marker and r.marker.evaluate({"extra": extra}) and not r.marker.evaluate({"extra": ""}):
            out[r.name] = r
    return out


def _ours(name: str) -> Requirement:
    return next(r for r in map(Requirement, PROJECT["dependencies"]) if r.name == name)


def test_tpu_extra_is_jax_tpu_over_our_jax_range():
    """jax[tpu] over our jax range: jax pins the stable libtpu (not
    libtpu-nightly) to the jax in use (jax 0.10.2: libtpu 0.0.42.*)."""
    (req,) = [Requirement(r) for r in EXTRAS["tpu"]]
    assert req.name == "jax" and req.extras == {"tpu"} and req.specifier == _ours("jax").specifier, req
    assert "libtpu" in _jax_extra("tpu") and "libtpu-nightly" not in _jax_extra("tpu"), _jax_extra("tpu")


def test_cuda_extra_is_jax_cuda_plugin():
    (req,) = [Requirement(r) for r in EXTRAS["cuda"]]
    assert req.name == "jax" and "cuda" in req.extras and req.specifier == _ours("jax").specifier, req
    assert md.version("jax") in req.specifier
    assert any(n.startswith("jax-cuda") and n.endswith("-plugin") for n in _jax_extra("cuda"))


@pytest.fixture
def selected(request):
    if "packaging" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow packaging test: select with `pytest -m packaging`")


def _resolve(extra: str) -> dict[str, str]:
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", "-", f"{ROOT}[{extra}]"],
        capture_output=True, text=True, env={**os.environ, "TXC_ABI": "cxx11"})
    assert res.returncode == 0, res.stderr[-3000:]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
            for i in json.loads(res.stdout)["install"]}


@pytest.mark.packaging
def test_tpu_extra_resolves(selected):
    got = _resolve("tpu")
    assert got["torch"] in _ours("torch").specifier, got
    jax_pin = _jax_extra("tpu")["libtpu"]
    assert got["libtpu"] in jax_pin.specifier, got
    assert "libtpu-nightly" not in got


@pytest.mark.packaging
@pytest.mark.skipif(os.environ.get("TXC_SKIP_CUDA_RESOLVE") == "1", reason="TXC_SKIP_CUDA_RESOLVE=1")
def test_cuda_extra_resolves(selected):
    got = _resolve("cuda")
    plugin = [n for n in got if n.startswith("jax-cuda") and n.endswith("-plugin")]
    assert plugin and got[plugin[0]] == got["jax"], got
    assert any(n.startswith("nvidia-") for n in got)

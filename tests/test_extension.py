"""The C++ extension API: an out-of-tree module adds core ops, and an
extension built for one C++ ABI flavor refuses, clearly, to load into the other.

Fast tests (always run): the core publishes its API table as the capsule
torch_xla_core._C._api, named after its flavor; the example extension
(examples/extension) compiled against this source tree with each flavor's
_GLIBCXX_USE_CXX11_ABI loads into the installed core when the flavors match
(its op works: numerics and gradient vs torch on CPU) and raises ImportError
naming both flavors and the wheel to install when they don't.

Tests marked `packaging` (run with `pytest -m packaging`) do what a user
does, per flavor: install the flavor's wheel into a venv, build the example
with `pip install --no-build-isolation` (CMake: find_package(torch_xla_core)
from the wheel), use it there, then import it into a venv of the other
flavor. Wheels: $TXC_WHEELHOUSE/<flavor>/, else wheelhouse/<flavor>/ when
those carry the extension API, else built here (about a minute each).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "extension"
sys.path.insert(0, str(ROOT / "build"))
import flavors  # noqa: E402  build/flavors.py

MATRIX = flavors.load()
FLAVORS = MATRIX.names()
CAPSULE_PREFIX = "torch_xla_core._C.api.v1."

# Runs in a fresh interpreter where txc_scaled_tanh is importable: uses the
# op and prints facts as JSON.
USE_SCRIPT = r"""
import json, torch
import torch_xla_core as txc
from torch_xla_core import _C, _tensor
import txc_scaled_tanh as st

torch.manual_seed(0)
x = torch.randn(3, 7, dtype=torch.float32, requires_grad=True)
g = torch.randn(3, 7)
ref = 1.5 * torch.tanh(0.7 * x)
ref.backward(g)
xx = x.detach().to(txc.device()).requires_grad_()
y = st.scaled_tanh(xx, 1.5, 0.7)
y.backward(g.to(txc.device()))
xb = torch.randn(5, dtype=torch.bfloat16)
yb = st.scaled_tanh(xb.to(txc.device())).cpu()
via_name = _tensor.op("scaled_tanh", xx.detach(), attrs=(2.0, 1.0)).cpu()
st.scaled_tanh(torch.randn(3, 7).to(txc.device()), 2.0, 1.0).cpu()
compiles = txc.metrics.counters().get("compile", 0)
st.scaled_tanh(torch.randn(3, 7).to(txc.device()), 2.0, 1.0).cpu()  # same graph, new data
recompiles = txc.metrics.counters().get("compile", 0) - compiles
try:
    st.scaled_tanh(torch.arange(4).to(txc.device()))
    int_error = None
except Exception as e:
    int_error = f"{type(e).__name__}: {e}"
print(json.dumps({
    "flavor": txc.build_info()["flavor"],
    "ext_flavor": st._C.flavor,
    "ops": st._C.ops,
    "core_ids": {k: _C.op_ids().get(k) for k in st._C.ops},
    "fwd_err": (y.detach().cpu() - ref.detach()).abs().max().item(),
    "grad_err": (xx.grad.cpu() - x.grad).abs().max().item(),
    "bf16_err": (yb.float() - (1.7159 * torch.tanh(2 / 3 * xb.float()))).abs().max().item(),
    "by_name_err": (via_name - 2.0 * torch.tanh(x.detach())).abs().max().item(),
    "int_error": int_error,
    "recompiles": recompiles,
}))
"""

# Imports the extension where it may not fit; a crash shows as a signal.
MIX_SCRIPT = r"""
import json
import torch_xla_core
try:
    import txc_scaled_tanh
    print(json.dumps({"imported": True}))
except ImportError as e:
    print(json.dumps({"imported": False, "error": str(e)}))
"""


def _run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, (f"{cmd} -> rc {res.returncode}\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res


def _last_json(res) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check_works(facts: dict, flavor: str) -> None:
    assert facts["flavor"] == facts["ext_flavor"] == flavor
    assert set(facts["ops"]) == {"scaled_tanh", "scaled_tanh_backward"}
    assert facts["core_ids"] == facts["ops"], "the ops are in the core's registry"
    assert facts["fwd_err"] < 1e-5 and facts["grad_err"] < 1e-5, facts
    assert facts["bf16_err"] < 2e-2, facts
    assert facts["by_name_err"] < 1e-5, facts
    assert facts["recompiles"] == 0, "an extension op's graph is cached like any other"
    assert facts["int_error"].startswith("RuntimeError: scaled_tanh: expected a floating-point"), facts


def _check_refused(facts: dict, ext_flavor: str, core_flavor: str) -> None:
    assert facts["imported"] is False, "a mismatched extension must not load"
    msg = facts["error"]
    ext_abi = int(MATRIX[ext_flavor].cxx11_abi)
    assert f"built against the {ext_flavor} flavor" in msg, msg
    assert f"is the {core_flavor} flavor" in msg, msg
    assert f"_GLIBCXX_USE_CXX11_ABI={ext_abi}" in msg and f"_GLIBCXX_USE_CXX11_ABI={1 - ext_abi}" in msg
    # the documented install command of the extension's flavor, exactly
    want = " ".join(MATRIX[ext_flavor].install_command(flavors.base_version()))
    assert want in msg, msg
    assert "txc_scaled_tanh._C" in msg, msg


# ------------------------------------------------------------- the capsule
def test_core_publishes_api_capsule():
    """The capsule's name carries the core's flavor, and its ABI-neutral
    header (read here with ctypes, as an extension reads it in C) agrees
    with build_info()."""
    import torch_xla_core as txc
    from torch_xla_core import _C

    flavor = txc.build_info()["flavor"]
    api = PyCapsule(_C._api)
    assert api.name == CAPSULE_PREFIX + flavor
    h = api.header()
    assert (h.magic, h.version) == (0x41435854, 1)
    assert h.size > ctypes.sizeof(ApiHeader)
    assert bool(h.cxx11_abi) == _C.cxx11_abi()
    assert h.flavor.decode() == flavor == _C._api_flavor


class ApiHeader(ctypes.Structure):  # csrc/ext/api.h
    _fields_ = [("magic", ctypes.c_uint32), ("version", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("cxx11_abi", ctypes.c_int32), ("flavor", ctypes.c_char_p), ("layout", ctypes.c_uint64)]


class PyCapsule:
    def __init__(self, cap):
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        self.cap = cap
        self.name = api.PyCapsule_GetName(cap).decode()
        self.ptr = api.PyCapsule_GetPointer(cap, self.name.encode())

    def header(self) -> ApiHeader:
        return ApiHeader.from_address(self.ptr)


# ------------------------- the example built against this tree (fast)
def _compile_against_tree(out: Path, cxx11_abi: int) -> tuple[list[str], Path]:
    """g++ on examples/extension/src with the source tree as
    <torch_xla_core/...> headers: what the wheel's headers are."""
    pybind11 = pytest.importorskip("pybind11")
    inc = out / "include"
    inc.mkdir(parents=True, exist_ok=True)
    link = inc / "torch_xla_core"
    if not link.exists():
        link.symlink_to(ROOT / "csrc")
    pkg = out / f"abi{cxx11_abi}" / "txc_scaled_tanh"
    pkg.mkdir(parents=True)
    shutil.copy(EXAMPLE / "txc_scaled_tanh" / "__init__.py", pkg)
    so = pkg / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = ["g++", "-O0", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden",
           f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}", f"-I{inc}", f"-I{link}",
           f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
           str(EXAMPLE / "src" / "scaled_tanh.cpp"), "-o", str(so)]
    return cmd, pkg.parent


@pytest.fixture(scope="module")
def tree_builds(tmp_path_factory):
    """{flavor: folder holding txc_scaled_tanh built with that flavor's ABI}."""
    if not shutil.which("g++"):
        pytest.skip("no g++")
    out = tmp_path_factory.mktemp("ext")
    jobs = {f.name: _compile_against_tree(out, int(f.cxx11_abi)) for f in MATRIX}
    procs = {n: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n, (cmd, _) in jobs.items()}
    for n, p in procs.items():
        log = p.communicate()[0]
        assert p.returncode == 0, f"{n}: {log[-4000:]}"
    return {n: d for n, (_, d) in jobs.items()}


def _installed_flavor() -> str:
    import torch_xla_core as txc

    return txc.build_info()["flavor"]


def _env_with(path: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_example_extension_matching_flavor(tree_builds):
    flavor = _installed_flavor()
    res = _run([sys.executable, "-c", USE_SCRIPT], env=_env_with(tree_builds[flavor]), cwd=ROOT)
    _check_works(_last_json(res), flavor)


def test_example_extension_exports_no_core_symbol(tree_builds):
    """The forwarders and the extension's API state are its own (hidden):
    never interposed with the core's or shared with another extension."""
    if not shutil.which("nm"):
        pytest.skip("no nm")
    for name, d in tree_builds.items():
        (so,) = (d / "txc_scaled_tanh").glob("_C*.so")
        res = _run(["nm", "-D", "--defined-only", str(so)])
        syms = [ln.split()[-1] for ln in res.stdout.splitlines() if ln.strip()]
        assert "PyInit__C" in syms
        ours = [s for s in syms if re.match(r"_ZN[KVR]*3txc", s)]  # txc::... itself
        assert ours == [], (name, ours[:5])


def test_example_extension_other_flavor_is_refused(tree_builds):
    core = _installed_flavor()
    (other,) = [n for n in FLAVORS if n != core]
    res = _run([sys.executable, "-c", MIX_SCRIPT], env=_env_with(tree_builds[other]), cwd=ROOT)
    _check_refused(_last_json(res), other, core)


# ----------------------------------------------------- real wheels (slow)
def _carries_api(whl: Path) -> bool:
    with zipfile.ZipFile(whl) as z:
        return "torch_xla_core/include/torch_xla_core/ext/extension.h" in z.namelist()


@pytest.fixture(scope="module")
def wheels_by_flavor(request, tmp_path_factory):
    if "packaging" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow packaging test: select with `pytest -m packaging`")
    import wheels  # build/wheels.py

    house = os.environ.get("TXC_WHEELHOUSE")
    if house:
        got = {n: wheels.one_wheel(Path(house) / n) for n in FLAVORS}
        for w in got.values():
            assert _carries_api(w), f"{w} predates the extension API: rebuild (nox -s wheels)"
        return got
    try:
        got = {f.name: wheels.one_wheel(f.wheelhouse_dir()) for f in MATRIX}
        if all(_carries_api(w) for w in got.values()):
            return got
    except Exception:
        pass
    out = tmp_path_factory.mktemp("wheels")
    return {f.name: wheels.build(f, out=out / f.name, record=False) for f in MATRIX}


def _make_venv(d: Path, whl: Path) -> Path:
    """A venv holding the wheel; torch, jax, pybind11, scikit-build-core come
    from this interpreter's site-packages through a path line (not a site
    dir: its .pth files, e.g. an editable install of this project, stay out)."""
    venv.create(d, with_pip=False)
    py = d / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_txc_test_base.pth").write_text("\n".join(sorted(ours)) + "\n")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)])
    return py


@pytest.fixture(scope="module")
def venvs(wheels_by_flavor, tmp_path_factory):
    """{flavor: (python, folder of the extension built there)}: the flavor's
    wheel installed, the example built and installed with pip."""
    if not shutil.which("cmake"):
        pytest.skip("no cmake")
    pytest.importorskip("pybind11")
    try:
        import scikit_build_core  # noqa: F401
        with_pip = True
    except ImportError:  # e.g. nox's venv: CMake directly, as CMake users do
        with_pip = False
    got = {}
    for name, whl in wheels_by_flavor.items():
        d = tmp_path_factory.mktemp(f"venv-{name}")
        py = _make_venv(d / "venv", whl)
        if with_pip:  # the README's command
            _run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                  str(EXAMPLE)], cwd=d)
        else:
            site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).stdout.strip()
            _run(["cmake", "-S", str(EXAMPLE), "-B", str(d / "build"), f"-DPython_EXECUTABLE={py}",
                  f"-DCMAKE_INSTALL_PREFIX={site}", "-DCMAKE_BUILD_TYPE=Release"], cwd=d)
            _run(["cmake", "--build", str(d / "build")], cwd=d)
            _run(["cmake", "--install", str(d / "build")], cwd=d)
            shutil.copy(EXAMPLE / "txc_scaled_tanh" / "__init__.py", Path(site) / "txc_scaled_tanh")
        site = Path(_run([str(py), "-c", "import txc_scaled_tanh as m, os; print(os.path.dirname(m._C.__file__))"],
                         cwd=d).stdout.strip())
        # A copy of the built package alone, to import it into the other venv.
        ext = d / "ext"
        shutil.copytree(site, ext / "txc_scaled_tanh")
        got[name] = (py, ext)
    return got


@pytest.mark.packaging
@pytest.mark.parametrize("name", FLAVORS)
def test_wheel_extension_works_in_its_flavor(venvs, name):
    py, _ = venvs[name]
    res = _run([str(py), "-c", USE_SCRIPT], cwd=py.parent)
    _check_works(_last_json(res), name)


@pytest.mark.packaging
@pytest.mark.parametrize("name", FLAVORS)
def test_wheel_extension_refused_by_other_flavor(venvs, name):
    (other,) = [n for n in FLAVORS if n != name]
    py_other, _ = venvs[other]
    _, ext = venvs[name]
    res = _run([str(py_other), "-c", MIX_SCRIPT], env=_env_with(ext), cwd=py_other.parent)
    _check_refused(_last_json(res), name, other)

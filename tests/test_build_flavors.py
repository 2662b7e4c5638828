"""The two C++-ABI flavors: matrix, build settings, wheels, install commands.

Fast tests (always run) pin the flavor matrix, the scikit-build-core
settings each flavor resolves to, and build_info() of the installed core.
Tests marked `packaging` work on real wheels: they are skipped unless
selected with `pytest -m packaging`. They use the repaired wheels in
$TXC_WHEELHOUSE/<flavor>/ when that is set (what `nox -s wheels` leaves in
wheelhouse/), and otherwise build both flavors first (about a minute each,
incremental after that).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build"))
import flavors  # noqa: E402  build/flavors.py
import wheels  # noqa: E402  build/wheels.py

MATRIX = flavors.load()
FLAVORS = MATRIX.names()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# ------------------------------------------------------------- the matrix
def test_matrix_default_is_plain_cxx11():
    d = MATRIX[MATRIX.default]
    assert d.name == "cxx11" and d.cxx11_abi and d.local_label == ""
    assert MATRIX["precxx11"].local_label == "precxx11"
    assert not MATRIX["precxx11"].cxx11_abi
    assert MATRIX.env_var == "TXC_ABI"


def test_matrix_dirs_are_apart():
    """Each flavor has its own build dir (CMake's cache would carry one ABI
    into the other) and its own wheelhouse (pip picks +precxx11 for ==0.1.0)."""
    assert len({f.build_dir for f in MATRIX}) == len(FLAVORS)
    assert len({f.wheelhouse for f in MATRIX}) == len(FLAVORS)
    for f in MATRIX:
        assert f.build_dir.startswith(".skbuild/"), "build/ shadows pypa's build package"


def test_install_commands_pin_the_exact_version():
    base = flavors.base_version()
    assert MATRIX["cxx11"].install_command(base)[2:] == [
        f"torch_xla_core=={base}", "-f", "wheelhouse/cxx11"]
    assert MATRIX["precxx11"].install_command(base)[2:] == [
        f"torch_xla_core=={base}+precxx11", "-f", "wheelhouse/precxx11"]


# ------------------------------------------------ pyproject / CMake settings
def _overrides():
    return PYPROJECT["tool"]["scikit-build"].get("overrides", [])


@pytest.mark.parametrize("name", FLAVORS)
def test_pyproject_override_matches_matrix(name):
    """The overrides in pyproject.toml say what build/flavors.toml says."""
    f = MATRIX[name]
    hits = [o for o in _overrides() if "env" in o.get("if", {})
            and MATRIX.env_var in o["if"]["env"]
            and re.search(o["if"]["env"][MATRIX.env_var], name)]
    assert len(hits) == 1, f"want one override for {MATRIX.env_var}={name}"
    (o,) = hits
    assert o["build-dir"] == f.build_dir
    if f.local_label:
        assert o["metadata"]["version"]["result"] == "{value}+" + f.local_label
        assert o["inherit"]["metadata"]["version"] == "append"
    else:
        assert "metadata" not in o
    want_define = "ON" if f.cxx11_abi else "OFF"
    got = o.get("cmake", {}).get("define", {}).get(
        "TXC_CXX11_ABI", PYPROJECT["tool"]["scikit-build"]["cmake"]["define"]["TXC_CXX11_ABI"])
    assert got == want_define
    if "cmake" in o:
        assert o["inherit"]["cmake"]["define"] == "append"


@pytest.mark.parametrize("env_value", [None, *FLAVORS])
def test_scikit_build_resolves_flavor(env_value, monkeypatch):
    """What scikit-build-core itself makes of pyproject.toml per TXC_ABI."""
    sr = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings")
    monkeypatch.delenv(MATRIX.env_var, raising=False)
    if env_value:
        monkeypatch.setenv(MATRIX.env_var, env_value)
    s = sr.SettingsReader.from_file(ROOT / "pyproject.toml", state="wheel",
                                    env=dict(os.environ)).settings
    f = MATRIX[env_value or MATRIX.default]
    assert s.cmake.define["TXC_CXX11_ABI"] == ("ON" if f.cxx11_abi else "OFF")
    assert s.cmake.define["TXC_ABI"] == f.name
    # inherited, not replaced by the override:
    assert s.metadata["version"]["provider"] == "scikit_build_core.metadata.regex"
    result = s.metadata["version"].get("result", "{value}")
    assert result.format(value="0.1.0") == f.version("0.1.0")
    if env_value:
        assert s.build_dir == f.build_dir


def test_cmake_sets_abi_before_any_target():
    text = (ROOT / "CMakeLists.txt").read_text()
    define = text.index("add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=")
    for target in re.finditer(r"^\s*(add_library|add_executable|pybind11_add_module)\(",
                              text, re.M):
        assert target.start() > define, f"{target[1]} before the ABI define"
    assert "target_compile_definitions(_C PRIVATE _GLIBCXX" not in text


# ------------------------------------------------------ the installed core
def test_installed_build_info_is_consistent():
    import importlib

    import torch_xla_core
    from torch_xla_core import _C

    bi = importlib.import_module("torch_xla_core._runtime.build_info")  # the module
    info = bi.build_info()
    assert set(info) >= {"flavor", "cxx11_abi", "compiler", "version",
                         "torch", "jax", "jaxlib"}
    assert isinstance(info["cxx11_abi"], bool)
    assert info["cxx11_abi"] == _C.cxx11_abi()
    assert info["flavor"] == MATRIX.by_abi(info["cxx11_abi"]).name
    assert info["compiler"].split()[0] in ("gcc", "clang")
    if info["version"] is not None:       # installed, not run from a bare tree
        assert info["flavor_consistent"], info
    import torch
    # the torch in use; its distribution metadata may lack the local label
    # torch.__version__ has (PyPI's CUDA wheels: 2.14.1 vs 2.14.1+cu130)
    assert info["torch"].split("+")[0] == torch.__version__.split("+")[0], (info["torch"], torch.__version__)


def test_package_reexports_build_info():
    """`torch_xla_core.build_info()` stays a function, also after its
    module torch_xla_core._runtime.build_info has been imported (that binds
    `_runtime.build_info`, not the root's attribute)."""
    import importlib

    import torch_xla_core as t

    first = t.build_info()
    importlib.import_module("torch_xla_core._runtime.build_info")
    assert callable(t.build_info), "torch_xla_core.build_info is the module now"
    assert t.build_info() == first
    assert first["flavor"] in FLAVORS


# ----------------------------------------------------- real wheels (slow)
def _packaging_selected(config) -> bool:
    return "packaging" in (config.getoption("-m") or "")


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """{flavor: repaired wheel}: from $TXC_WHEELHOUSE, or built here."""
    if not _packaging_selected(request.config):
        pytest.skip("slow packaging test: select with `pytest -m packaging`")
    house = os.environ.get("TXC_WHEELHOUSE")
    if house:
        return {n: wheels.one_wheel(Path(house) / n) for n in FLAVORS}
    out = tmp_path_factory.mktemp("wheels")
    got = {}
    for f in MATRIX:
        raw = wheels.build(f, out=out / "dist" / f.name, record=False)
        got[f.name] = wheels.run_auditwheel(raw, out / "wheelhouse" / f.name)
    return got


def _pip_choice(find_links: Path, requirement: str, *extra: str) -> str:
    """The version pip would install for the requirement from that folder."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--no-deps", "--no-index", "-f", str(find_links), "--report", "-",
         "-q", requirement, *extra], capture_output=True, text=True, check=True)
    (item,) = json.loads(res.stdout)["install"]
    return item["metadata"]["version"]


@pytest.mark.packaging
@pytest.mark.parametrize("name", FLAVORS)
def test_wheel_version_tags_nm_build_info(built, name):
    """One check per wheel: name and METADATA carry the flavor's version,
    CPython-specific manylinux tags, `nm -D` shows cxx11-tagged symbols only
    in the C++11 build, and the wheel's own build_info() agrees."""
    res = wheels.check_wheel(built[name], MATRIX[name])
    # the core and the micro-benchmark module (an extension of the core), both of the flavor
    assert sorted(Path(so).name.split(".")[0] for so in res["nm"]) == ["_C", "_bench_core"], res["nm"]
    for nm in res["nm"].values():
        assert (nm["cxx11_symbols"] > 0) == MATRIX[name].cxx11_abi
    assert res["build_info"]["flavor"] == name


@pytest.mark.packaging
def test_check_rejects_the_other_flavor(built):
    with pytest.raises(wheels.CheckError, match="cxx11-tagged symbols in a pre-C"):
        wheels.check_wheel(built["cxx11"], MATRIX["precxx11"])
    with pytest.raises(wheels.CheckError, match="no cxx11-tagged symbol"):
        wheels.check_wheel(built["precxx11"], MATRIX["cxx11"])


@pytest.mark.packaging
@pytest.mark.parametrize("name", FLAVORS)
def test_documented_install_command_picks_the_flavor(built, name, tmp_path):
    """`pip install torch_xla_core==<v>[+precxx11] -f wheelhouse/<flavor>`."""
    f = MATRIX[name]
    house = tmp_path / f.wheelhouse
    house.mkdir(parents=True)
    shutil.copy(built[name], house)
    base = flavors.base_version()
    cmd = f.install_command(base)
    assert _pip_choice(house, cmd[2]) == f.version(base)


@pytest.mark.packaging
def test_mixed_folder_would_pick_precxx11(built, tmp_path):
    """Why the folders are kept apart: from one folder holding both, pip
    takes 0.1.0+precxx11 for ==0.1.0 (a local label sorts above none)."""
    for w in built.values():
        shutil.copy(w, tmp_path)
    base = flavors.base_version()
    assert _pip_choice(tmp_path, f"torch_xla_core=={base}") == f"{base}+precxx11"
    assert _pip_choice(tmp_path, f"torch_xla_core==={base}") == base  # arbitrary equality


@pytest.mark.packaging
def test_wheel_carries_no_build_paths(built):
    """Reproducible wheels: zip timestamps from SOURCE_DATE_EPOCH, and no
    absolute build or source path inside the core."""
    for name, whl in built.items():
        with zipfile.ZipFile(whl) as z:
            stamps = {i.date_time for i in z.infolist()}
            sos = [n for n in z.namelist() if n.endswith(".so")]
            blobs = {so: z.read(so) for so in sos}
        assert len(stamps) == 1, f"{name}: zip entries carry {len(stamps)} timestamps"
        assert len(sos) == 2, sos  # _C and _bench_core
        for so, blob in blobs.items():
            assert str(ROOT).encode() not in blob, f"{name}: {ROOT} is in {so}"


@pytest.mark.packaging
def test_switching_flavor_needs_force_reinstall(built, tmp_path):
    """An installed 0.1.0+precxx11 satisfies ==0.1.0: pip keeps it unless
    told --force-reinstall. (--no-deps venv: metadata decisions only.)"""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    base = flavors.base_version()

    def pip_install(*args):
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *args],
                       check=True, capture_output=True)

    def installed():
        return subprocess.run([py, "-c", "import importlib.metadata as m;"
                               "print(m.version('torch_xla_core'))"],
                              capture_output=True, text=True, check=True).stdout.strip()

    cx, pre = (built[n].parent for n in ("cxx11", "precxx11"))
    pip_install(f"torch_xla_core=={base}+precxx11", "-f", str(pre))
    assert installed() == f"{base}+precxx11"
    pip_install(f"torch_xla_core=={base}", "-f", str(cx))
    assert installed() == f"{base}+precxx11"      # the trap
    pip_install(f"torch_xla_core=={base}", "-f", str(cx), "--force-reinstall")
    assert installed() == base


_EXT_CMAKE = """cmake_minimum_required(VERSION 3.24)
project(ext LANGUAGES CXX)
find_package(Python 3.11 COMPONENTS Interpreter Development.Module REQUIRED)
find_package(torch_xla_core 0.1 CONFIG REQUIRED)
if(NOT torch_xla_core_FLAVOR STREQUAL "${WANT_FLAVOR}")
  message(FATAL_ERROR "flavor ${torch_xla_core_FLAVOR}")
endif()
pybind11_add_module(ext ext.cpp)
target_link_libraries(ext PRIVATE torch_xla_core::headers)
"""
_EXT_CPP = """#include <pybind11/pybind11.h>
#include <torch_xla_core/ops/registry.h>
static_assert(_GLIBCXX_USE_CXX11_ABI == WANT_ABI, "the flavor's ABI reaches the extension");
PYBIND11_MODULE(ext, m) { m.def("abi", [] { return _GLIBCXX_USE_CXX11_ABI; }); }
"""


@pytest.mark.packaging
@pytest.mark.parametrize("name", FLAVORS)
def test_extension_builds_against_wheel_headers(built, name, tmp_path):
    """find_package(torch_xla_core) from the unpacked wheel gives the API
    headers and compiles an extension with the wheel's ABI."""
    pybind11 = pytest.importorskip("pybind11")
    if not shutil.which("cmake"):
        pytest.skip("no cmake")
    f = MATRIX[name]
    site = tmp_path / "site"
    with zipfile.ZipFile(built[name]) as z:
        z.extractall(site)
    proj = tmp_path / "ext"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(_EXT_CMAKE)
    (proj / "ext.cpp").write_text(_EXT_CPP)
    cmake_dir = site / "torch_xla_core/share/cmake/torch_xla_core"
    subprocess.run(["cmake", "-S", str(proj), "-B", str(proj / "b"),
                    f"-Dtorch_xla_core_DIR={cmake_dir}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DPython_EXECUTABLE={sys.executable}", f"-DWANT_FLAVOR={name}",
                    f"-DCMAKE_CXX_FLAGS=-DWANT_ABI={int(f.cxx11_abi)}"],
                   check=True, capture_output=True)
    res = subprocess.run(["cmake", "--build", str(proj / "b")], capture_output=True, text=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]

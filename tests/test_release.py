"""The release matrix: Python list, package index per flavor, pip resolution.

Fast tests (always run) pin the Python list of build/flavors.toml against
pyproject.toml (classifiers, requires-python, cibuildwheel's `build`) and
check the index logic on small synthetic wheels: each flavor's PEP 503
index, served over HTTP, gives pip exactly that flavor by name, `==` and
`>=`, and never the other one.

Tests marked `packaging` (`nox -s wheels`, CI) put the two cp311 wheels CI
builds ($TXC_WHEELHOUSE) into one index per flavor and install each the way
users type it. Tests marked `release` work on `nox -s release`'s artifacts
($TXC_RELEASE_DIR, default release/): every Python x flavor wheel and the
sdist, resolved and installed from the served index in fresh venvs without
torch. Both are skipped unless selected with `pytest -m packaging` / `-m release`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build"))
import flavors  # noqa: E402  build/flavors.py
import pyindex  # noqa: E402
import release  # noqa: E402
import wheels  # noqa: E402

MATRIX = flavors.load()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BASE = flavors.base_version()
HERE_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
# pip with no configuration: only the URLs a test passes (no find-links, no
# extra index of this machine, no network)
ISOLATED_PIP = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
                "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


# ------------------------------------------------------ the Python list
def test_python_list_is_the_one_in_pyproject():
    """build/flavors.toml [python] is repeated by hand in pyproject.toml:
    the classifiers, cibuildwheel's build selector, requires-python."""
    proj = PYPROJECT["project"]
    listed = [c.rsplit(" ", 1)[-1] for c in proj["classifiers"]
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert listed == list(MATRIX.pythons)
    assert PYPROJECT["tool"]["cibuildwheel"]["build"] == MATRIX.cibw_build()
    assert proj["requires-python"] == f">={MATRIX.pythons[0]}"
    assert MATRIX.default_python in MATRIX.pythons
    assert MATRIX.cibw_build().split() == [f"{flavors.cp_tag(v)}-*" for v in MATRIX.pythons]


def test_cibuildwheel_selects_the_matrix():
    """cibuildwheel reads [tool.cibuildwheel] and builds one x86_64
    manylinux wheel per Python of the list (offline: it only prints)."""
    try:  # not importorskip: build/cibuildwheel.py is on sys.path under that name
        md.version("cibuildwheel")
    except md.PackageNotFoundError:
        pytest.skip("cibuildwheel is not installed (nox -s release installs it)")
    res = subprocess.run([sys.executable, "-m", "cibuildwheel", "--platform", "linux",
                          "--print-build-identifiers", str(ROOT)], capture_output=True,
                         text=True, check=True, cwd=ROOT / "tests")
    ids = res.stdout.split()
    assert ids == [f"{flavors.cp_tag(v)}-manylinux_x86_64" for v in MATRIX.pythons]


def test_image_tags_follow_the_python_list():
    """Image tags r<version>_<python>_<platform>_<flavor> name a Python of
    the list (the default one unless asked) and refuse any other."""
    import images  # build/images.py
    f = MATRIX[MATRIX.default]
    assert images.tag(BASE, f) == f"r{BASE}_{MATRIX.default_python}_cpu_{f.image_suffix}"
    assert [images.tag(BASE, f, python=v).split("_")[1] for v in MATRIX.pythons] == \
        list(MATRIX.pythons)
    with pytest.raises(ValueError, match=r"Python '3\.10' is not in build/flavors.toml"):
        images.tag(BASE, f, python="3.10")


def test_interpreter_lookup_names_what_it_passed_over(monkeypatch):
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    monkeypatch.setattr(release, "interpreter_candidates", lambda v: [Path(sys.executable)])
    py, _ = release.find_python(here)
    assert py == Path(sys.executable)
    py, why = release.find_python("3.99")
    assert py is None and f"is cpython {here}" in why[0]
    with pytest.raises(release.CheckError, match="not in build/flavors.toml"):
        release.pythons(["3.99"], require_all=False)


def test_sdist_must_hold_the_build_inputs():
    """The files a source build reads are tracked (so scikit-build-core's
    sdist, which takes git's files, carries them)."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.split())
    missing = [m for m in release.SDIST_MUST_HOLD if m != "PKG-INFO" and m not in tracked]
    assert not missing
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


# ------------------------------------------- the index on synthetic wheels
def _fake_wheel(d: Path, version: str, py_tag: str) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD): enough for pip to
    resolve it; nothing to import."""
    name = f"{flavors.DIST}-{version}-{py_tag}-{py_tag}-manylinux_2_28_x86_64.whl"
    di = f"{flavors.DIST}-{version}.dist-info"
    files = {f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {flavors.DIST}\n"
                               f"Version: {version}\nRequires-Python: >=3.11\n",
             f"{di}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {py_tag}-"
                            f"{py_tag}-manylinux_2_28_x86_64\n"}
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},{len(v)}\n"
                     for k, v in files.items()) + f"{di}/RECORD,,\n"
    d.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(d / name, "w") as z:
        for k, v in {**files, f"{di}/RECORD": record}.items():
            z.writestr(k, v)
    return d / name


def _resolve(requirement: str, *args: str, python: str = sys.executable,
             env: dict | None = None) -> tuple[str, str]:
    """(file, version) pip takes for the requirement; its --report, no install."""
    res = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--no-deps", "--no-cache-dir", "-q", "--report", "-", requirement,
                          *args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (item,) = json.loads(res.stdout)["install"]
    return unquote(item["download_info"]["url"].rsplit("/", 1)[-1]), item["metadata"]["version"]


@pytest.fixture(scope="module")
def synthetic_index(tmp_path_factory):
    """Both flavors' wheels for this Python and another, in an index per flavor."""
    tmp = tmp_path_factory.mktemp("index")
    made = {f.name: [_fake_wheel(tmp / "w" / f.name, f.version(BASE), t)
                     for t in (HERE_TAG, "cp399")] for f in MATRIX}
    for f in MATRIX:
        pyindex.write_index(tmp / "root", f.name, made[f.name], flavors.DIST, ">=3.11")
    with pyindex.served(tmp / "root") as url:
        yield url, made


@pytest.mark.parametrize("name", MATRIX.names())
@pytest.mark.parametrize("req", ["{d}", "{d}=={v}", "{d}>={v}"])
def test_index_gives_its_flavor(synthetic_index, name, req):
    url, made = synthetic_index
    f = MATRIX[name]
    want = [w.name for w in made[name] if HERE_TAG in w.name]
    got = _resolve(req.format(d=flavors.DIST, v=BASE), "--index-url", f"{url}/{name}/simple",
                   env=ISOLATED_PIP)
    assert got == (want[0], f.version(BASE))


def test_index_pages_are_pep503(synthetic_index):
    """Normalized project name, one link per file with its sha256; each
    flavor's index lists only its own version."""
    url, made = synthetic_index
    for f in MATRIX:
        listed = pyindex.listed_files(f"{url}/{f.name}/simple", "Torch_XLA.Core")
        assert listed == sorted(w.name for w in made[f.name])
        assert {n.split("-")[1] for n in listed} == {f.version(BASE)}


def test_release_refuses_a_foreign_wheel_in_an_index(tmp_path, monkeypatch):
    monkeypatch.setattr(release, "OUT", tmp_path)
    other = MATRIX.by_abi(not MATRIX[MATRIX.default].cxx11_abi)
    _fake_wheel(tmp_path / "wheelhouse" / other.name, MATRIX[MATRIX.default].version(BASE),
                HERE_TAG)
    with pytest.raises(release.CheckError, match=f"is not version {re.escape(other.version(BASE))}"):
        release.index_files(other)


# ----------------------------------------- real wheels: CI's cp311 pair
def _selected(config, marker: str) -> bool:
    return marker in (config.getoption("-m") or "")


def _venv_without_torch(where: Path, python: str = sys.executable) -> Path:
    if python == sys.executable:
        venv.create(where, with_pip=True)
    else:
        subprocess.run([python, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    assert subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 1
    return py


def _install_and_probe(py: Path, flavor: flavors.Flavor, *pip_args: str) -> dict:
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
                    "--force-reinstall", *pip_args], check=True, capture_output=True)
    res = subprocess.run([py, str(ROOT / "build" / "assert_flavor.py"), flavor.name],
                         capture_output=True, text=True, cwd=py.parent)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ci_index(request, tmp_path_factory):
    """The cp311 wheels of $TXC_WHEELHOUSE/<flavor>/ in an index per flavor."""
    if not _selected(request.config, "packaging"):
        pytest.skip("slow packaging test: select with `pytest -m packaging`")
    house = os.environ.get("TXC_WHEELHOUSE")
    if not house:
        pytest.skip("needs $TXC_WHEELHOUSE (nox -s wheels sets it)")
    tmp = tmp_path_factory.mktemp("ci-index")
    got = {f.name: wheels.one_wheel(Path(house) / f.name) for f in MATRIX}
    for f in MATRIX:
        pyindex.write_index(tmp, f.name, [got[f.name]], flavors.DIST, ">=3.11")
    py = _venv_without_torch(tmp / "venv")  # one for both flavors (--force-reinstall)
    with pyindex.served(tmp) as url:
        yield url, got, py


@pytest.mark.packaging
@pytest.mark.parametrize("name", MATRIX.names())
def test_ci_wheels_install_from_their_index(ci_index, name):
    """`pip install torch_xla_core --extra-index-url .../<flavor>/simple`
    (the machine's own pip configuration kept, as a user's is) installs the
    flavor's wheel; its core reports the flavor, without torch."""
    url, got, py = ci_index
    f = MATRIX[name]
    simple = f"{url}/{name}/simple"
    assert _resolve(flavors.DIST, "--extra-index-url", simple) == (got[name].name, f.version(BASE))
    info = _install_and_probe(py, f, flavors.DIST, "--extra-index-url", simple)
    assert (info["flavor"], info["version"]) == (name, f.version(BASE))


# ------------------------------------------- the release: every Python
@pytest.fixture(scope="module")
def rel(request, tmp_path_factory):
    """(release dir, its report, URL of its index served on 127.0.0.1)."""
    if not _selected(request.config, "release"):
        pytest.skip("release test: `nox -s release` runs it (pytest -m release)")
    d = Path(os.environ.get("TXC_RELEASE_DIR", ROOT / "release"))
    if not (d / "report.json").exists():
        pytest.skip(f"no release in {d}: run `nox -s release` first")
    rep = json.loads((d / "report.json").read_text())
    with pyindex.served(d / "index") as url:
        yield d, rep, url


@pytest.mark.release
def test_release_has_every_artifact(rel):
    """A wheel per found Python x flavor, tagged for that Python, checked;
    the versions not built are exactly those without an interpreter here;
    one sdist; twine check passed on all of them."""
    d, rep, _ = rel
    found = list(rep["pythons"])
    assert set(found) <= set(MATRIX.pythons) and set(found).isdisjoint(rep["pythons_missing"])
    for v in rep["pythons_missing"]:
        assert release.find_python(v)[0] is None, f"Python {v} is here but was not built"
    not_built = rep.get("not_built", [])  # only a --partial run has any
    for f in MATRIX:
        whls = sorted((d / "wheelhouse" / f.name).glob("*.whl"))
        tags = sorted(wheels.parse_wheel_name(w)["py"] for w in whls)
        assert tags == sorted(flavors.cp_tag(v) for v in found
                              if f"{flavors.cp_tag(v)}-{f.name}" not in not_built)
        assert {wheels.parse_wheel_name(w)["version"] for w in whls} == {f.version(BASE)}
    (sd,) = (d / "sdist").glob("*.tar.gz")
    assert sd.name == f"{flavors.DIST}-{BASE}.tar.gz"
    with tarfile.open(sd) as t:
        names = set(t.getnames())
    assert {f"{flavors.DIST}-{BASE}/{m}" for m in release.SDIST_MUST_HOLD} <= names
    assert rep["metadata"]["twine_check"] == "passed"
    assert len(rep["metadata"]["artifacts"]) == \
        len(MATRIX.names()) * len(found) - len(not_built) + 1


@pytest.mark.release
def test_release_glibc_floor_is_the_wheel_tag(rel):
    """auditwheel show's policy is the platform tag the wheel carries first."""
    d, rep, _ = rel
    for name, g in rep["metadata"]["glibc"].items():
        assert g["policy"] and wheels.parse_wheel_name(Path(name))["plat"].startswith(g["policy"])


@pytest.mark.release
def test_release_indexes_keep_the_flavors_apart(rel):
    d, rep, url = rel
    for f in MATRIX:
        listed = pyindex.listed_files(f"{url}/{f.name}/simple", flavors.DIST)
        versions = {n.split("-")[1].removesuffix(".tar.gz") for n in listed}
        assert versions == {f.version(BASE)}, f"{f.name} index offers {listed}"
        sdists = [n for n in listed if n.endswith(".tar.gz")]
        assert sdists == ([f"{flavors.DIST}-{BASE}.tar.gz"] if f.is_default else [])


def _release_pythons():
    d = Path(os.environ.get("TXC_RELEASE_DIR", ROOT / "release"))
    try:
        return list(json.loads((d / "report.json").read_text())["pythons"].items())
    except (OSError, KeyError, ValueError):
        return [(MATRIX.default_python, sys.executable)]


@pytest.mark.release
@pytest.mark.parametrize("version,interp", _release_pythons())
def test_release_pip_resolves_as_users_type_it(rel, version, interp, tmp_path):
    """Per Python, in a fresh venv of that interpreter without torch: by
    name, ==, >= from each flavor's index with --extra-index-url, and
    ==<version> -f release/wheelhouse/<flavor>, take that Python's wheel of
    that flavor; installed with --no-deps its core reports the flavor."""
    d, rep, url = rel
    py = _venv_without_torch(tmp_path / "venv", interp)
    tag = flavors.cp_tag(version)
    for f in MATRIX:
        if f"{tag}-{f.name}" in rep.get("not_built", []):
            continue  # a --partial run: test_release_has_every_artifact checks the list
        (want,) = [w.name for w in (d / "wheelhouse" / f.name).glob(f"*-{tag}-*.whl")]
        simple = f"{url}/{f.name}/simple"
        for req in [flavors.DIST, f"{flavors.DIST}=={BASE}", f"{flavors.DIST}>={BASE}"]:
            assert _resolve(req, "--extra-index-url", simple, python=str(py)) == \
                (want, f.version(BASE)), (version, f.name, req)
        assert _resolve(f"{flavors.DIST}=={f.version(BASE)}", "-f",
                        str(d / "wheelhouse" / f.name), python=str(py))[0] == want
        info = _install_and_probe(py, f, flavors.DIST, "--extra-index-url", simple)
        assert (info["flavor"], info["cxx11_abi"], info["version"]) == \
            (f.name, f.cxx11_abi, f.version(BASE))
        assert info["from"].startswith(str(tmp_path / "venv"))


@pytest.mark.release
def test_release_sdist_builds_both_flavors(rel):
    """What `build/release.py verify` recorded: in a clean venv the sdist
    gives the default flavor as it is (compiled unless --sdist-build none);
    with TXC_ABI=<flavor> the same file gives the other flavor's version;
    from an index pip refuses the relabelled build."""
    d, rep, _ = rel
    sd = rep["verify"]["sdist"]
    for f in MATRIX:
        assert sd[f.name]["version"] == f.version(BASE)
        if not f.is_default:
            assert sd[f.name]["command"].startswith(f"{MATRIX.env_var}={f.name} pip install")
            assert sd[f.name]["from_index_refused"] is True


@pytest.mark.release
def test_release_smoke_trained_on_every_python(rel):
    """What `build/release.py smoke` recorded: per Python and flavor, in a
    venv of that Python, `pip install torch_xla_core --extra-index-url
    .../<flavor>/simple` installed that Python's wheel of the flavor with
    the default torch (build/flavors.toml [torch]), and docker/smoke.py (build_info of that flavor, 3
    traced training steps equal to eager CPU, no fallback) passed."""
    d, rep, _ = rel
    if "smoke" not in rep:
        pytest.skip("this release ran without --smoke (nox -s release runs it)")
    from packaging.requirements import Requirement
    pin = MATRIX.default_torch  # build/flavors.toml [torch], within pyproject's range
    (rng,) = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")]
    assert pin in rng.specifier, (pin, str(rng))
    assert set(rep["smoke"]) == {flavors.cp_tag(v) for v in rep["pythons"]}
    for tag, sm in rep["smoke"].items():
        assert sm["torch"]["torch"].split("+")[0] == pin, (tag, sm["torch"])
        for f in MATRIX:
            if f.name in sm["not_built"]:
                assert f"{tag}-{f.name}" in rep.get("not_built", [])
                continue
            (want,) = [w.name for w in (d / "wheelhouse" / f.name).glob(f"*-{tag}-*.whl")]
            got = sm[f.name]
            assert got["installed"]["torch-xla-core"] == want, (tag, f.name)
            assert got["command"].endswith(f"/{f.name}/simple")
            assert (got["result"]["flavor"], got["result"]["version"]) == \
                (f.name, f.version(BASE)), (tag, got["result"])
            assert len(got["result"]["train"]["losses"]) == 3

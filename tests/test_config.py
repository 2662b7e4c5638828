"""torch_xla_core/config.py: every setting the package reads from the
environment (TXC_*, PJRT_DEVICE, the launchers' variables, XLA_FLAGS,
LIBTPU_INIT_ARGS, torch_xla's legacy dtype flags) declared once and read through it. Defaults, parsing
per type, errors naming the variable and what it takes, the modules' reads
following the environment at each call, txc.config's report, docs/settings.md's
settings table equal to the generated one, and no module under
torch_xla_core/ reading the environment by itself (os.environ, os.getenv:
any read outside config.py fails, naming file:line; compat's xu.getenv_as
reads a script's own variables through config.caller_variable)."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch_xla_core as txc
from torch_xla_core import compile_cache, config, executor, peers, recompiles, runtime
from torch_xla_core.config import SettingError
from torch_xla_core.kernels import attention, gmm

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "torch_xla_core"


def test_defaults_in_an_empty_environment():
    s = config.settings({})
    assert list(s) == list(config.SETTINGS)
    assert s["TXC_COMPILE_CACHE_SIZE"] == 1024 and s["TXC_COMPILE_CACHE_MAX_BYTES"] == 4 << 30
    assert s["TXC_DONATE"] is True and s["TXC_REPLAY"] is True and s["TXC_AUTOGRAD_THREADS"] is False
    assert s["TXC_COMPILE_PROGRESS"] == 2.0 and s["TXC_SDPA_KERNEL"] == "auto"
    assert s["TXC_DISTRIBUTED_TIMEOUT"] == 60.0 and s["TXC_COLLECTIVE_TIMEOUT"] == 60.0
    assert s["TXC_DEBUG"] == frozenset() and s["TXC_RECOMPILE_LIMIT"] is None
    assert s["TXC_NUM_PROCESSES"] == 1 and s["TXC_LOCAL_RANK"] == 0 and s["TXC_PROCESS_ID"] is None
    assert s["PJRT_DEVICE"] is None and s["TXC_NUM_CPU_DEVICES"] is None and s["TXC_DUMP_DIR"] is None
    assert s["TXC_COMPILE_CACHE"] == os.path.join(os.path.expanduser("~"), ".cache", "torch_xla_core")
    assert config.get("TXC_COMPILE_CACHE", {"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/torch_xla_core"


@pytest.mark.parametrize("name,raw,want", [
    ("TXC_DONATE", "0", False), ("TXC_DONATE", "false", False), ("TXC_DONATE", "OFF", False),
    ("TXC_DONATE", "yes", True), ("TXC_REPLAY", "1", True), ("TXC_AUTOGRAD_THREADS", "On", True),
    ("TXC_COMPILE_CACHE_SIZE", "7", 7), ("TXC_COMPILE_PROGRESS", "0.25", 0.25), ("TXC_COMPILE_PROGRESS", "0", 0.0),
    ("TXC_RECOMPILE_LIMIT", "3", 3), ("TXC_NUM_CPU_DEVICES", "8", 8),
    ("PJRT_DEVICE", "cuda", "CUDA"), ("PJRT_DEVICE", "Tpu", "TPU"), ("PJRT_DEVICE", "gpu", "CUDA"),
    ("TXC_SDPA_KERNEL", "cudnn", "cudnn"),
    ("TXC_DEBUG", "recompiles", frozenset({"recompiles"})), ("TXC_DEBUG", " recompiles, ", frozenset({"recompiles"})),
    ("TXC_COMPILE_CACHE", "off", None), ("TXC_COMPILE_CACHE", "None", None), ("TXC_COMPILE_CACHE", "", None),
    ("TXC_COMPILE_CACHE", "~/cc", os.path.join(os.path.expanduser("~"), "cc")), ("TXC_DUMP_DIR", "/d", "/d"),
    ("TXC_COORDINATOR", "10.0.0.1:1234", "10.0.0.1:1234"),
    # empty means unset (TXC_COMPILE_CACHE above excepted)
    ("TXC_DONATE", "", True), ("TXC_SDPA_KERNEL", "", "auto"), ("TXC_NUM_CPU_DEVICES", "", None),
])
def test_parsing(name, raw, want):
    assert config.get(name, {name: raw}) == want
    assert config.is_set(name, {name: raw}) == (raw != "" or name == "TXC_COMPILE_CACHE")


def test_collective_timeout_defaults_to_the_distributed_one():
    assert config.get("TXC_COLLECTIVE_TIMEOUT", {"TXC_DISTRIBUTED_TIMEOUT": "90"}) == 90.0
    assert config.get("TXC_COLLECTIVE_TIMEOUT", {"TXC_DISTRIBUTED_TIMEOUT": "90", "TXC_COLLECTIVE_TIMEOUT": "3"}) == 3


@pytest.mark.parametrize("name,raw,says", [
    ("TXC_DONATE", "nope", "is not a boolean: set it to 1/0"),
    ("TXC_COMPILE_CACHE_SIZE", "zero", "is not an integer: set it to an integer >= 1"),
    ("TXC_COMPILE_CACHE_SIZE", "0", "is out of range: set it to an integer >= 1"),
    ("TXC_COMPILE_CACHE_MAX_BYTES", "4GiB", "is not an integer"),
    ("TXC_COMPILE_PROGRESS", "soon", "is not a number: set it to a number >= 0"),
    ("TXC_COLLECTIVE_TIMEOUT", "0", "is out of range: set it to a number > 0"),
    ("TXC_NUM_CPU_DEVICES", "-2", "is out of range: set it to an integer >= 1"),
    ("TXC_DEBUG", "recompile", "'recompile', which is not a known flag: set it to comma-separated flags: recompiles"),
])
def test_bad_values_raise_naming_the_variable_the_value_and_what_it_takes(name, raw, says):
    with pytest.raises(SettingError) as e:
        config.get(name, {name: raw})
    msg = str(e.value)
    assert msg.startswith(f"{name}={raw!r} ") and says in msg, msg
    assert config.SETTINGS[name].doc in msg  # what the setting is for


@pytest.mark.parametrize("name,raw", [("TXC_SDPA_KERNEL", "fast"), ("PJRT_DEVICE", "gpu0"),
                                      ("TXC_GROUPED_MATMUL_IMPL", "cublas")])
def test_bad_choice_names_the_choices(name, raw):
    with pytest.raises(ValueError, match=f"{name} must be one of {', '.join(config.SETTINGS[name].choices)}.*; "
                                         f"got '{raw}'"):
        config.get(name, {name: raw})


def test_unknown_setting_and_required_setting():
    with pytest.raises(KeyError, match="TXC_NOPE is not a torch_xla_core setting"):
        config.get("TXC_NOPE")
    with pytest.raises(SettingError, match=r"TXC_PROCESS_ID is not set \(TXC_NUM_PROCESSES=2\): set it to an integer"):
        config.require("TXC_PROCESS_ID", {}, why="TXC_NUM_PROCESSES=2")
    assert config.require("TXC_PROCESS_ID", {"TXC_PROCESS_ID": "1"}) == 1


def test_modules_read_the_environment_at_each_call(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    before = (executor.cache_size(), executor._donating(), compile_cache.directory(), compile_cache.max_bytes(),
              recompiles._limit(), attention.sdpa_kernel(), attention.paged_attention_impl("cpu"),
              gmm.grouped_matmul_impl("cpu"), peers.bind_addresses("127.0.0.1:1234"))
    assert before == (1024, True, "/x/cache/torch_xla_core", 4 << 30, None, "auto", "xla", "ragged_dot",
                      ("127.0.0.1:1234", "127.0.0.1"))
    for name, raw in [("TXC_COMPILE_CACHE_SIZE", "3"), ("TXC_DONATE", "0"), ("TXC_COMPILE_CACHE", "off"),
                      ("TXC_COMPILE_CACHE_MAX_BYTES", "99"), ("TXC_RECOMPILE_LIMIT", "5"),
                      ("TXC_SDPA_KERNEL", "xla"), ("TXC_PAGED_ATTENTION_IMPL", "pallas"),
                      ("TXC_GROUPED_MATMUL_IMPL", "megablox"), ("TXC_COORDINATOR_BIND", "[::]:1234"),
                      ("TXC_GLOO_HOSTNAME", "10.1.1.1")]:
        monkeypatch.setenv(name, raw)
    after = (executor.cache_size(), executor._donating(), compile_cache.directory(), compile_cache.max_bytes(),
             recompiles._limit(), attention.sdpa_kernel(), attention.paged_attention_impl("cpu"),
             gmm.grouped_matmul_impl("cpu"), peers.bind_addresses("127.0.0.1:1234"))
    assert after == (3, False, None, 99, 5, "xla", "pallas", "megablox", ("[::]:1234", "10.1.1.1"))
    monkeypatch.setattr(recompiles, "_forced", None)  # (enable()/disable() override the variable)
    monkeypatch.setenv("TXC_DEBUG", "recompiles")
    assert recompiles.enabled()
    monkeypatch.setenv("TXC_DEBUG", "")
    assert not recompiles.enabled()
    monkeypatch.setenv("TXC_DONATE", "maybe")
    with pytest.raises(SettingError, match="TXC_DONATE='maybe' is not a boolean"):
        executor._donating()


def test_settings_and_report(monkeypatch):
    monkeypatch.setenv("TXC_COMPILE_CACHE_SIZE", "12")
    monkeypatch.setenv("TXC_DEBUG", "recompiles")
    s = txc.config.settings()
    assert s["TXC_COMPILE_CACHE_SIZE"] == 12 and s["TXC_DEBUG"] == {"recompiles"}
    rows = {ln.split()[0]: ln.split()[1:3] for ln in txc.config.report().splitlines()[1:]}
    assert list(rows) == list(config.SETTINGS)
    assert rows["TXC_COMPILE_CACHE_SIZE"] == ["12", "set"] and rows["TXC_DEBUG"] == ["recompiles", "set"]
    assert rows["TXC_DISTRIBUTED_TIMEOUT"] == ["60", "default"]
    monkeypatch.setenv("TXC_DONATE", "maybe")  # the report shows a bad value instead of raising; settings() raises
    assert "TXC_DONATE" in txc.config.report() and "BAD 'maybe'" in txc.config.report()
    with pytest.raises(SettingError):
        txc.config.settings()


def test_python_m_prints_the_report_and_the_table():
    env = dict(os.environ, TXC_COMPILE_CACHE_SIZE="77")
    p = subprocess.run([sys.executable, "-m", "torch_xla_core.config"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr, p.stderr  # (runpy's note that the package imported the module first)
    assert re.search(r"^TXC_COMPILE_CACHE_SIZE +77 +set ", p.stdout, re.M), p.stdout
    assert config.main(["--markdown"]) == 0 and config.main(["--bogus"]) == 2


def test_the_docs_settings_table_is_the_generated_one():
    text = (ROOT / "docs" / "settings.md").read_text()
    m = re.search(r"<!-- settings table: generated by .*? -->\n(.*?)\n<!-- end of settings table -->", text, re.S)
    assert m, "docs/settings.md has no settings table between its markers"
    assert m.group(1) == config.markdown_table(), ("docs/settings.md's settings table differs from config.py's: "
                                                   "paste `python -m torch_xla_core.config --markdown` there")


def _env_reads(source: str):
    """(line, name) of each TXC_* variable `source` reads from the environment
    itself: os.environ[...], os.environ.get(...), os.getenv(...), a mapping's
    .get(...) or `"TXC_..." in os.environ` (config.get(...) is the way;
    config.SETTINGS[...] is the declaration)."""
    found = []

    def txc(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("TXC_")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and txc(node.args[0]):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "getenv", "pop"):
                if not (isinstance(f.value, ast.Name) and f.value.id == "config"):
                    found.append((node.lineno, node.args[0].value))
            elif isinstance(f, ast.Name) and f.id == "getenv":
                found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and txc(node.slice):
            if getattr(node.value, "attr", getattr(node.value, "id", None)) != "SETTINGS":  # the declaration
                found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Compare) and txc(node.left) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            found.append((node.lineno, node.left.value))
    return found


def test_the_scan_finds_environment_reads():
    src = ('import os\nfrom os import getenv\na = os.environ.get("TXC_A")\nb = os.environ["TXC_B"]\n'
           'c = os.getenv("TXC_C", "1")\nd = getenv("TXC_D")\ne = "TXC_E" in os.environ\nf = env.get("TXC_F")\n'
           'os.environ["TXC_W"] = "1"\ng = config.get("TXC_G")\nenv.setdefault("TXC_H", "1")\n'
           'h = config.SETTINGS["TXC_I"].choices\n')
    assert _env_reads(src) == [(3, "TXC_A"), (4, "TXC_B"), (5, "TXC_C"), (6, "TXC_D"), (7, "TXC_E"), (8, "TXC_F")]


def test_no_module_reads_a_txc_variable_but_config():
    reads = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name != "config.py" or path.parent != PKG:
            reads += [f"{path.relative_to(ROOT)}:{ln}: {name}" for ln, name in _env_reads(path.read_text())]
    assert not reads, "read these through torch_xla_core.config.get (declare them there):\n" + "\n".join(reads)


_ENV_WRITES = {"update", "pop", "setdefault", "clear"}  # os.environ.<these>(...) as a statement: a write


def _os_environ_reads(source: str):
    """(line, code) of each place `source` reads the process environment
    itself, whatever the variable: os.getenv(...), getenv(...), os.environ[...]
    read, os.environ.get(...) and the other methods, `... in os.environ`, and
    os.environ bound or passed (env = os.environ, dict(os.environ)): what it
    reads then is out of sight. Writes are not reads: os.environ[k] = v, del
    os.environ[k], and os.environ.update/pop/setdefault/clear(...) as a
    statement of their own (the launcher sets its workers' variables)."""
    tree = ast.parse(source)
    parent = {ch: node for node in ast.walk(tree) for ch in ast.iter_child_nodes(node)}
    from_os = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "os" for a in node.names}

    def is_os(node, attr):
        if isinstance(node, ast.Attribute):
            return node.attr == attr and isinstance(node.value, ast.Name) and node.value.id == "os"
        return isinstance(node, ast.Name) and node.id == attr and attr in from_os

    found = []
    for node in ast.walk(tree):
        if is_os(node, "getenv"):
            found.append(node)
        elif is_os(node, "environ"):
            up = parent.get(node)
            if isinstance(up, ast.Subscript) and isinstance(up.ctx, (ast.Store, ast.Del)):
                continue
            if (isinstance(up, ast.Attribute) and up.attr in _ENV_WRITES and isinstance(parent.get(up), ast.Call)
                    and isinstance(parent.get(parent[up]), ast.Expr)):
                continue
            found.append(node)
    return sorted((n.lineno, ast.get_source_segment(source, parent.get(n, n)) or "") for n in found)


def test_the_scan_finds_reads_of_any_variable():
    src = ('import os\nfrom os import environ, getenv\na = os.environ.get("HOME")\nb = os.environ["USER"]\n'
           'c = os.getenv("X", "1")\nd = getenv("Y")\ne = "Z" in os.environ\nenv = os.environ\n'
           'f = dict(os.environ)\ng = environ.get("W")\nos.environ["W"] = "1"\ndel os.environ["W"]\n'
           'os.environ.update(A="1")\nos.environ.pop("A", None)\nv = os.environ.pop("B", None)\n'
           'h = config.get("XLA_FLAGS")\n')
    assert [ln for ln, _ in _os_environ_reads(src)] == [3, 4, 5, 6, 7, 8, 9, 10, 15]
    assert _os_environ_reads(src)[0][1] == "os.environ.get"


def test_no_module_reads_the_environment_but_config():
    reads = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel != "torch_xla_core/config.py":
            reads += [f"{rel}:{ln}: {code}" for ln, code in _os_environ_reads(path.read_text())]
    assert not reads, ("declare these in torch_xla_core/config.py and read them with config.get "
                       "(docs/settings.md's table: python -m torch_xla_core.config --markdown):\n" + "\n".join(reads))


def test_caller_variables_are_read_only_for_torch_xlas_utils(monkeypatch):
    """config.caller_variable reads a variable no setting declares: only
    compat's xu.getenv_as / check_env_flag may (a script's own variables)."""
    callers = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in sorted(PKG.rglob("*.py"))
               for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Attribute) and n.attr == "caller_variable"]
    assert [c.rpartition(":")[0] for c in callers] == ["torch_xla_core/compat/torch_xla/utils/utils.py"] * 2, callers
    monkeypatch.setenv("SOME_SCRIPT_FLAG", "3")
    monkeypatch.delenv("SOME_UNSET_FLAG", raising=False)
    assert config.caller_variable("SOME_SCRIPT_FLAG") == "3"
    assert config.caller_variable("SOME_UNSET_FLAG") is None and config.caller_variable("SOME_UNSET_FLAG", "x") == "x"


def test_exported_sets_declared_variables_and_puts_back_what_was_there(monkeypatch):
    monkeypatch.setenv("TXC_COORDINATOR", "10.0.0.1:1")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with config.exported({"TXC_COORDINATOR": "127.0.0.1:2", "GLOO_SOCKET_IFNAME": "lo"}):
        assert (os.environ["TXC_COORDINATOR"], os.environ["GLOO_SOCKET_IFNAME"]) == ("127.0.0.1:2", "lo")
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['GLOO_SOCKET_IFNAME'])"],
                               capture_output=True, text=True, timeout=60)
        assert child.stdout.strip() == "lo"  # children inherit them
    assert os.environ["TXC_COORDINATOR"] == "10.0.0.1:1" and "GLOO_SOCKET_IFNAME" not in os.environ
    with pytest.raises(RuntimeError, match="boom"), config.exported({"GLOO_SOCKET_IFNAME": "eth0"}):
        raise RuntimeError("boom")
    assert "GLOO_SOCKET_IFNAME" not in os.environ  # put back on an error too
    with pytest.raises(KeyError, match="TXC_NOPE is not a torch_xla_core setting"):
        with config.exported({"TXC_NOPE": "1"}):
            pass


def test_the_launchers_variables_are_read_through_config(monkeypatch):
    """cluster.detect reads torchrun's, a PyTorchJob's and srun's variables
    through config, an empty one counting as set (as `name in os.environ`
    did), and still names the launcher in its errors."""
    from torch_xla_core._runtime import cluster
    for name in ("TXC_NUM_PROCESSES", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert cluster.detect() is None
    for k, v in dict(WORLD_SIZE="4", RANK="1", MASTER_ADDR="10.0.0.5", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    job = cluster.detect()
    assert (job.launcher, job.num_processes, job.process_id, job.local_rank, job.local_size) == (
        "pytorchjob", 4, 1, 0, 1)
    assert job.master == ("10.0.0.5", 29500) and job.spans_machines
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "")  # set, though empty: torchrun's
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    job = cluster.detect()
    assert (job.launcher, job.local_size, job.spans_machines) == ("torchrun", 4, False)
    monkeypatch.setenv("LOCAL_RANK", "")
    with pytest.raises(cluster.LaunchError, match="LOCAL_RANK='' is not an integer; torchrun sets it"):
        cluster.detect()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("MASTER_PORT", "")
    with pytest.raises(cluster.LaunchError, match="MASTER_PORT not"):
        cluster.detect()
    assert config.get("MASTER_PORT", {"MASTER_PORT": ""}) == "" and config.is_set("RANK", {"RANK": ""})


def test_xla_flags_and_legacy_flags_are_read_through_config(monkeypatch):
    monkeypatch.setattr(runtime, "_flags", None)  # (the backend's flags, fixed once it started)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true --xla_dump_to=/tmp/d")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")
    assert runtime.compiler_flags() == "XLA_FLAGS=--xla_cpu_enable_fast_math=true"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_x=1")
    assert runtime.compiler_flags() == "XLA_FLAGS=--xla_cpu_enable_fast_math=true;LIBTPU_INIT_ARGS=--xla_tpu_x=1"
    assert [config.get("XLA_USE_BF16", {"XLA_USE_BF16": v}) for v in ("", "0", "1", "true")] == [None, "0", "1",
                                                                                                "true"]
    code = ("import warnings, torch_xla_core\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    for raw, warns in (("0", False), ("", False), ("yes", True)):
        p = subprocess.run([sys.executable, "-W", "always::FutureWarning", "-c", code], capture_output=True,
                           text=True, timeout=300, env=dict(env, XLA_USE_32BIT_LONG=raw))
        assert p.returncode == 0, p.stderr
        assert ("XLA_USE_32BIT_LONG is set but torch_xla_core ignores it" in p.stderr) == warns, (raw, p.stderr)


def test_every_txc_variable_the_package_names_is_declared():
    named = {}
    for path in sorted(PKG.rglob("*.py")):
        for name in re.findall(r"\bTXC_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {n: p for n, p in named.items() if n not in config.SETTINGS}
    assert not unknown, f"named in the package but not declared in torch_xla_core/config.py: {unknown}"
    assert len(named) >= 20  # the scan sees the package

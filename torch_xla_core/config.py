"""Every setting torch_xla_core reads from the environment, declared once:
the TXC_* variables, PJRT_DEVICE, the launchers' variables (torchrun's,
srun's, a PyTorchJob's: read to join the job's processes), XLA's own flags
(XLA_FLAGS, LIBTPU_INIT_ARGS: read for the compile cache's key) and
torch_xla's legacy dtype flags (read to warn that they are ignored), each with its type,
default, allowed values and a one-line doc. Code reads a setting with get(name) at the moment
it needs it: each call reads os.environ (nothing is cached here), so a test
that monkeypatches the environment, or a script that sets a variable before
the first xla op, is seen as before. Where a module read a setting once (the
CPU device count when the runtime starts, TXC_AUTOGRAD_THREADS at import),
it still reads it once.

Parsing is the same for every setting of a type: an empty value counts as
unset (TXC_COMPILE_CACHE excepted: there "" turns the cache off, as
documented); bool takes 1/0, true/false, yes/no, on/off (any case); a bad value raises
SettingError (a ValueError) naming the variable, the value and what it
takes, at the read that meets it (never a silent fall back to the default).

    txc.config.settings()         # name -> effective value
    print(txc.config.report())    # the same as a table, with where each came from
    python -m torch_xla_core.config [--markdown]

docs/settings.md's settings table is markdown_table() (tests/test_config.py keeps
them equal), and it finds any other module of the package reading
os.environ itself. Writes are not reads: the launchers write their
workers' variables into os.environ (launch.py through exported(), which
puts them back). compat's xu.getenv_as reads variables a script names,
none of the package's: caller_variable(). This module imports only the
standard library, so every module of the package may import it."""
import contextlib
import dataclasses
import os
import sys
import warnings

# (exported and caller_variable are for the package's own modules: not in txc.config's API)
__all__ = ["Setting", "SettingError", "SETTINGS", "get", "is_set", "require", "settings", "report",
           "markdown_table"]

# `python -m torch_xla_core.config`: the package has imported this module (txc.config) before runpy runs
# it again as __main__, which runpy warns about; the second copy only prints the report.
warnings.filterwarnings("ignore", message=r"'torch_xla_core\.config' found in sys\.modules", category=RuntimeWarning)


class SettingError(ValueError):
    """A setting's value that its type does not take (names the variable)."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment setting. kind: "bool", "int", "float", "str",
    "choice" (one of choices), "flags" (comma-separated subset of choices)
    or "path" (expanded with ~; for off, values that mean "none"). default:
    the value when unset, or a function of the environment mapping that
    computes it (shown as default_doc)."""
    name: str
    kind: str
    default: object
    doc: str
    choices: tuple = ()
    minimum: float | None = None       # inclusive, for int and float
    positive: bool = False             # float: > 0
    fold_case: bool = False            # choice: matched case-insensitively, returned as declared
    aliases: tuple = ()                # choice: (alias, choice) pairs, e.g. GPU for CUDA
    off: tuple = ()                    # path: values (lower-cased) that turn it off (get returns None)
    empty_is_unset: bool = True
    default_doc: str | None = None     # the default in words, where it is computed or None
    takes: str | None = None           # str: what it takes, in words

    def allowed(self) -> str:
        """What the setting takes, in words (errors and the tables say it)."""
        if self.kind == "bool":
            return "1/0, true/false, yes/no, on/off"
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            if self.positive:
                return what + " > 0"
            return what if self.minimum is None else f"{what} >= {self.minimum:g}"
        if self.kind == "choice":
            also = "".join(f" ({a} = {c})" for a, c in self.aliases)
            return "one of " + ", ".join(self.choices) + also
        if self.kind == "flags":
            return "comma-separated flags: " + ", ".join(self.choices)
        if self.kind == "path":
            return "a directory" + (f", or {self.off[0]}" if self.off else "")
        return self.takes or "a string"

    def _bad(self, raw, problem):
        return SettingError(f"{self.name}={raw!r} {problem}: set it to {self.allowed()}, or unset it for the "
                            f"default ({self.name}: {self.doc})")

    def parse(self, raw: str):
        """The value of raw (a set, non-empty string) for this setting."""
        k = self.kind
        if k == "bool":
            v = raw.strip().lower()
            if v in _TRUE:
                return True
            if v in _FALSE:
                return False
            raise self._bad(raw, "is not a boolean")
        if k in ("int", "float"):
            try:
                v = int(raw) if k == "int" else float(raw)
            except ValueError:
                raise self._bad(raw, "is not an integer" if k == "int" else "is not a number") from None
            if (self.positive and not v > 0) or (self.minimum is not None and v < self.minimum):
                raise self._bad(raw, "is out of range")
            return v
        if k == "choice":
            v = raw.strip().upper() if self.fold_case else raw
            v = dict(self.aliases).get(v, v)
            if v not in self.choices:
                raise SettingError(f"{self.name} must be one of {self.allowed()[len('one of '):]}; got {raw!r} "
                                   f"({self.doc})")
            return v
        if k == "flags":
            v = frozenset(f.strip() for f in raw.split(",") if f.strip())
            unknown = sorted(v - set(self.choices))
            if unknown:
                raise self._bad(raw, f"names {', '.join(map(repr, unknown))}, which is not a known flag")
            return v
        if k == "path":
            if raw.strip().lower() in self.off:
                return None
            return os.path.expanduser(raw)
        return raw


def _cache_dir(env):
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_xla_core")


_LAUNCH = "set by torch_xla_core.launch"
_DECLARED = [
    # devices and the runtime
    Setting("PJRT_DEVICE", "choice", None, "the PJRT platform; unset: the best jax has (TPU, CUDA, then CPU)",
            choices=("CPU", "CUDA", "TPU"), aliases=(("GPU", "CUDA"),), fold_case=True, default_doc="best available"),
    Setting("TXC_NUM_CPU_DEVICES", "int", None, "CPU xla devices (xla:0 .. xla:N-1), read when the runtime starts "
            "(the first xla op)", minimum=1, default_doc="jax's (1)"),
    Setting("TXC_AUTOGRAD_THREADS", "bool", False, "1 keeps torch's autograd device threads (by default the "
            "backward runs on the calling thread; read at import)"),
    Setting("TXC_UNSUPPORTED_TORCH", "bool", False, "1 imports under a torch outside the supported range, with a "
            "warning (read at import)"),
    # compiling and running graphs
    Setting("TXC_COMPILE_CACHE_SIZE", "int", 1024, "compiled graphs kept in memory (least recently used evicted)",
            minimum=1),
    Setting("TXC_COMPILE_CACHE", "path", _cache_dir, "the persistent compile cache's directory (created 0700; one "
            "others can write is ignored with a warning); off (or 0, none, false, empty) turns it off",
            off=("off", "0", "none", "false", ""), empty_is_unset=False,
            default_doc="`$XDG_CACHE_HOME/torch_xla_core` (`~/.cache/torch_xla_core`)"),
    Setting("TXC_COMPILE_CACHE_MAX_BYTES", "int", 4 << 30, "the persistent compile cache's size bound in bytes "
            "(least recently used entries go)", minimum=1, default_doc="4 GiB"),
    Setting("TXC_COMPILE_PROGRESS", "float", 2.0, "seconds a compile runs before a progress line shows on stderr; "
            "0 turns it off", minimum=0),
    Setting("TXC_DONATE", "bool", True, "0 turns buffer donation off (by default a step's old parameters and "
            "optimizer state are overwritten in place when nothing else reads them)"),
    Setting("TXC_FUSE_GRAPHS", "bool", True, "0 launches each torch.compile graph's replay at once; by default a "
            "graph whose outputs only the next graph reads waits and runs fused with it, one launch "
            "(torch_xla_core/_execution/pending.py)"),
    Setting("TXC_REPLAY", "bool", True, "0 makes txc.compile trace every call instead of replaying (same "
            "numerics; for comparison)"),
    # debugging
    Setting("TXC_DUMP_DIR", "path", None, "a directory every compiled graph's StableHLO is written to"),
    Setting("TXC_DEBUG", "flags", frozenset(), "recompiles: explain each recompile on stderr (as "
            "txc.debug.explain_recompiles())", choices=("recompiles",), default_doc="none"),
    Setting("TXC_RECOMPILE_LIMIT", "int", None, "compiles allowed at one call site; one more raises "
            "RecompileLimitError", minimum=0, default_doc="no limit"),
    # kernels
    Setting("TXC_SDPA_KERNEL", "choice", "auto", "where F.scaled_dot_product_attention goes (auto: flash kernels "
            "where they pay; txc.kernels.set_sdpa_kernel overrides)", choices=("auto", "flash", "cudnn", "xla")),
    Setting("TXC_PAGED_ATTENTION_IMPL", "choice", None, "multi_queries_paged_attention's implementation when "
            "impl= is not given", choices=("pallas", "xla"), default_doc="pallas on TPU, else xla"),
    Setting("TXC_GROUPED_MATMUL_IMPL", "choice", None, "grouped_matmul's implementation when impl= is not given",
            choices=("megablox", "ragged_dot"), default_doc="megablox on TPU, else ragged_dot"),
    # processes (torchrun, torch_xla_core.launch, srun, a PyTorchJob, or by hand: torch_xla_core/_runtime/cluster.py)
    Setting("TXC_DISTRIBUTED_TIMEOUT", "float", 60.0, "seconds: joining jax's distributed runtime (meeting the "
            "other processes), and its heartbeat", positive=True),
    Setting("TXC_COLLECTIVE_TIMEOUT", "float", lambda env: get("TXC_DISTRIBUTED_TIMEOUT", env),
            "seconds a collective step waits for every process", positive=True,
            default_doc="TXC_DISTRIBUTED_TIMEOUT (60)"),
    Setting("TXC_COORDINATOR_BIND", "str", None, "where process 0's coordination service listens (e.g. [::]:1234 "
            "for every interface)", default_doc="the coordinator's address", takes="host:port"),
    Setting("TXC_GLOO_HOSTNAME", "str", None, "the address gloo's CPU collectives listen on", takes="an address",
            default_doc="127.0.0.1 for a loopback coordinator, else gloo's"),
    Setting("TXC_NUM_PROCESSES", "int", 1, f"processes in the job, set by hand (torchrun's, srun's or a "
            f"PyTorchJob's environment needs none)", minimum=1),
    Setting("TXC_PROCESS_ID", "int", None, "this process's rank, 0 .. TXC_NUM_PROCESSES-1 (by hand)", minimum=0),
    Setting("TXC_LOCAL_RANK", "int", 0, "this process's rank on its machine (by hand)", minimum=0),
    Setting("TXC_COORDINATOR", "str", None, f"the address of jax's coordination service (by hand, or {_LAUNCH}; "
            f"under torchrun process 0 publishes it through torch's store)", takes="host:port"),
    Setting("TXC_COORDINATOR_HOSTED", "bool", False, f"1: the launcher hosts the coordination service, process 0 "
            f"starts none ({_LAUNCH})"),
    # the launchers' variables (torchrun, srun, a Kubeflow PyTorchJob, gloo): they set them for each process, the
    # package only reads them (_runtime/cluster.py: which launcher started this process and where its processes
    # meet). Read as set, an empty value included (cluster.py parses and checks them, naming the launcher)
    *(Setting(name, "str", None, doc, takes=takes, empty_is_unset=False) for name, takes, doc in (
        ("WORLD_SIZE", "an integer", "processes in the job (set by torchrun, torch_xla_core.launch or a "
         "PyTorchJob)"),
        ("RANK", "an integer", "this process's rank in the job (set with WORLD_SIZE)"),
        ("LOCAL_RANK", "an integer", "this process's rank on its machine (set by torchrun; unset: 0)"),
        ("LOCAL_WORLD_SIZE", "an integer", "processes on this machine (set by torchrun; unset: 1)"),
        ("MASTER_ADDR", "a host", "where torch's TCPStore listens: the job's processes meet there (set with "
         "WORLD_SIZE)"),
        ("MASTER_PORT", "an integer", "the port of torch's TCPStore (set with MASTER_ADDR)"),
        ("TORCHELASTIC_RUN_ID", "a string", "set by torchrun: tells its workers from a PyTorchJob's"),
        ("TORCHELASTIC_RESTART_COUNT", "an integer", "torchrun's restart round: keys in torch's store are per "
         "round from round 1 on"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True or False", "True: torch's store is torchrun's agent's (or process "
         "0's in a PyTorchJob, which torch_xla_core sets), init_process_group's keys are then per round"),
        ("TORCHELASTIC_ERROR_FILE", "a file", "set by torchrun for each worker: a worker that ends because a "
         "peer was lost records it there"),
        ("SLURM_NTASKS", "an integer", "processes in an srun step"),
        ("SLURM_PROCID", "an integer", "this process's rank in an srun step"),
        ("SLURM_LOCALID", "an integer", "this process's rank on its node in an srun step"),
        ("SLURM_STEP_NUM_NODES", "an integer", "nodes of an srun step (unset: 1; one node binds loopback)"),
        ("JAX_COORDINATOR_PORT", "an integer", "jax's: the coordinator's port under srun (unset: "
         "SLURM_JOB_ID % 4096 + 61440)"),
        ("GLOO_SOCKET_IFNAME", "an interface", "gloo's network interface; torch_xla_core.launch sets lo for its "
         "workers when unset"),
    )),
    # XLA's own flags: XLA and libtpu read them when their first client starts; the package reads them for the
    # persistent compile cache's key (runtime.compiler_flags: those that change the code XLA emits)
    Setting("XLA_FLAGS", "str", None, "XLA's flags (XLA reads them when the runtime starts); those that change the "
            "emitted code are part of the persistent compile cache's key", takes="space-separated --xla_* flags"),
    Setting("LIBTPU_INIT_ARGS", "str", None, "libtpu's flags (libtpu reads them when the runtime starts); part of "
            "the persistent compile cache's key, as XLA_FLAGS", takes="space-separated --xla_* flags"),
    # torch_xla's global dtype flags (deprecated there in 2.6): ignored, with a FutureWarning at import
    *(Setting(name, "str", None, f"torch_xla's {what}: ignored (tensors keep their dtypes); any value but 0 warns "
              f"at import with what to do instead", takes="ignored")
      for name, what in (("XLA_USE_BF16", "float -> bfloat16 flag"), ("XLA_DOWNCAST_BF16", "float -> bfloat16 flag"),
                         ("XLA_USE_FP16", "float -> float16 flag"), ("XLA_USE_32BIT_LONG", "int64 -> int32 flag"))),
]
_SETTINGS = {s.name: s for s in _DECLARED}
assert len(_SETTINGS) == len(_DECLARED), "a setting declared twice"
SETTINGS = _SETTINGS  # name -> Setting, in declaration order


def _setting(name):
    try:
        return _SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a torch_xla_core setting (declared in torch_xla_core/config.py: "
                       f"{', '.join(_SETTINGS)})") from None


def get(name: str, env=None):
    """The effective value of setting `name`, read from env (default
    os.environ) now: the parsed value, or the default when unset."""
    s = _SETTINGS[name] if name in _SETTINGS else _setting(name)
    e = os.environ if env is None else env
    raw = e.get(name)
    if raw is None or (raw == "" and s.empty_is_unset):
        d = s.default
        return d(e) if callable(d) else d
    return s.parse(raw)


def is_set(name: str, env=None) -> bool:
    """Whether `name` is set (to a value that is not the empty 'unset')."""
    s = _setting(name)
    raw = (os.environ if env is None else env).get(name)
    return raw is not None and not (raw == "" and s.empty_is_unset)


def require(name: str, env=None, why: str = ""):
    """get(name), raising SettingError when it is unset and has no default."""
    v = get(name, env)
    if v is None:
        s = _SETTINGS[name]
        raise SettingError(f"{name} is not set{' (' + why + ')' if why else ''}: set it to {s.allowed()} "
                           f"({name}: {s.doc})")
    return v


@contextlib.contextmanager
def exported(values: dict):
    """Sets the declared variables `values` (name -> str) in os.environ for
    the block, for the child processes it starts (they inherit it), and puts
    back what was there on exit (torch_xla_core.launch for torchrun's workers)."""
    for name in values:
        _setting(name)
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, raw in saved.items():
            if raw is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = raw


def caller_variable(name: str, default: str | None = None) -> str | None:
    """The raw value of a variable the caller names, which is none of the
    package's settings: torch_xla's xu.getenv_as / check_env_flag (compat)
    read a script's own variables by the names it passes. The package's
    own reads are declared above and go through get()."""
    return os.environ.get(name, default)


def settings(env=None) -> dict:
    """name -> effective value of every setting (raises on a bad value)."""
    return {name: get(name, env) for name in _SETTINGS}


def _show(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, frozenset):
        return ",".join(sorted(v)) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return "-" if v is None else str(v)


def report(env=None) -> str:
    """A table of every setting: its effective value, whether the
    environment set it, and its doc. A bad value shows as such (report()
    does not raise: it is what to look at when a read did)."""
    env = os.environ if env is None else env
    rows = []
    for s in _DECLARED:
        try:
            v = _show(get(s.name, env))
        except SettingError:
            v = f"BAD {env.get(s.name)!r}"
        rows.append((s.name, v, "set" if is_set(s.name, env) else "default", s.doc))
    w0, w1 = max(len(r[0]) for r in rows), min(max(len(r[1]) for r in rows), 40)
    lines = [f"{'setting':<{w0}}  {'value':<{w1}}  {'from':<7}  doc"]
    lines += [f"{n:<{w0}}  {v:<{w1}}  {src:<7}  {doc}" for n, v, src, doc in rows]
    return "\n".join(lines)


def _md_default(s: Setting) -> str:
    if s.default_doc is not None:
        return s.default_doc
    return "unset" if s.default is None else f"`{_show(s.default)}`"


def markdown_table() -> str:
    """docs/settings.md's settings table (tests/test_config.py and the docs build keep it equal to this)."""
    lines = ["| Variable | Takes | Default | What it does |", "|---|---|---|---|"]
    for s in _DECLARED:
        doc = s.doc.replace("|", "\\|")
        lines.append(f"| `{s.name}` | {s.allowed()} | {_md_default(s)} | {doc} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--markdown"]):
        print("usage: python -m torch_xla_core.config [--markdown]", file=sys.stderr)
        return 2
    print(markdown_table() if argv else report())
    return 0


if __name__ == "__main__":
    sys.exit(main())

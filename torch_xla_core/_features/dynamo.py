"""torch.compile(model, backend="torch_xla_core"): the dynamo route.

Dynamo guards the Python side (shapes, dtypes, module attributes, globals)
and hands over FX graphs; we turn each graph into one of our graphs and one
executable, and later calls only bind buffers and execute:

- `backend` is torch's aot_autograd with our compiler for the forward, the
  backward and inference graphs (aten graphs, functionalized: parameters
  and buffers are graph inputs, input mutations are explicit). Each graph
  becomes a replay.Compiled: its first call runs the aten graph on the xla
  tensors through our lazy tracing and records the sync (executable, which
  input is which graph parameter, where each output goes); later calls
  bind the new input buffers and execute through executor.run_recorded,
  without running the graph's Python ops. In-place mutation of inputs
  (kept in inference graphs, keep_inference_input_mutations) is written
  back to the inputs; outputs that alias inputs are re-made as views of the
  new inputs; non-tensor outputs are returned as recorded; a graph with no
  xla op just returns its inputs/views. Draws from the xla RNG (dropout)
  are inside the recorded graph with the RNG state as input and output, so
  every call draws fresh numbers exactly as tracing each call would.
- Before its first call a graph is prepared (_prepare): constants it moves
  to the device (torch.tensor(data, device="xla") in the model) are
  uploaded once and become inputs, and aten.view becomes aten.reshape (our
  tensors' strides may differ from what the meta kernels said; the graph is
  functional, so a copy of the same values is equivalent). Parameters among
  its inputs that Module.to left as lone views of their storages get
  storages of their own then (_own_parameters), as txc.compile's recording
  gives them: later steps bind them without rebuilding view chains.
- No sync inside a step: a graph's call launches its executable once.
  Inputs that traced ops left pending are not synced first where that can
  be avoided: autograd's zero tangents and ones_like seeds (values made from
  attributes alone, _constants) are built inside the recorded graph
  (guarded by their node hash), a 0-d number (an lr a scheduler filled,
  autograd's seed of a loss) becomes that number's device buffer before the
  replay (replay/_recording.py number_to_data), and views (the forward's
  saved views of its outputs) are read through their chains.
  Anything else pending (clip_grad_norm_'s scaled grads) is launched first
  without waiting. Deferred checks are left to the user's sync or value
  read (replay.Compiled's inner).
- Two graphs, one launch: a graph whose replay only writes its outputs
  (the forward) leaves its launch pending, its outputs' tensors holding
  placeholders, and the next graph whose inputs they are (the backward)
  runs one executable of both (_execution/pending.py; TXC_FUSE_GRAPHS=0
  turns it off). Anything else reading those outputs launches the forward
  alone first, and the chain holds up to three graphs. A training step
  then launches once with a compiled opt.step (forward, backward and
  optimizer together) or a whole step under compiled autograd, and twice
  with an eager optimizer (forward and backward together, then its per-op
  graph at the user's sync).
- torch.compile(opt.step): an Adam-family optimizer over xla parameters
  gets capturable=True and a device lr before dynamo traces it (as
  txc.compile does), so its graph replays and an LR scheduler stepping
  between calls needs no new graph. A whole step compiled with
  torch._dynamo.config.compiled_autograd: dynamo (torch 2.11-2.15) breaks
  the frame at .backward(), so the forward, compiled autograd's backward
  and the optimizer come as a graph each, and each replays.
- What replay refuses (a graph that reads a value on the host, uploads
  host data, or has CPU tensors among its inputs, e.g. the CPU step counts
  of an optimizer that cannot move them) is traced on every call instead,
  with a warning once (docs/replay.md lists the cases). A graph
  whose inputs are all CPU tensors just runs, untouched.
- Metrics: "dynamo_graph" (graphs handed over), and replay's "replay",
  "replay_record", "replay_trace", "replay_refused" per graph call.
  dynamo.WAIT = True makes each graph call block until the device is done
  (the "execute" timer then holds the device time, as benchmarks want).
- Graph breaks are dynamo's: the code between graphs runs eagerly on our
  lazy tracing, and each graph is compiled as above.
- Shapes: each dynamo graph is specialized to its input shapes. With
  torch.compile(dynamic=False) a new shape is a dynamo recompile, hence a
  new graph of ours (counted: metrics "dynamo_graph", "compile"); with the
  default automatic dynamic shapes, dynamo may hand over one graph with
  symbolic sizes after a shape change, and our side still compiles once
  per concrete shape (the sizes are Python ints in the replay signature).

Making our tensors traceable: dynamo treats a tensor whose class defines
its own __torch_dispatch__ as an opaque object unless it is a traceable
wrapper subclass. Our XlaTensor is a plain tensor as far as dynamo and
aot_autograd need (fake tensors of device xla stand in for it while
tracing), so make_traceable() tells dynamo's VariableBuilder to wrap it as
a tensor and aot_autograd to accept it where it expects a plain tensor
(runtime tangents). It is installed when torch._dynamo is imported after
torch_xla_core (a post-import hook from __init__), when this module is
imported, or when torch loads the backend through the
`torch_dynamo_backends` entry point (pyproject.toml).

Names: "torch_xla_core", and "openxla" (torch_xla's spelling) when torch
has no backend of that name (torch 2.13 registers its own "openxla", which
needs torch_xla; it is left alone)."""
import importlib.abc
import importlib.util
import sys
import warnings

import torch

from .. import _C, metrics, replay
from .._runtime import torch_compat as _compat
from ..replay._recording import number_to_data, own_storage
from .._tracing.tensor import XlaTensor

__all__ = ["backend", "install", "make_traceable", "NAME"]

NAME = "torch_xla_core"
WAIT = False  # True: each graph's call blocks until the device is done (benchmarks time "execute" so)
_traceable = False


def make_traceable() -> None:
    """Lets dynamo and aot_autograd trace XlaTensors as plain tensors (see the
    module docstring). Idempotent."""
    global _traceable
    if _traceable:
        return
    _compat.add_missing_meta_kernels()  # torch 2.11: SDPA's backward had none (aot_autograd's fake backward)
    # lazy: torch._dynamo costs 1-2 s to import: only once torch.compile is used (install_hook)
    from torch._dynamo.variables import builder
    vb = builder.VariableBuilder

    for trace_numpy in (False, True):  # the exact-type table (cached per config.trace_numpy)
        vb._type_dispatch_impl(trace_numpy)[XlaTensor] = vb.wrap_tensor
    infer = builder.infer_subclass_type
    if not getattr(infer, "_txc", False):
        def infer_subclass_type(value):
            return None if type(value) is XlaTensor else infer(value)
        infer_subclass_type._txc = True
        builder.infer_subclass_type = infer_subclass_type

    # Fake tensor mode: an XlaTensor met while tracing (torch.tensor(...,
    # device="xla") made inside the compiled region) is a real tensor to be
    # made fake, not a subclass to hand the op to.
    from torch._subclasses import fake_tensor  # lazy: with dynamo, as above
    is_subclass = fake_tensor._check_for_subclass_arg
    if not getattr(is_subclass, "_txc", False):
        def _check_for_subclass_arg(x):
            return type(x) is not XlaTensor and is_subclass(x)
        _check_for_subclass_arg._txc = True
        fake_tensor._check_for_subclass_arg = _check_for_subclass_arg

    # torch.tensor(data, device="xla") under fake tensor mode: made on the CPU
    # and moved as a fake tensor (what torch does when no accelerator needs
    # initializing; our PrivateUse1 device needs none, so it does not count).
    # A trace that holds xla tensors does so even where CUDA is available
    # (the mode's _txc_xla, set as it fakes an xla tensor): else torch made
    # the constant a real xla tensor and lift_fresh refused it ("Please
    # convert all Tensors to FakeTensors first", torch 2.11 on an H200).
    from_tensor = fake_tensor.FakeTensorMode.from_tensor
    if not getattr(from_tensor, "_txc", False):
        def from_xla_tensor(self, tensor, *args, **kwargs):
            if tensor.device.type == "xla":
                self._txc_xla = True  # this mode makes xla fakes: avoid_device_init below
            return from_tensor(self, tensor, *args, **kwargs)
        from_xla_tensor._txc = True
        fake_tensor.FakeTensorMode.from_tensor = from_xla_tensor
    init = fake_tensor.FakeTensorMode.avoid_device_init
    if not getattr(init.fget, "_txc", False):
        def avoid_device_init(self):
            return init.fget(self) or getattr(self, "_txc_xla", False) or not _accelerator_available()
        avoid_device_init._txc = True
        fake_tensor.FakeTensorMode.avoid_device_init = property(avoid_device_init)

    # torch.compile(opt.step): an Adam-family optimizer over xla parameters
    # gets its step counts and lr on the device before dynamo traces it, as
    # txc.compile does (replay.lift_optimizer): with CPU step counts its graph cannot
    # replay, and a Python lr is baked into the graph (a scheduler's every
    # new value a new graph); dynamo itself does this only for CUDA/XPU.
    from torch._dynamo.variables import optimizer as dynamo_optimizer  # lazy: with dynamo, as above
    opt_var = dynamo_optimizer.OptimizerVariable
    if not getattr(opt_var.__init__, "_txc", False):
        opt_init = opt_var.__init__

        def __init__(self, value, *args, **kwargs):
            if all(type(p) is XlaTensor for g in value.param_groups for p in g["params"]):
                replay.lift_optimizer(value)
            opt_init(self, value, *args, **kwargs)
        __init__._txc = True
        opt_var.__init__ = __init__

    # aot_autograd compiles against fake tensors of type torch.Tensor; at run
    # time the tangents are XlaTensors: the same tensor as far as it goes.
    def coerce(self, expected_metadata, expected_type=None):
        return self
    XlaTensor.__coerce_same_metadata_as_tangent__ = coerce
    _traceable = True


def _accelerator_available() -> bool:
    """Whether torch has an accelerator of its own that fake tensor mode
    would initialize (CUDA, XPU, HPU)."""
    return torch.cuda.is_available() or torch.xpu.is_available() or (
        hasattr(torch, "hpu") and torch.hpu.is_available())


_aten = torch.ops.aten


def _prepare(gm):
    """Rewrites an aot_autograd graph for replay; returns the tensors to pass
    after the graph's own arguments:
    - a constant moved to the device (torch.tensor(data, device="xla") in
      the model: get_attr CPU data -> ... -> _to_copy(device=xla)), and a
      device tensor held as a graph attribute, become extra inputs, uploaded
      once: replay binds inputs, it does not upload;
    - aten.view becomes aten.reshape: the graph is functional, and a view
      that fake tensors allowed may not fit our tensors' strides (an op whose
      xla result is laid out otherwise than its meta kernel says, e.g. SDPA);
      reshape is then a copy of the same values."""
    g = gm.graph
    consts = {}   # node -> its constant value (CPU)
    extra = []    # (node, tensor) to become inputs

    def value(a):
        return consts[a] if isinstance(a, torch.fx.Node) else a

    for n in list(g.nodes):
        if n.op == "get_attr":
            v = getattr(gm, n.target, None)
            if isinstance(v, XlaTensor):
                extra.append((n, v))
            elif isinstance(v, torch.Tensor) and v.device.type == "cpu":
                consts[n] = v
        elif n.op == "call_function" and n.target is _aten.view.default:
            n.target = _aten.reshape.default
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            nodes = n.all_input_nodes
            if not nodes or any(a not in consts for a in nodes):
                continue
            args, kwargs = torch.fx.node.map_aggregate((n.args, n.kwargs), value)
            out = n.target(*args, **kwargs)
            if isinstance(out, XlaTensor):
                extra.append((n, out))
            elif isinstance(out, torch.Tensor) and out.device.type == "cpu":
                consts[n] = out
    if extra:
        first = next(n for n in g.nodes if n.op != "placeholder")
        for k, (n, _) in enumerate(extra):
            with g.inserting_before(first):
                ph = g.placeholder(f"txc_const_{k}")
            ph.meta.update(n.meta)
            n.replace_all_uses_with(ph)
        g.eliminate_dead_code()
    gm.recompile()
    return tuple(t for _, t in extra)


class _FxCall:
    """Calls an FX graph module with its uploaded constants (a callable
    without __code__: replay.Compiled then guards only its arguments, not
    the graph's globals). made: the inputs built inside the graph
    (_constants), as ((index, node hash), ...): guarded by value, rebuilt
    from self.making ({index: (op, attrs)}) when the graph is traced."""

    def __init__(self, gm, kind):
        self.gm = gm
        self.consts = _prepare(gm)
        self.making = {}
        self.written = _written_inputs(gm)
        self.written_slots = sorted(self.written)
        self.__qualname__ = self.__name__ = f"torch.compile {kind} graph"

    def __call__(self, made, *args):
        if made:
            args = list(args)
            for i, _ in made:  # (in index order)
                op, attrs = self.making[i]
                args.insert(i, _C.op(op, (), attrs))
        return self.gm(*args)


def _written_inputs(gm) -> frozenset:
    """The indices of the graph's inputs that it writes in place (with
    keep_inference_input_mutations, aot_autograd's copy_ into an input: an
    optimizer's state and step counts)."""
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    written = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            for a, arg in zip(n.target._schema.arguments, n.args):
                if a.alias_info is not None and a.alias_info.is_write and arg in index:
                    written.add(index[arg])
    return frozenset(written)


def _constants(a, written):
    """The inputs among `a` that are pending values made from attributes
    alone, of one or more dimensions (autograd's zero tangents of outputs
    that got no gradient, torch.ones_like seeds): ((index, node hash), ...)
    and {index: (op, attrs)}. A replay builds them inside its graph instead
    of syncing them first (a launch of their own). Not the inputs the graph
    writes (`written`: an optimizer's new zero state): the write must reach
    the caller's tensor. A 0-d one made from a number (autograd's seed of a
    loss, an lr that a scheduler filled) becomes that number's buffer here
    (replay/_recording.py number_to_data; its value is not guarded), so that
    the replay finds every input ready in one C++ pass (_C.replay_ready)
    instead of looking at each in Python."""
    unready = _C.replay_unready(a, XlaTensor, True)  # (one C++ pass; usually none: every input device data or
    if not unready:                                   # a view of some)
        return (), {}
    made, making = [], {}
    for i in unready:
        if i not in written:
            lt = a[i]._lt
            if lt.shape:
                c = lt.constant
                if c is not None:
                    made.append((i, lt.hash))
                    making[i] = c
            elif not lt.is_view:
                number_to_data(lt)
    return tuple(made), making


class _Graph:
    """One FX graph from aot_autograd (boxed calling convention: one list of
    arguments, which is cleared so that saved tensors can be freed early)."""

    def __init__(self, gm, kind):
        self._boxed_call = True  # functorch's marker of a boxed function (in __dict__: wrappers copy it)
        self._gm, self._kind = gm, kind
        self._fx = self._compiled = None
        self._plain = None  # True: no xla tensor among the inputs (runs as is)

    def __call__(self, args):
        a = list(args)
        if type(args) is list:
            args.clear()
        if self._plain is None:
            self._plain = not any(isinstance(x, XlaTensor) for x in a)
            if not self._plain:
                self._fx = _FxCall(self._gm, self._kind)
                self._compiled = replay.Compiled(self._fx, lift_optimizers=False, wait=WAIT, inner=True)
                _own_parameters(a)
        if self._plain:
            return self._gm(*a)
        for i in _C.replay_views(a, XlaTensor, self._fx.written_slots):  # a lone view written in place (Module.to's
            own_storage(a[i])  # parameters) gets a storage of its own, so that the replay can donate its buffer (other
                               # views are read through their chains)
        made, making = _constants(a, self._fx.written)
        if made:
            self._fx.making = making
            a = [x for i, x in enumerate(a) if i not in making]
        with torch.no_grad():  # aot_autograd's graphs are differentiated already; autograd is its wrapper's
            return self._compiled(made, *a, *self._fx.consts)


def _own_parameters(a) -> None:
    """The parameters among a graph's first call's inputs that are lone views
    (Module.to makes each an alias of its storage) get a storage of their own,
    as txc.compile's recording gives them (own_storage: nobody can tell):
    else every later step reads them through their chains, which each write
    of the optimizer rebuilds (~4 us per parameter per graph that reads it),
    and a per-op optimizer writes them through their views."""
    for x in a:
        if type(x) is XlaTensor and x.requires_grad and x.grad_fn is None and x._lt.is_view:
            own_storage(x)


def _compiler(kind):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        metrics.counter_add("dynamo_graph")
        return _Graph(gm, kind)
    compile_graph.__name__ = f"torch_xla_core_{kind}"
    return compile_graph


_aot = None


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The torch.compile backend (see the module docstring): torch's
    aot_autograd with our compiler for the forward, backward and inference
    graphs."""
    global _aot
    if _aot is None:
        # lazy: torch._dynamo costs 1-2 s to import: only once torch.compile is used (install_hook)
        from torch._dynamo.backends.common import aot_autograd
        _aot = aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                            inference_compiler=_compiler("inference"), keep_inference_input_mutations=True)
    return _aot(gm, example_inputs, **kwargs)


def install() -> None:
    """make_traceable(), and registers `backend` under NAME (and "openxla"
    when torch has no backend of that name) unless torch's registry knows the
    name already (our entry point, found by torch: it then loads `backend`
    itself). Safe right after torch._dynamo's own import: it imports nothing
    that torch._dynamo has not. Idempotent."""
    make_traceable()
    # lazy: torch._dynamo costs 1-2 s to import: only once torch.compile is used (install_hook)
    from torch._dynamo import trace_rules
    from torch._dynamo.backends import registry  # lazy: as above
    # Our own frames (op handlers, the executor) and jax's under them run under torch's dispatcher, also
    # inside the code dynamo runs eagerly after a graph break: dynamo must not compile them (it traced into
    # the data-dependent nonzero handler of wav2vec2's CTC loss, resumed it on fake values and recursed).
    for package in (__name__.partition(".")[0], "jax", "jaxlib"):  # the whole package, not only _features
        trace_rules.add(package)
    names = [NAME]
    if importlib.util.find_spec("torch._dynamo.backends.torchxla") is None:  # torch's "openxla"
        names.append("openxla")
    for name in names:
        if name not in registry._BACKENDS and name not in registry._COMPILER_FNS:
            registry.register_backend(compiler_fn=backend, name=name)


def install_hook() -> None:
    """From __init__: install() now if torch._dynamo is imported already,
    else right after it is (importing it eagerly would cost every user of
    torch_xla_core 1-2 s)."""
    if "torch._dynamo" in sys.modules:
        _install_quietly()
    elif not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())


def _install_quietly():
    try:
        install()
    except Exception as e:  # never break torch's own import: say what is missing instead
        warnings.warn(f"torch_xla_core: the torch.compile backend {NAME!r} could not be installed ({e}); "
                      f"torch.compile cannot trace xla tensors", RuntimeWarning, stacklevel=2)


class _AfterDynamoImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs install() right after torch._dynamo's own import."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._inner  # as if we had not been there
        _install_quietly()

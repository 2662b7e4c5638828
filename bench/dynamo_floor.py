"""bench/llama.py's floor rows (`dynamo:floor`, `dynamo_opt:floor`, `dynamo_step:floor`):
what torch itself costs per step on the torch.compile route, whatever the backend.

`backend` is torch's aot_autograd, as ours is, with compilers whose graphs run
once for real (through our backend's graph: outputs of the right shapes,
dtypes and devices, the first step's side effects done) and from then on
return that first call's values as new tensors (a wrapper each over the same
storage, ~1 us: the least a graph's output costs) and run nothing. A step's
host time is then torch's: dynamo's frames and guards, AOTAutograd's runtime
wrappers (with the zero tangents it makes per op for outputs that got no
gradient), the autograd engine, the optimizer's hooks, zero_grad, plus
whatever runs outside the graphs (the model-only row's per-op AdamW and its
graph at the sync). No backend can make a step cheaper than its floor
row. A diagnostic: parameters stop changing after the first step, so the
losses are not the real ones."""
from torch_xla_core._features import dynamo as _dynamo
from torch_xla_core._tracing.tensor import XlaTensor, wrap as _wrap

_aot = None


class _FirstOutputs:
    """A graph (boxed calling convention) that runs our backend's graph on its
    first call and returns that call's outputs on every later one."""

    def __init__(self, gm, kind):
        self._boxed_call = True
        self._real = _dynamo._Graph(gm, kind)
        self._out = None

    def __call__(self, args):
        if self._out is None:
            self._out = tuple(self._real(args))
        elif type(args) is list:
            args.clear()  # as a real graph does: the saved tensors can be freed
        # each call's tensors new wrappers over the first call's values (as a real graph's outputs are new
        # tensors: autograd's AccumulateGrad then takes a gradient as it is, not a copy of it)
        return [_wrap(x._lt) if type(x) is XlaTensor else x for x in self._out]


def _compiler(kind):
    def compile_graph(gm, example_inputs):
        return _FirstOutputs(gm, kind)
    return compile_graph


def backend(gm, example_inputs, **kwargs):
    """A torch.compile backend: aot_autograd with _FirstOutputs graphs."""
    global _aot
    if _aot is None:
        from torch._dynamo.backends.common import aot_autograd  # lazy: with dynamo
        _aot = aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                            inference_compiler=_compiler("inference"), keep_inference_input_mutations=True)
    return _aot(gm, example_inputs, **kwargs)


"""The reviewed list of ops that do not fully pass the bf16 training
conformance run (_bf16.py, test_opinfo_bf16.py): run "bf16" (bf16 forward
and gradients judged against float64) or "autocast" (float32 inputs under
torch.autocast("xla", dtype=torch.bfloat16)).

Each entry names the OpInfo op (name[.variant]), the run, the outcomes its
failing samples have ("error", "mismatch", "fallback"; several joined with
"+") and why. Strict as the float32 list (expected_failures.py): an op whose
set of failing outcomes differs from its entry's fails, an unexpected pass
too, and test_opinfo_bf16 checks that every entry names a real case.

An entry with `torch=(low, high)` holds on torch versions low <= v < high
only (either end None: open), where what the op or its OpInfo samples are
changed between versions; no two entries of a case overlap.

Reasons, by kind:
  unsupported   the device refuses the dtype/op by design with a clear error
  fallback      computed by a counted CPU fallback (values match)
  less accurate: ...   a real accuracy defect, with what fixing it needs
"""
from dataclasses import dataclass

import torch

KINDS = ("error", "fallback", "mismatch")
RUNS = ("bf16", "autocast")


def _version(v=torch.__version__):
    return tuple(int(p) for p in v.split("+")[0].split(".")[:2])


@dataclass(frozen=True)
class X:
    op: str
    run: str
    fails: str
    reason: str
    torch: tuple = (None, None)

    def kinds(self):
        return tuple(sorted(self.fails.split("+")))

    def holds(self, version=None):
        """Whether the entry applies to this torch (major, minor)."""
        v, (low, high) = version or _version(), self.torch
        return (low is None or v >= low) and (high is None or v < high)


EXPECTED = [
    # --- by design ---
    X('chalf', 'bf16', 'error', 'unsupported: complex32 refused with a clear TypeError (XLA has no complex type '
      'with 16-bit parts)'),
    X('matrix_exp', 'bf16', 'error', 'unsupported: linalg.matrix_exp refuses bf16 with a clear error naming the op '
      'and the dtypes it computes in (float32/float64; jax\'s expm has no bf16 path)'),
    X('nn.functional.binary_cross_entropy', 'autocast', 'error',
      'unsupported: binary_cross_entropy is banned under autocast, as on CUDA (torch\'s own error text, which names '
      'binary_cross_entropy_with_logits); CPU autocast runs it'),
    X('index_fill', 'bf16', 'fallback',
      'fallback: the gradient of a tensor fill value is torch\'s formula grad.index_select(dim, _unique(index)).sum() '
      '(derivatives.yaml): _unique has a data-dependent output shape, a counted CPU fallback'),
    X('addbmm', 'autocast', 'mismatch',
      'by design: xla\'s autocast follows CUDA\'s cast lists, which compute addbmm in bf16 (CPU\'s autocast leaves it '
      'float32): on sample 2 the inputs rounded to bf16 put it 1.44x bf16 tolerance from the float64 result of the '
      'float32 inputs, where CPU\'s float32 result is 1.14x (the bf16 computation itself rounds once: one float32 dot '
      'over batch and k, scaled and added in float32)'),
    X('addr', 'autocast', 'mismatch',
      'by design: xla\'s autocast follows CUDA\'s cast lists, which compute addr in bf16 (CPU\'s autocast leaves it '
      'float32): on sample 2 the bf16-rounded inputs cancel, 1.1x bf16 tolerance from the float64 result of the '
      'float32 inputs, where CPU\'s float32 result is 0.16x (the bf16 computation itself rounds once)'),
    # --- accuracy defects ---
    X('nn.functional.normalize', 'bf16', 'mismatch',
      'less accurate on an ill-conditioned sample: p=0.5 over a dim of size 1, so y = sign(x) and the exact gradient '
      '0 is a difference of two terms of order 1/|x|. Both sides compute torch\'s norm backward formula in bf16 ops '
      '(CPU is 3.1x bf16 tolerance off too); a one-ulp difference in an intermediate (|x|^-0.5) becomes ours -0.25, '
      '25x. The other samples pass (all 3 pass on torch 2.11, whose samples differ)', torch=((2, 12), None)),
]


def lookup(op, run):
    """The entry for an op in a run, or None."""
    hits = [x for x in EXPECTED if x.op == op and x.run == run and x.holds()]
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} expected-failure entries match {op} {run}: {hits}")
    return hits[0] if hits else None

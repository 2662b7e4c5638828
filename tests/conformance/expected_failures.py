"""The reviewed list of OpInfo cases that do not fully pass on the xla device.

Each entry names a case (OpInfo name[.variant], direction "fwd"/"bwd",
dtype or "*", mode "ci"/"full"/"all"), the outcomes its failing samples have
("error", "mismatch", "fallback"; several joined with "+") and why. The suite
is strict: a case whose set of failing outcomes differs from its entry's
(a new failure, a changed one, or an unexpected pass) fails, and so does an
entry naming an op, variant or dtype that OpInfo does not have.

Reasons, by kind:
  random        values come from a random stream: compared by shape only
  fallback      computed by a counted CPU fallback (values match): an output
                shape that depends on the data, or no XLA lowering yet
  unsupported   the device refuses the dtype/op with a clear error
  fixed in branch X   being fixed elsewhere; refreshed after that merge
  bug: ...      a real defect (mismatches are always bugs unless random)
"""
from dataclasses import dataclass

KINDS = ("error", "fallback", "mismatch")


@dataclass(frozen=True)
class X:
    op: str
    direction: str
    fails: str
    reason: str
    dtype: str = "float32"
    mode: str = "all"

    def kinds(self):
        return tuple(sorted(self.fails.split("+")))


EXPECTED = [
    # --- errors and mismatches: bugs, unsupported dtypes, work in other branches ---
    X('chalf', 'fwd', 'error', 'unsupported: complex32 refused with a clear TypeError', dtype='*'),
    X('hash_tensor', 'fwd', 'error', 'unsupported: uint64 output refused with a clear TypeError', dtype='*'),
    X('linalg.eig', 'bwd', 'error',
      'unsupported: its backward solves a complex system, and linalg.solve refuses complex inputs with a clear '
      'error naming the op (the LAPACK handlers are real-only so far)'),
    # --- data-dependent output shapes: a counted CPU fallback by design ---
    X('repeat_interleave', 'fwd', 'fallback',
      'fallback: data-dependent output shape, counted CPU fallback (repeat_interleave.Tensor)', dtype='*'),
    X('unique', 'fwd', 'fallback', 'fallback: data-dependent output shape, counted CPU fallback (_unique2)',
      dtype='*'),
    X('unique_consecutive', 'fwd', 'fallback',
      'fallback: data-dependent output shape, counted CPU fallback (unique_consecutive)', dtype='*'),
    # --- no XLA lowering yet: a counted CPU fallback (values match CPU) ---
    X('linalg.eigh', 'fwd', 'mismatch',
      'eigenvectors are unique only up to sign: jaxlib\'s LAPACK syevd returns some columns negated relative to '
      'the CPU\'s float32 LAPACK (CPU float64 agrees with xla there); eigenvalues, eigvalsh and gradients match'),
    X('linalg.ldl_factor', 'fwd', 'fallback',
      'fallback: counted CPU fallback (linalg_ldl_factor_ex): jaxlib has no LAPACK sytrf kernel, and torch\'s '
      'Bunch-Kaufman pivots are its output'),
    X('linalg.ldl_factor_ex', 'fwd', 'fallback',
      'fallback: counted CPU fallback (linalg_ldl_factor_ex): jaxlib has no LAPACK sytrf kernel'),
    X('linalg.ldl_solve', 'fwd', 'fallback',
      'fallback: counted CPU fallback (linalg_ldl_solve): jaxlib has no LAPACK sytrs kernel'),
    X('logcumsumexp', 'bwd', 'mismatch',
      'float32 ill-conditioning, not a lowering defect: the sample holds 1e4s, and torch\'s backward '
      'formula (FunctionsManual logcumsumexp_backward) subtracts and re-adds them in float32 (one ulp '
      '= 1e-3), so a one-ulp difference between XLA\'s and ATen\'s log of |grad| moves the gradient '
      'by 5e-3 > atol 1e-3. ATen\'s own float32 gradient is 2.8e-3 from the float64 one (ours 4.3e-3); '
      'the forward and the other samples match'),
    X('matrix_exp', 'fwd', 'mismatch',
      'float32 rounding: jax\'s Pade-13 and the CPU\'s Taylor-18 expm differ by up to 2e-3 on entries of '
      'results of norm ~1e5 (sample 1); the exact (float64) result is outside the tolerance of the CPU\'s too'),
    X('chalf', 'bwd', 'error', 'unsupported: complex32 refused with a clear TypeError (no XLA type)'),
    X('linalg.eigvals', 'bwd', 'error',
      'unsupported: its backward solves a complex system, and linalg.solve refuses complex inputs with a clear '
      'error naming the op (the LAPACK handlers are real-only so far)'),
    # --- int64 forward (ci runs it since 2026-11-27) ---
    *[X(op, 'fwd', 'error', 'unsupported: convolution and average pooling refuse integer inputs with a clear '
        'error naming the op (XLA:CPU convolutions are float; CPU torch computes them in int64)', dtype='int64')
      for op in ('nn.functional.conv1d', 'nn.functional.conv2d', 'nn.functional.conv3d',
                 'nn.functional.conv_transpose1d', 'nn.functional.conv_transpose2d', 'nn.functional.conv_transpose3d',
                 'nn.functional.avg_pool1d', 'nn.functional.avg_pool2d', 'nn.functional.avg_pool3d',
                 'nn.functional.local_response_norm')],
    *[X(op, 'fwd', 'mismatch', 'ambiguous: integer samples hold ties; which of the equal values\' indices is '
        'returned is unspecified (values match; float32 samples pass)', dtype='int64')
      for op in ('kthvalue', 'topk', 'mode')],
    *[X(op, 'fwd', 'fallback', 'fallback: counted CPU fallback (prims::gcd has no XLA lowering)', dtype='int64')
      for op in ('gcd', 'lcm')],
    X('index_reduce.mean', 'fwd', 'error', 'unsupported: a mean of integers (torch rounds with floor division) '
      'refused with a clear error naming the op', dtype='int64'),
    X('bincount', 'fwd', 'error', 'unsupported: a result size that depends on the values, refused with a clear '
      'error unless minlength bounds it', dtype='int64'),
    X('native_dropout_backward', 'fwd', 'error', 'unsupported: integer grads refused with a clear error naming '
      'the op', dtype='int64'),
]


def lookup(op, direction, dtype, mode):
    """The entry for a case, or None."""
    dt = str(dtype).removeprefix("torch.")
    hits = [x for x in EXPECTED if x.op == op and x.direction == direction
            and x.dtype in (dt, "*") and x.mode in (mode, "all")]
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} expected-failure entries match {op} {direction} {dt} {mode}: {hits}")
    return hits[0] if hits else None

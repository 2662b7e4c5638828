"""The FFT: torch's three FFT primitives (_fft_c2c, _fft_r2c, _fft_c2r, which
every torch.fft function, stft and istft reduce to, padding and trimming
included) -> the core's `fft` op (stablehlo.fft, csrc/ops/complex.cpp).

stablehlo.fft transforms the trailing 1 to 3 dims, so the transformed dims
are moved to the end (in the order given: the last one is the halved one of
a real transform) and back; more than 3 dims go in groups (the transform is
separable). XLA's inverse transforms divide by the signal size; torch's
normalization (0: none, 1: 1/sqrt(n), 2: 1/n, applied in the direction
asked) is restored by one scale."""
import math

import torch

from .._tracing.tensor import OP, wrapped_op
from .._runtime.dtypes import code
from . import aten, impl

_NONE, _BY_ROOT_N, _BY_N = 0, 1, 2


def _to_end(x, dims):
    """x with `dims` moved to the end (in order), and the permutation back."""
    rest = [d for d in range(x.dim()) if d not in dims]
    perm = rest + list(dims)
    if perm == list(range(x.dim())):
        return x, None
    back = [0] * len(perm)
    for i, p in enumerate(perm):
        back[p] = i
    return wrapped_op(OP.permute, (x._lt,), (perm,)), back


def _back(x, back):
    return x if back is None else wrapped_op(OP.permute, (x._lt,), (back,))


def _fft(x, kind, lengths):
    return wrapped_op(OP.fft, (x._lt,), (kind, list(lengths)))


def _c2c_trailing(x, k, inverse):
    """FFT/IFFT over the trailing k dims, in groups of at most 3."""
    r = x
    for start in range(0, k, 3):
        m = min(3, k - start)
        if start == 0:
            r = _fft(r, "IFFT" if inverse else "FFT", r.shape[r.dim() - m:])
        else:  # bring the next group to the end, transform, put it back
            n = r.dim()
            grp = list(range(n - start - m, n - start))
            r, back = _to_end(r, grp)
            r = _back(_fft(r, "IFFT" if inverse else "FFT", r.shape[n - m:]), back)
    return r


def _scale(x, n, normalization, inverse):
    """torch's normalization of an FFT of signal size n (the result of XLA,
    which divides inverse transforms by n)."""
    want = {_NONE: 1.0, _BY_ROOT_N: 1.0 / math.sqrt(n), _BY_N: 1.0 / n}[normalization]
    have = 1.0 / n if inverse else 1.0
    f = want / have
    return x if f == 1.0 else wrapped_op(OP.mul, (x._lt, f), ())


def _dims(x, dim):
    return [d % x.dim() for d in dim] if x.dim() else []


@impl(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    dims = _dims(x, dim)
    if not dims:
        return wrapped_op(OP.alias, (x._lt,), ())
    n = math.prod(x.shape[d] for d in dims)
    y, back = _to_end(x, dims)
    y = _c2c_trailing(y, len(dims), inverse=not forward)
    return _scale(_back(y, back), n, normalization, inverse=not forward)


@impl(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    dims = _dims(x, dim)
    if not onesided:  # the full spectrum: a complex transform of the real input
        ct = torch.complex128 if x.dtype == torch.float64 else torch.complex64
        xc = wrapped_op(OP.convert, (x._lt,), (code(ct),))
        return fft_c2c(xc, dim, normalization, True)
    n = math.prod(x.shape[d] for d in dims)
    y, back = _to_end(x, dims)
    k = len(dims)
    last = min(k, 3)  # the real transform takes the last (up to 3) dims, complex ones the rest
    y = _fft(y, "RFFT", y.shape[y.dim() - last:])
    if k > last:
        m = y.dim()
        y, b2 = _to_end(y, list(range(m - k, m - last)))
        y = _back(_c2c_trailing(y, k - last, inverse=False), b2)
    return _scale(_back(y, back), n, normalization, inverse=False)


@impl(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    dims = _dims(x, dim)
    y, back = _to_end(x, dims)
    k = len(dims)
    last = min(k, 3)
    if k > last:  # complex inverse transforms of the leading dims first
        m = y.dim()
        y, b2 = _to_end(y, list(range(m - k, m - last)))
        y = _back(_c2c_trailing(y, k - last, inverse=True), b2)
    lengths = list(y.shape[y.dim() - last:-1]) + [int(last_dim_size)]
    need = int(last_dim_size) // 2 + 1
    if y.shape[-1] != need:  # torch reads only the first last_dim_size // 2 + 1 bins (or pads with zeros)
        if y.shape[-1] > need:
            y = wrapped_op(OP.slice, (y._lt,), (y.dim() - 1, 0, need, 1))
        else:
            pad = [0, 0] * (y.dim() - 1) + [0, need - y.shape[-1]]
            y = torch.nn.functional.pad(y, pad)
    y = _fft(y, "IRFFT", lengths)
    n = math.prod(lengths) * math.prod(x.shape[d] for d in dims[:k - last])
    return _scale(_back(y, back), n, normalization, inverse=True)

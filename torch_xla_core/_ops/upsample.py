"""Backward of interpolation (F.interpolate, nn.Upsample): nearest,
nearest-exact, linear, bilinear, bicubic, trilinear, antialiased bilinear
and bicubic. Each is separable:
along each spatial axis the forward is a fixed matrix A [out, in], obtained
exactly (torch's own index math) by running torch's CPU forward of the same
overload on a basis, so the gradient is the incoming grad contracted with A
along every spatial axis (bf16/f16 in float32, rounded once). The matrices
are uploaded once per (op, sizes, options, dtype) and stay on the device as
graph parameters. The antialiased
modes, which have no core lowering, use the same matrices forward."""
import functools

import torch

from .._tracing import tensor as _tensor
from . import aten, decomposed, impl
from .dtype_rules import INTEGRAL

_MODES = ["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
          "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
          "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"]


@functools.lru_cache(maxsize=512)
def _adjoint(fwd, nd, k, n_in, n_out, align, scale, dtype):
    """A^T [n_in, n_out] for axis k of an nd-spatial forward, on the device."""
    # The other axes have size 2 (kept as 2: the identity), not 1: the CPU
    # antialiased kernels mishandle size-1 axes.
    shape = [n_in, 1] + [n_in if j == k else 2 for j in range(nd)]
    basis = torch.eye(n_in, dtype=torch.float64).reshape([n_in, 1] + [n_in if j == k else 1 for j in range(nd)])
    out = fwd(basis.expand(shape).contiguous(), [n_out if j == k else 2 for j in range(nd)], *align,
              *[scale if j == k else None for j in range(nd)])
    out = out[(slice(None), 0) + tuple(slice(None) if j == k else 0 for j in range(nd))]
    return _tensor.from_cpu(out.reshape(n_in, n_out).to(dtype))


def _apply(fwd, x, output_size, input_size, rest, transpose):
    """x contracted with each axis' matrix: A (forward) or A^T (backward).
    bf16/f16 compute in float32 and round once, as torch's CPU kernels do
    (the matrices' weights, 1/3 and the like, are not bf16 numbers, and
    each axis' product rounded to bf16 put a trilinear gradient's element
    40% off where CPU's was within 0.1%)."""
    nd = len(output_size)
    has_align = any(a.name == "align_corners" for a in fwd._schema.arguments)
    align = tuple(rest[:1]) if has_align else ()
    scales = list(rest[len(align):]) + [None] * nd
    dtype = x.dtype
    if dtype in (torch.bfloat16, torch.float16):
        x = x.float()
    for k in range(nd):
        at = _adjoint(fwd, nd, k, int(input_size[2 + k]), int(output_size[k]), align, scales[k], x.dtype)
        x = torch.tensordot(x, at, dims=([2 + k], [1 if transpose else 0])).movedim(-1, 2 + k)
    return x.to(dtype)


def _backward(fwd):
    return lambda grad, output_size, input_size, *rest: _apply(fwd, grad, output_size, input_size, rest, True)


def _forward(fwd):
    return lambda x, output_size, *rest: _apply(fwd, x, output_size, x.shape, rest, False)


for _name in _MODES:
    impl(getattr(aten, _name + "_backward").default)(_backward(getattr(aten, _name).default))
# The antialiased modes have no core lowering of their own: their forward is the same product.
for _name in ("_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
    impl(getattr(aten, _name).default, refuses=INTEGRAL)(_forward(getattr(aten, _name).default))
# Linear interpolation (torch's decompositions): float math that torch's kernels refuse for integers and bools.
decomposed(aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_bicubic2d, aten.upsample_trilinear3d,
           refuses=INTEGRAL)

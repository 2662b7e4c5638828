"""Backward of interpolation (F.interpolate, nn.Upsample): nearest,
nearest-exact, linear, bilinear, bicubic, trilinear. Each is separable:
along each spatial axis the forward is a fixed matrix A [out, in], obtained
exactly (torch's own index math) by running torch's CPU forward of the same
overload on a basis, so the gradient is the incoming grad contracted with A
along every spatial axis. The matrices are uploaded once per (op, sizes,
options, dtype) and stay on the device as graph parameters. The antialiased
modes (forward and backward) stay on the counted CPU fallback: their per-axis
matrices do not come out of a basis run this way."""
import functools

import torch

from .. import _tensor
from . import aten, impl

_MODES = ["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
          "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
          "upsample_bicubic2d", "upsample_trilinear3d"]


@functools.lru_cache(maxsize=512)
def _adjoint(fwd, nd, k, n_in, n_out, align, scale, dtype):
    """A^T [n_in, n_out] for axis k of an nd-spatial forward, on the device."""
    basis = torch.eye(n_in, dtype=torch.float64).reshape([n_in, 1] + [n_in if j == k else 1 for j in range(nd)])
    out = fwd(basis, [n_out if j == k else 1 for j in range(nd)], *align,
              *[scale if j == k else None for j in range(nd)])
    return _tensor.from_cpu(out.reshape(n_in, n_out).to(dtype))


def _backward(fwd):
    has_align = any(a.name == "align_corners" for a in fwd._schema.arguments)

    def h(grad, output_size, input_size, *rest):
        nd = len(output_size)
        align = tuple(rest[:1]) if has_align else ()
        scales = list(rest[len(align):]) + [None] * nd
        g = grad
        for k in range(nd):
            at = _adjoint(fwd, nd, k, int(input_size[2 + k]), int(output_size[k]), align, scales[k], grad.dtype)
            g = torch.tensordot(g, at, dims=([2 + k], [1])).movedim(-1, 2 + k)
        return g
    return h


for _name in _MODES:
    impl(getattr(aten, _name + "_backward").default)(_backward(getattr(aten, _name).default))

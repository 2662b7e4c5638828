"""nn ops whose backward is the derivative of their forward composition:
grid_sampler_2d/3d (3d's forward written here, 2d's from torch._decomp).
Their backward kernels re-trace the forward from core ops and differentiate
it with autograd, re-entered inside the handler (vjp() below): one
definition per op, forward and backward always consistent, no hand-written
adjoint.

A handler runs below torch's autograd keys (they are excluded while it
runs); vjp() lifts that exclusion for its own trace only."""
import torch

from . import aten, impl

_C = torch._C
_AD_KEYS = _C.DispatchKeySet(_C.DispatchKey.AutogradPrivateUse1) | _C.DispatchKeySet(_C.DispatchKey.ADInplaceOrView)


def vjp(fn, primals, cotangents):
    """Gradients of fn(*primals) (a tensor or tuple) w.r.t. the primals,
    weighted by cotangents (None where no gradient flows: zeros)."""
    inc, exc = _C._dispatch_tls_local_include_set(), _C._dispatch_tls_local_exclude_set()
    with _C._ForceDispatchKeyGuard(inc, exc - _AD_KEYS), torch.enable_grad():
        ps = [p.detach().requires_grad_() for p in primals]
        out = fn(*ps)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        cots = cotangents if isinstance(cotangents, (tuple, list)) else (cotangents,)
        pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
        if not pairs:
            return [torch.zeros_like(p) for p in primals]
        gs = torch.autograd.grad([o for o, _ in pairs], ps, [c for _, c in pairs], allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(primals, gs)]


# ---- grid sampling ---------------------------------------------------------------

def _decomposed_grid_sampler_2d(x, grid, interp, padding, align_corners):
    from torch._decomp import decomposition_table
    return decomposition_table[aten.grid_sampler_2d.default](x, grid, interp, padding, align_corners)


@impl(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad, x, grid, interp, padding, align_corners, output_mask):
    gx, gg = vjp(lambda a, g: _decomposed_grid_sampler_2d(a, g, interp, padding, align_corners), [x, grid], grad)
    return (gx if output_mask[0] else None), gg


def _source_index(coords, size, padding, align_corners):
    """grid coordinates in [-1, 1] -> input positions, with padding 0 (zeros),
    1 (border: clamped) or 2 (reflection)."""
    mul = (size * 0.5 - 0.5) if align_corners else (size * 0.5)
    c = coords * mul + (size * 0.5 - 0.5)
    if padding == 1:
        return torch.clamp(c, 0, size - 1)
    if padding == 2:
        lo2, hi2 = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if lo2 == hi2:
            c = torch.zeros_like(c)
        else:
            lo, span = lo2 / 2, (hi2 - lo2) / 2
            c2 = (c - lo).abs()
            extra = torch.fmod(c2, span)
            flips = (c2 / span).floor()
            c = torch.where(torch.fmod(flips, 2) == 0, extra + lo, span + lo - extra)
        return torch.clamp(c, 0, size - 1)
    return c


def _grid_sampler_3d(x, grid, interp, padding, align_corners):
    if interp not in (0, 1):
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    N, C, D, H, W = x.shape
    oD, oH, oW = grid.shape[1:4]
    iz = _source_index(grid[..., 2], D, padding, align_corners)
    iy = _source_index(grid[..., 1], H, padding, align_corners)
    ix = _source_index(grid[..., 0], W, padding, align_corners)
    flat = x.reshape(N, C, D * H * W)

    def tap(z, y, xx, w):
        inside = (z >= 0) & (z < D) & (y >= 0) & (y < H) & (xx >= 0) & (xx < W)
        idx = torch.where(inside, (z * H + y) * W + xx, 0).to(torch.int64).reshape(N, 1, -1)
        v = flat.gather(2, idx.expand(N, C, idx.shape[-1])).reshape(N, C, oD, oH, oW)
        return v * torch.where(inside, w, 0).unsqueeze(1)

    if interp == 1:  # nearest (round half to even, as CPU's nearbyint)
        return tap(iz.round(), iy.round(), ix.round(), torch.ones_like(ix))
    z0, y0, x0 = iz.floor(), iy.floor(), ix.floor()
    out = None
    for dz in (0, 1):
        wz = (iz - z0) if dz else (z0 + 1 - iz)
        for dy in (0, 1):
            wy = (iy - y0) if dy else (y0 + 1 - iy)
            for dx in (0, 1):
                wx = (ix - x0) if dx else (x0 + 1 - ix)
                t = tap(z0 + dz, y0 + dy, x0 + dx, wz * wy * wx)
                out = t if out is None else out + t
    return out


@impl(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    if x.dim() != 5 or grid.dim() != 5 or grid.shape[-1] != 3:
        raise RuntimeError(f"grid_sampler(): expected 5D input and grid with last dimension 3, but got input "
                           f"with sizes {list(x.shape)} and grid with sizes {list(grid.shape)}")
    return _grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners)


@impl(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad, x, grid, interp, padding, align_corners, output_mask):
    gx, gg = vjp(lambda a, g: _grid_sampler_3d(a, g, interp, padding, align_corners), [x, grid], grad)
    return (gx if output_mask[0] else None), gg

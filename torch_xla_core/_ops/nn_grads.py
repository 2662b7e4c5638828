"""nn ops whose backward is the derivative of their forward composition:
grid_sampler_2d/3d (3d's forward written here, 2d's from torch._decomp;
both compute in float32 for half-precision inputs),
ctc_loss (the alpha recursion as one scan over time), weight norm (torch's
_weight_norm_interface decomposition: nn.utils.weight_norm, wav2vec2's
positional convolution).
Their backward kernels re-trace the forward from core ops and differentiate
it with autograd, re-entered inside the handler (vjp() below): one
definition per op, forward and backward always consistent, no hand-written
adjoint.

A handler runs below torch's autograd keys (they are excluded while it
runs); vjp() lifts that exclusion for its own trace only."""
import torch
from torch._decomp import decomposition_table

from . import aten, impl
from .dtype_rules import INTEGRAL
from .scan import scan

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

def _wide(x, grid):
    """x and grid in float32 where either is half precision: the sampling
    coordinates, their flat gather indices (exact integers in float32 up to
    2**24, in bf16 only up to 256: a 3-d index went out of range) and the
    interpolation weights are float math, as CPU's opmath; the result is
    rounded to x's dtype once."""
    half = (torch.float16, torch.bfloat16)
    if x.dtype in half or grid.dtype in half:
        return x.float(), grid.float()
    return x, grid


def _decomposed_grid_sampler_2d(x, grid, interp, padding, align_corners):
    xw, gw = _wide(x, grid)
    return decomposition_table[aten.grid_sampler_2d.default](xw, gw, interp, padding, align_corners).to(x.dtype)


@impl(aten.grid_sampler_2d.default, refuses=INTEGRAL)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    return _decomposed_grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners)


def _clip(c, lo, hi):
    """clamp(c, lo, hi) with the gradient torch's grid samplers give it
    (clip_coordinates_set_grad): 1 strictly inside, 0 at and past the
    bounds (torch.clamp's passes at them: a bf16 grid hits +-1 exactly)."""
    return torch.where((c > lo) & (c < hi), c, c.detach().clamp(lo, hi))


class _GridClamp(torch.overrides.TorchFunctionMode):
    """torch.clamp(coords, lo, hi) inside torch's grid_sampler_2d
    decomposition (border and reflection padding) as _clip."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.clamp and len(args) == 3 and not kwargs and all(isinstance(b, (int, float)) for b in args[1:]):
            return _clip(*args)
        return func(*args, **(kwargs or {}))


def _grid_sampler_2d_for_grad(x, grid, interp, padding, align_corners):
    with _GridClamp():
        return _decomposed_grid_sampler_2d(x, grid, interp, padding, align_corners)


@impl(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad, x, grid, interp, padding, align_corners, output_mask):
    gx, gg = vjp(lambda a, g: _grid_sampler_2d_for_grad(a, g, interp, padding, align_corners), [x, grid], grad)
    return (gx if output_mask[0] else None), gg


def _source_index(coords, size, padding, align_corners):
    """grid coordinates in [-1, 1] -> input positions, with padding 0 (zeros),
    1 (border: clamped) or 2 (reflection)."""
    mul = (size * 0.5 - 0.5) if align_corners else (size * 0.5)
    c = coords * mul + (size * 0.5 - 0.5)
    if padding == 1:
        return _clip(c, 0, size - 1)
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
        return _clip(c, 0, size - 1)
    return c


def _grid_sampler_3d(x, grid, interp, padding, align_corners):
    if interp not in (0, 1):
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    dtype = x.dtype
    x, grid = _wide(x, grid)
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
        return tap(iz.round(), iy.round(), ix.round(), torch.ones_like(ix)).to(dtype)
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
    return out.to(dtype)


@impl(aten.grid_sampler_3d.default, refuses=INTEGRAL)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    if x.dim() != 5 or grid.dim() != 5 or grid.shape[-1] != 3:
        raise RuntimeError(f"grid_sampler(): expected 5D input and grid with last dimension 3, but got input "
                           f"with sizes {list(x.shape)} and grid with sizes {list(grid.shape)}")
    return _grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners)


@impl(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad, x, grid, interp, padding, align_corners, output_mask):
    gx, gg = vjp(lambda a, g: _grid_sampler_3d(a, g, interp, padding, align_corners), [x, grid], grad)
    return (gx if output_mask[0] else None), gg


# ---- ctc loss ----------------------------------------------------------------------

def _lse(*xs):
    """logsumexp of same-shape tensors, -inf when all are -inf, with no NaN
    in value or gradient (the shift is a constant; log never sees 0)."""
    m = xs[0]
    for x in xs[1:]:
        m = torch.maximum(m, x)
    m0 = torch.where(torch.isinf(m), 0, m).detach()
    s = None
    for x in xs:
        e = torch.exp(x - m0)
        s = e if s is None else s + e
    zero = s == 0
    return torch.where(zero, float("-inf"), torch.log(torch.where(zero, 1, s)) + m0)


def _ctc_forward(lp, targets, in_len, tg_len, blank):
    """(negative log likelihood [N], log_alpha [N, T, L]) of log_probs lp
    [T, N, C], by the alpha recursion over the blank-extended targets (a
    scan over time); in_len/tg_len: int64 [N] on the device."""
    T, N, C = lp.shape
    dev = lp.device
    if targets.dim() == 2:
        S = targets.shape[1]
        tg = targets
    else:  # concatenated targets: row b starts at the sum of the earlier lengths
        S = max(targets.shape[0], 1)
        start = torch.cumsum(tg_len, 0) - tg_len
        pos = start.unsqueeze(1) + torch.arange(S, device=dev)
        tg = torch.where(pos < targets.shape[0], pos, 0)
        tg = targets[tg] if targets.shape[0] else torch.zeros(N, S, dtype=torch.int64, device=dev)
    L = 2 * S + 1
    s = torch.arange(L, device=dev)
    lab = tg.to(torch.int64)[:, torch.clamp((s - 1) // 2, 0, max(S - 1, 0))] if S else \
        torch.zeros(N, L, dtype=torch.int64, device=dev)
    ext = torch.where(s % 2 == 0, blank, lab)                                   # [N, L]
    skip = (s % 2 == 1) & (s >= 2)
    skip = skip & (ext != torch.cat([ext[:, :2], ext[:, :-2]], 1))              # ext[s] != ext[s-2]
    lpe = lp.gather(2, ext.unsqueeze(0).expand(T, N, L))                       # [T, N, L]
    ninf = torch.full((N, 1), float("-inf"), dtype=lp.dtype, device=dev)
    first = (s == 0) | ((s == 1) & (tg_len.unsqueeze(1) > 0))
    alpha0 = torch.where(first, lpe[0], float("-inf"))

    def step(alpha, x):
        lpe_t, t = x
        a1 = torch.cat([ninf, alpha[:, :-1]], 1)
        a2 = torch.where(skip, torch.cat([ninf, ninf, alpha[:, :-2]], 1), float("-inf"))
        new = _lse(alpha, a1, a2) + lpe_t
        alpha = torch.where((t < in_len).unsqueeze(1), new, alpha)
        return alpha, alpha
    if T > 1:  # one loop in the graph: compile time does not grow with T
        alpha, rest = scan(step, alpha0, (lpe[1:], torch.arange(1, T, device=dev)))
        alphas = torch.cat([alpha0.unsqueeze(0), rest], 0)
    else:
        alpha, alphas = alpha0, alpha0.unsqueeze(0)
    end = (2 * tg_len).unsqueeze(1)
    last = alpha.gather(1, end).squeeze(1)
    prev = torch.where(tg_len > 0, alpha.gather(1, torch.clamp(end - 1, min=0)).squeeze(1), float("-inf"))
    return -_lse(last, prev), alphas.transpose(0, 1)


def _lengths(x, n, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev).to(torch.int64).reshape(-1)
    return torch.tensor(list(x), dtype=torch.int64).reshape(-1).to(dev)


def _ctc(lp, targets, input_lengths, target_lengths, blank, zero_infinity):
    if lp.dim() != 3:
        raise RuntimeError(f"ctc_loss: expected log_probs to be 3-D [T, N, C], got {list(lp.shape)}")
    if not 0 <= blank < lp.shape[2]:
        raise RuntimeError("blank must be in label range")
    dev = lp.device
    in_len, tg_len = _lengths(input_lengths, lp.shape[1], dev), _lengths(target_lengths, lp.shape[1], dev)
    nll, log_alpha = _ctc_forward(lp, targets, in_len, tg_len, blank)
    if zero_infinity:
        nll = torch.where(torch.isinf(nll), 0, nll)
    return nll, log_alpha


@impl(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def ctc_loss(lp, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc(lp, targets, input_lengths, target_lengths, blank, zero_infinity)


@impl(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(grad, lp, targets, input_lengths, target_lengths, nll, log_alpha, blank,
                      zero_infinity=False):
    """CPU eager's gradient: the derivative of the loss plus exp(log_probs)
    (torch folds the log_softmax's Jacobian term in, expecting log_probs to
    come from log_softmax), over the first input_length steps of each row,
    zero for rows whose loss is infinite when zero_infinity."""
    dev = lp.device
    in_len = _lengths(input_lengths, lp.shape[1], dev)
    tg_len = _lengths(target_lengths, lp.shape[1], dev)
    g = vjp(lambda x: _ctc_forward(x, targets, in_len, tg_len, blank)[0], [lp], grad)[0]
    live = (torch.arange(lp.shape[0], device=dev).unsqueeze(1) < in_len).unsqueeze(2)     # [T, N, 1]
    g = g + torch.where(live, torch.exp(lp) * grad.reshape(1, -1, 1), 0)
    if zero_infinity:  # nll is already zeroed there: the final alphas tell
        end = (2 * tg_len).unsqueeze(1)
        last = log_alpha[:, -1]
        prev = torch.where(tg_len > 0, last.gather(1, torch.clamp(end - 1, min=0)).squeeze(1), float("-inf"))
        impossible = torch.isinf(_lse(last.gather(1, end).squeeze(1), prev))
        g = torch.where(impossible.reshape(1, -1, 1), 0, g)
    return g


# ---- weight norm -----------------------------------------------------------------

@impl(aten._weight_norm_interface_backward.default)
def weight_norm_backward(grad_w, v, g, norms, dim):
    fwd = decomposition_table[aten._weight_norm_interface.default]
    gv, gg = vjp(lambda v_, g_: fwd(v_, g_, dim)[0], (v, g), grad_w)
    return gv, gg

"""Less common nn aten ops on the device, built from core ops through
ordinary torch calls on xla tensors: hardshrink/softshrink backward,
multi_margin_loss backward, replication padding backward, pdist (forward and
backward), _trilinear (bilinear), embedding_renorm_ (embedding's max_norm),
fractional max pooling (2d/3d, forward and backward).

The formulas follow CPU eager's kernels (aten/src/ATen/native), so results
match it elementwise: e.g. pdist's gradient per p, fractional pooling's
window starts."""
import torch

from . import aten, impl


# ---- shrink ---------------------------------------------------------------------

@impl(aten.hardshrink_backward.default)
def hardshrink_backward(grad, x, lambd):
    return torch.where((x >= -lambd) & (x <= lambd), 0, grad)


@impl(aten.softshrink_backward.default)
def softshrink_backward(grad, x, lambd):
    return torch.where((x >= -lambd) & (x <= lambd), 0, grad)


# ---- multi_margin_loss --------------------------------------------------------

@impl(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    x2 = x.reshape(1, -1) if x.dim() <= 1 else x
    n, c = x2.shape
    t = target.reshape(-1, 1)
    g = (1.0 / n if reduction == 1 else 1.0) / c
    z = margin - x2.gather(1, t) + x2                      # [n, c]
    other = torch.arange(c, device=x.device) != t          # d != target
    h = torch.where((z > 0) & other, g if p == 1 else 2 * g * z, 0)
    if weight is not None:
        h = h * weight[t]
    gi = h.scatter(1, t, -h.sum(1, keepdim=True))
    gi = gi * (grad.reshape(-1, 1) if reduction == 0 and grad.dim() else grad)
    return gi.reshape(x.shape)


# ---- replication padding --------------------------------------------------------

def _replication_pad_backward(grad, x, padding):
    """Sums the gradient of each padded position into the edge element it copies."""
    k = len(padding) // 2
    g = grad
    for j in range(k):
        d = x.dim() - 1 - j
        left, right = padding[2 * j], padding[2 * j + 1]
        n = x.shape[d]
        idx = torch.clamp(torch.arange(-left, n + right, device=x.device), 0, n - 1)
        shape = list(g.shape)
        shape[d] = n
        g = torch.zeros(shape, dtype=g.dtype, device=g.device).index_add(d, idx, g)
    return g


@impl(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
      aten.replication_pad3d_backward.default)
def replication_pad_backward(grad, x, padding):
    return _replication_pad_backward(grad, x, padding)


# ---- pdist ------------------------------------------------------------------------

def _pairs(x):
    n = x.shape[0]
    ij = torch.triu_indices(n, n, 1).to(x.device)
    return ij[0], ij[1]


def _norm(d, p):
    a = d.abs()
    if p == 0:
        return (a != 0).to(d.dtype).sum(-1)
    if p == 1:
        return a.sum(-1)
    if p == 2:
        return (a * a).sum(-1).sqrt()
    if p == float("inf"):
        return a.amax(-1) if d.shape[-1] else a.sum(-1)
    return a.pow(p).sum(-1).pow(1.0 / p)


@impl(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    if x.dim() != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {x.dim()}D")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    if x.shape[0] < 2:
        return torch.zeros(0, dtype=x.dtype, device=x.device)
    i, j = _pairs(x)
    return _norm(x[i] - x[j], p)


@impl(aten._pdist_backward.default)
def pdist_backward(grad, x, p, dist):
    if x.shape[0] < 2 or p == 0:
        return torch.zeros_like(x)
    i, j = _pairs(x)
    diff = x[i] - x[j]
    g, dd = grad.unsqueeze(-1), dist.unsqueeze(-1)
    if p == 1:
        gp = g * torch.sign(diff)
    elif p == float("inf"):
        gp = g * torch.sign(diff) * (diff.abs() == dd)
    elif p < 2:
        gp = torch.sign(diff) * diff.abs().pow(p - 1) * g / dd.pow(p - 1)
        if p < 1:
            gp = torch.where(diff == 0, 0, gp)
        gp = torch.where(dd == 0, 0, gp)
    elif p == 2:
        gp = torch.where(dd == 0, 0, g * diff / dd)
    else:
        gp = torch.where(dd == 0, 0, diff * diff.abs().pow(p - 2) * g / dd.pow(p - 1))
    return torch.zeros_like(x).index_add(0, i, gp).index_add(0, j, -gp)


# ---- _trilinear (bilinear) ------------------------------------------------------------

@impl(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    total = i1.dim() + len(expand1)

    def spread(t, expand):
        for d in range(total):
            if d in expand:
                t = t.unsqueeze(d)
        return t
    r = spread(i1, set(expand1)) * spread(i2, set(expand2)) * spread(i3, set(expand3))
    return r.sum(sorted(set(sumdim))) if sumdim else r


# ---- embedding max_norm ----------------------------------------------------------------

@impl(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows of weight that indices name and whose norm exceeds max_norm,
    scaled to max_norm (CPU eager's 1e-7 guard included)."""
    used = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
    used = used.index_put((indices.reshape(-1),), torch.ones((), dtype=torch.bool, device=weight.device))
    norm = _norm(weight, float(norm_type)).unsqueeze(-1)
    scale = torch.where(used.unsqueeze(-1) & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return weight * scale.to(weight.dtype)


@impl(aten.embedding_renorm_.default)
def embedding_renorm_(weight, indices, max_norm, norm_type):
    from . import assign
    assign(weight, embedding_renorm(weight, indices, max_norm, norm_type))
    return weight


# ---- fractional max pooling ------------------------------------------------------------

def _starts(sample, n_in, n_out, k):
    """Window starts per output position ([..., n_out] int64) from the random
    samples [...] in [0, 1), as CPU eager's generate_intervals."""
    i = torch.arange(n_out, device=sample.device, dtype=sample.dtype)
    s = sample.unsqueeze(-1)
    if n_out > 1:
        alpha = (n_in - k) / (n_out - 1)
        starts = ((i + s) * alpha).to(torch.int64) - (s * alpha).to(torch.int64)
    else:
        starts = torch.zeros_like(s, dtype=torch.int64).expand(*s.shape[:-1], n_out)
    return torch.where(i.to(torch.int64) == n_out - 1, n_in - k, starts)


def _fractional_max_pool(name, x, kernel_size, output_size, samples, nd):
    batched = x.dim() == nd + 2
    if x.dim() not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: non-empty {nd + 1}D or {nd + 2}D (batch mode) tensor expected for input")
    xb = x if batched else x.unsqueeze(0)
    N, C, sp = xb.shape[0], xb.shape[1], list(xb.shape[2:])
    ks, outs = list(kernel_size), list(output_size)
    for d in range(nd):
        if outs[d] + ks[d] - 1 > sp[d]:
            raise RuntimeError(f"{name}(): pool size {ks[d]} too large relative to input size {sp[d]} and output "
                               f"size {outs[d]}")
    # the sample column of each spatial dim: 2d reads (W, H), 3d reads (T, H, W)
    cols = [1, 0] if nd == 2 else [0, 1, 2]
    flat = None
    for d in range(nd):
        st = _starts(samples[..., cols[d]], sp[d], outs[d], ks[d])             # [N, C, out_d]
        pos = st.unsqueeze(-1) + torch.arange(ks[d], device=x.device)          # [N, C, out_d, k_d]
        # broadcast to [N, C, out_0.., out_{nd-1}, k_0.., k_{nd-1}]
        shape = [N, C] + [1] * (2 * nd)
        shape[2 + d], shape[2 + nd + d] = outs[d], ks[d]
        pos = pos.reshape(shape)
        flat = pos if flat is None else flat * sp[d] + pos
    out_shape = [N, C] + outs
    flat = flat.expand(*out_shape, *ks).reshape(N, C, -1)
    vals = xb.reshape(N, C, -1).gather(2, flat).reshape(*out_shape, -1)
    win = flat.reshape(*out_shape, -1)
    # first maximum; a NaN wins (CPU eager: `val > max || isnan(val)`)
    key = torch.where(torch.isnan(vals), float("inf"), vals)
    arg = key.argmax(-1, keepdim=True)
    out, idx = vals.gather(-1, arg).squeeze(-1), win.gather(-1, arg).squeeze(-1)
    return (out, idx) if batched else (out.squeeze(0), idx.squeeze(0))


def _prod(s):
    r = 1
    for v in s:
        r *= v
    return r


@impl(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool("fractional_max_pool2d", x, kernel_size, output_size, random_samples, 2)


@impl(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool("fractional_max_pool3d", x, kernel_size, output_size, random_samples, 3)


@impl(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _spatial_scatter(grad, x, indices, 2)


@impl(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _spatial_scatter(grad, x, indices, 3)


def _spatial_scatter(grad, x, indices, nd):
    """Gradient of a max pool with flat spatial indices: each output's
    gradient added at the input position it came from."""
    lead = list(x.shape[:-nd])
    g = torch.zeros(*lead, _prod(x.shape[-nd:]), dtype=grad.dtype, device=grad.device)
    g = g.scatter_add(len(lead), indices.reshape(*lead, -1), grad.reshape(*lead, -1))
    return g.reshape(x.shape)

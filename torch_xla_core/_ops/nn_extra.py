"""Less common nn aten ops on the device, built from core ops through
ordinary torch calls on xla tensors: hardshrink/softshrink backward,
multi_margin_loss backward, replication padding backward, pdist (forward and
backward), _trilinear (bilinear), embedding_renorm_ (embedding's max_norm),
fractional max pooling (2d/3d, forward and backward), embedding_bag (forward
and backward), linear_cross_entropy's chunked custom ops.

The formulas follow CPU eager's kernels (aten/src/ATen/native), so results
match it elementwise: e.g. pdist's gradient per p, fractional pooling's
window starts."""
import torch
from torch._decomp import decomposition_table

from . import assign, aten, fallback, impl
from .dtype_rules import BOOL, INTEGRAL

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

@impl(aten._trilinear.default, refuses=BOOL)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    total = i1.dim() + len(expand1)

    def spread(t, expand):
        for d in range(total):
            if d in expand:
                t = t.unsqueeze(d)
        return t
    dtype = i1.dtype
    if dtype in (torch.float16, torch.bfloat16):  # products and sum in float32, rounded once (CPU: bmm)
        i1, i2, i3 = i1.float(), i2.float(), i3.float()
    r = spread(i1, set(expand1)) * spread(i2, set(expand2)) * spread(i3, set(expand3))
    # (dtype=: a sum of int32/int8 products is int64 by default; torch's kernel keeps the input dtype)
    return (r.sum(sorted(set(sumdim)), dtype=r.dtype) if sumdim else r).to(dtype)


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


# ---- embedding_bag -------------------------------------------------------------------
# Outputs (output, offset2bag, bag_size, max_indices) with every auxiliary
# filled (CPU eager leaves some empty in sum mode; they only feed this
# file's backward kernels, which read them as made here).

def _bags(indices, offsets, include_last_offset):
    """(flat indices [n], offsets [B], B) for 1-D indices + offsets or 2-D indices."""
    if indices.dim() == 2:
        B, L = indices.shape
        return indices.reshape(-1), torch.arange(0, B * L, max(L, 1), device=indices.device)[:B], B
    if indices.dim() != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {indices.dim()}")
    B = offsets.shape[0] - (1 if include_last_offset else 0)
    return indices, offsets[:B], B


def _offset2bag(offsets, n, dev):
    pos = torch.arange(n, device=dev)
    return (offsets.unsqueeze(0) <= pos.unsqueeze(1)).sum(1) - 1 if n else pos


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    if per_sample_weights is not None and mode != 0:
        raise NotImplementedError("embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  "supported for mode='sum' (got mode='mean' or 'max'). Please open a feature "
                                  "request on GitHub.")
    dev = weight.device
    idx, offs, B = _bags(indices, offsets, include_last_offset)
    n, D = idx.shape[0], weight.shape[1]
    o2b = _offset2bag(offs, n, dev)
    valid = idx != padding_idx if padding_idx is not None and padding_idx >= 0 else \
        torch.ones(n, dtype=torch.bool, device=dev)
    rows = weight[idx]                                                          # [n, D]
    count = torch.zeros(B, dtype=torch.int64, device=dev).index_add(0, o2b, valid.to(torch.int64))
    if mode == 2:
        neg = torch.where(valid.unsqueeze(1), rows, float("-inf"))
        best = torch.full((B, D), float("-inf"), dtype=weight.dtype, device=dev)
        best = best.scatter_reduce(0, o2b.unsqueeze(1).expand(n, D), neg, "amax", include_self=True)
        hit = valid.unsqueeze(1) & (rows == best[o2b])
        cand = torch.where(hit, idx.unsqueeze(1), weight.shape[0])
        mx = torch.full((B, D), weight.shape[0], dtype=torch.int64, device=dev)
        mx = mx.scatter_reduce(0, o2b.unsqueeze(1).expand(n, D), cand, "amin", include_self=True)
        empty = (count == 0).unsqueeze(1)
        out = torch.where(empty, 0, best)
        return out, o2b, count, torch.where(empty, -1, mx)
    # half-precision bags sum in float32 and round once, as CPU (a bf16
    # running sum was 5x bf16 tolerance from float64 where CPU's is 0.16x)
    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    w = valid.to(acc) if per_sample_weights is None else \
        torch.where(valid, per_sample_weights.reshape(-1), 0).to(acc)
    out = torch.zeros(B, D, dtype=acc, device=dev).index_add(0, o2b, rows.to(acc) * w.unsqueeze(1))
    if mode == 1:
        out = out / torch.clamp(count, min=1).unsqueeze(1).to(acc)
    return out.to(weight.dtype), o2b, count, torch.zeros(B, dtype=torch.int64, device=dev)


@impl(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                          include_last_offset, padding_idx)


@impl(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if scale_grad_by_freq:
        # CPU eager's scaling here follows its own bag bookkeeping (sum mode is
        # scaled like mean): keep its exact values through the counted fallback
        return fallback(aten._embedding_bag_backward.default)(
            grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
            sparse, per_sample_weights, padding_idx)
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@impl(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    psw = per_sample_weights
    dev, D = grad.device, grad.shape[1]
    idx = indices.reshape(-1)
    if mode == 2:
        live = maximum_indices >= 0
        rows = torch.where(live, maximum_indices, 0).reshape(-1)
        cols = torch.arange(D, device=dev).repeat(grad.shape[0])
        g = torch.where(live, grad, 0).reshape(-1)
        return torch.zeros(num_weights, D, dtype=grad.dtype, device=dev).index_put((rows, cols), g, accumulate=True)
    valid = idx != padding_idx if padding_idx is not None and padding_idx >= 0 else \
        torch.ones(idx.shape[0], dtype=torch.bool, device=dev)
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype  # as the forward
    g = grad[offset2bag].to(acc)                                                 # [n, D]
    w = valid.to(acc)
    if psw is not None:
        w = w * psw.reshape(-1).to(acc)
    if mode == 1:
        w = w / torch.clamp(bag_size[offset2bag], min=1).to(acc)
    if scale_grad_by_freq:
        freq = torch.zeros(num_weights, dtype=acc, device=dev).index_add(
            0, idx, torch.ones(idx.shape[0], dtype=acc, device=dev))
        w = w / freq[idx]
    out = torch.zeros(num_weights, D, dtype=acc, device=dev).index_add(0, idx, g * w.unsqueeze(1))
    return out.to(grad.dtype)


@impl(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    if mode != 0:
        raise NotImplementedError("embedding_bag_backward: per_sample_weights only supported for mode='sum'")
    idx = indices.reshape(-1)
    r = (grad[offset2bag] * weight[idx]).sum(1)
    if padding_idx is not None and padding_idx >= 0:
        r = torch.where(idx != padding_idx, r, 0)
    return r


# ---- linear_cross_entropy's chunked custom ops -----------------------------------------
# torch_nn::_linear_cross_entropy_batch_chunked(_no_reduction) are torch.library
# custom ops whose one implementation is Python over ordinary torch ops: run
# it on the xla tensors (each op it calls dispatches here).

def _register_linear_cross_entropy():
    try:
        from torch.nn.modules import linear_cross_entropy as lce  # lazy: in newer torch only
    except ImportError:  # torch before 2.13 has no such module (and no such ops to register)
        return
    for opdef in (lce._linear_cross_entropy_batch_chunked, lce._linear_cross_entropy_batch_chunked_no_reduction):
        fn = opdef._init_fn
        impl(opdef._opoverload)(lambda *args, _fn=fn, **kwargs: _fn(*args, **kwargs))


_register_linear_cross_entropy()


@impl(aten.multi_margin_loss.default, refuses=INTEGRAL)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    """torch._decomp's version, with CPU eager's 0-d result for one sample
    without reduction (the decomposition returns [1])."""
    r = decomposition_table[aten.multi_margin_loss.default](x, target, p, margin, weight, reduction)
    return r.reshape(()) if reduction == 0 and x.dim() <= 1 else r

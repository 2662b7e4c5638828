"""The op fuzzer's cases (tests/fuzz.py judges and runs them): random inputs
(shapes with empty and 0-d ones, broadcasting partners, non-contiguous and
flipped layouts, every dtype, NaN and +-inf) and one generator per op family.
A case is (seed, index) with its own random.Random: make_case replays it."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# ---------------------------------------------------------------- inputs
FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int64", "int32", "int16", "int8", "uint8"]
ALL = FLOATS + INTS + ["bool", "complex64"]
SHAPES = [(), (0,), (1,), (5,), (1, 0), (3, 0, 1), (2, 3), (3, 1), (1, 4), (2, 3, 4), (4, 1, 3), (2, 1, 1, 3)]


def lazy_torch():
    import torch  # lazy: the parent runner imports no torch (its children do)
    return torch


def _dt(name):
    return getattr(lazy_torch(), name)


def make_tensor(r: random.Random, shape, dtype: str, specials=True):
    """A CPU tensor of shape/dtype with random values (NaN/inf among floats)."""
    torch = lazy_torch()
    n = math.prod(shape)
    if dtype == "bool":
        vals = [r.random() < 0.5 for _ in range(n)]
        return torch.tensor(vals, dtype=torch.bool).reshape(shape)
    if dtype in INTS:
        lo, hi = (0, 255) if dtype == "uint8" else (-100, 100) if dtype == "int8" else (-1000, 1000)
        if r.random() < 0.5:
            lo, hi = max(lo, -5), 5
        return torch.tensor([r.randint(lo, hi) for _ in range(n)], dtype=_dt(dtype)).reshape(shape)
    special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5]
    vals = []
    for _ in range(n):
        if specials and r.random() < 0.15:
            vals.append(r.choice(special))
        else:
            vals.append(round(r.gauss(0, 3), 3))
    t = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    if dtype == "complex64":
        im = torch.tensor([round(r.gauss(0, 2), 3) for _ in range(n)], dtype=torch.float64).reshape(shape)
        return torch.complex(t, im).to(torch.complex64)
    return t.to(_dt(dtype))


@dataclass
class Layout:
    """How an input is presented: the same view ops on both sides."""
    kind: str = "plain"   # plain | transposed | strided | expanded | flipped
    arg: tuple = ()

    def base_shape(self, shape):
        if self.kind == "transposed":
            return tuple(reversed(shape))
        if self.kind == "strided":
            return shape[:-1] + (shape[-1] * 2,)
        if self.kind == "expanded":
            return shape[:-1] + (1,) if shape[-1] != 0 else shape
        return shape

    def apply(self, t, shape):
        if self.kind == "transposed":
            return t.permute(*reversed(range(t.dim())))
        if self.kind == "strided":
            return t[..., ::2]
        if self.kind == "expanded":
            return t.expand(*shape)
        if self.kind == "flipped":
            return t.flip(*range(t.dim())) if t.dim() else t
        return t


def pick_layout(r: random.Random, shape) -> Layout:
    if not shape or r.random() < 0.55:
        return Layout()
    k = r.choice(["transposed", "strided", "expanded", "flipped"])
    if k == "transposed" and len(shape) < 2:
        k = "flipped"
    return Layout(k)


@dataclass
class Input:
    shape: tuple
    dtype: str
    layout: Layout = field(default_factory=Layout)
    seed: int = 0

    def cpu(self):
        base = make_tensor(random.Random(self.seed), self.layout.base_shape(self.shape), self.dtype)
        return base

    def view(self, base):
        return self.layout.apply(base, self.shape)

    def __repr__(self):
        lay = "" if self.layout.kind == "plain" else f", {self.layout.kind}"
        return f"{self.dtype}{list(self.shape)}{lay}"


def new_input(r: random.Random, shape=None, dtypes=ALL) -> Input:
    shape = r.choice(SHAPES) if shape is None else tuple(shape)
    return Input(shape, r.choice(list(dtypes)), pick_layout(r, shape), r.randrange(1 << 30))


def broadcast_partner(r: random.Random, shape):
    """A shape that broadcasts with `shape` (sometimes one that does not)."""
    s = list(shape)
    roll = r.random()
    if roll < 0.4 or not s:
        return tuple(s) if r.random() < 0.8 else ()
    if roll < 0.7:
        i = r.randrange(len(s))
        s[i] = 1
        return tuple(s)
    if roll < 0.85:
        return tuple(s[r.randrange(len(s)):])
    s[r.randrange(len(s))] += 1  # a mismatch: both sides must raise
    return tuple(s)


# ---------------------------------------------------------------- ops
# Each generator returns (label, fn, inputs, ...): fn(*tensors) runs on either
# device; label names the call for the report and KNOWN.

def _dim(r, rank):
    return r.randrange(-max(rank, 1), max(rank, 1))


UNARY = ["abs", "neg", "sign", "sgn", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "floor", "ceil",
         "round", "trunc", "reciprocal", "bitwise_not", "logical_not", "isnan", "isinf", "isfinite", "nan_to_num",
         "relu", "erf", "square", "frac", "expm1", "log1p", "rsqrt", "signbit", "positive", "exp2", "log2"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum", "fmax",
          "fmin", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "hypot", "copysign", "true_divide"]


def gen_elementwise(r):
    torch = lazy_torch()
    a = new_input(r)
    roll = r.random()
    if roll < 0.4:
        name = r.choice(UNARY)
        return f"{name}", lambda x: getattr(torch, name)(x), [a]
    if roll < 0.85:
        name = r.choice(BINARY)
        if r.random() < 0.3:  # a Python number operand
            num = r.choice([2, -1, 0, 0.5, -2.5, True, math.inf])
            return f"{name}(t, {num})", lambda x: getattr(torch, name)(x, num), [a]
        b = new_input(r, broadcast_partner(r, a.shape))
        if r.random() < 0.5:
            b.dtype = a.dtype
        return name, lambda x, y: getattr(torch, name)(x, y), [a, b]
    kind = r.choice(["where", "clamp", "lerp", "addcmul"])
    if kind == "where":
        c = new_input(r, broadcast_partner(r, a.shape), ["bool"])
        b = new_input(r, broadcast_partner(r, a.shape))
        return "where", lambda cond, x, y: torch.where(cond, x, y), [c, a, b]
    if kind == "clamp":
        lo, hi = r.choice([(-1, 1), (0, None), (None, 2), (2, -2)])
        return f"clamp({lo}, {hi})", lambda x: torch.clamp(x, lo, hi), [a]
    b = new_input(r, a.shape, [a.dtype])
    if kind == "lerp":
        w = r.choice([0.25, 0.75])
        return f"lerp(w={w})", lambda x, y: torch.lerp(x, y, w), [a, b]
    c = new_input(r, a.shape, [a.dtype])
    return "addcmul", lambda x, y, z: torch.addcmul(x, y, z, value=0.5), [a, b, c]


REDUCE = ["sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "all", "any", "std", "var",
          "logsumexp", "cumsum", "cumprod", "nansum", "count_nonzero", "norm"]


def gen_reduce(r):
    torch = lazy_torch()
    a = new_input(r)
    name = r.choice(REDUCE)
    rank = len(a.shape)
    roll = r.random()
    if name in ("cumsum", "cumprod", "logsumexp") or roll < 0.6:
        d = _dim(r, rank)
        keep = r.random() < 0.3
        if name in ("cumsum", "cumprod", "count_nonzero"):
            return f"{name}(dim={d})", lambda x: getattr(torch, name)(x, d), [a]
        if name == "norm":
            return f"norm(dim={d})", lambda x: torch.norm(x, dim=d, keepdim=keep), [a]
        return f"{name}(dim={d}, keepdim={keep})", lambda x: getattr(torch, name)(x, d, keepdim=keep), [a]
    if roll < 0.75 and name in ("sum", "mean", "prod", "nansum"):
        dt = r.choice(["float32", "float64", "int64"])
        return f"{name}(dtype={dt})", lambda x: getattr(torch, name)(x, dtype=_dt(dt)), [a]
    if roll < 0.9 and name in ("sum", "mean", "amax", "amin", "std", "var", "nansum") and rank >= 2:
        dims = sorted(r.sample(range(rank), 2))
        return f"{name}(dims={dims})", lambda x: getattr(torch, name)(x, dims), [a]
    return name, lambda x: getattr(torch, name)(x), [a]


def _index_tensor(r, size, shape=None):
    torch = lazy_torch()
    shape = shape if shape is not None else r.choice([(), (0,), (1,), (3,), (2, 2)])
    n = math.prod(shape)
    if size == 0:
        vals = [0] * n if n else []
    else:
        vals = [r.randrange(-size, size) for _ in range(n)]
    if r.random() < 0.05 and n:  # out of range: both raise
        vals[0] = size + 2
    return torch.tensor(vals, dtype=torch.int64).reshape(shape)


class Extra:
    """An extra input made once per case (an index, a mask), the same tensor on both sides."""

    def __init__(self, t):
        self.t = t

    def __repr__(self):
        return f"tensor({self.t.tolist()}, dtype={self.t.dtype})"


def gen_index(r):
    torch = lazy_torch()
    a = new_input(r, r.choice([s for s in SHAPES if s]))
    shape = a.shape
    d = _dim(r, len(shape))
    size = shape[d]
    kind = r.choice(["int", "slice", "none_ellipsis", "adv", "adv2", "bool_self", "bool_mask", "index_select",
                     "masked_fill", "index_put", "masked_select", "take", "setitem_int", "setitem_slice"])
    if kind == "int":
        i = r.randrange(-size - 1, size + 1) if size else r.choice([0, -1])
        return f"x[{i}]", lambda x: x[i], [a]
    if kind == "slice":
        s, e, st = r.choice([None, 0, 1, -1, -3]), r.choice([None, 2, -1, 10]), r.choice([None, 1, 2, 3])
        return f"x[..., {s}:{e}:{st}]", lambda x: x[..., s:e:st], [a]
    if kind == "none_ellipsis":
        return "x[None, ..., 0]", lambda x: x[None, ..., 0], [a]
    if kind == "adv":
        idx = Extra(_index_tensor(r, shape[0]))
        return f"x[{idx}]", lambda x: x[idx.t.to(x.device)], [a]
    if kind == "adv2" and len(shape) >= 2:
        i0, i1 = Extra(_index_tensor(r, shape[0], (2,))), Extra(_index_tensor(r, shape[1], (1,)))
        return f"x[{i0}, :, {i1}]"[:0] + f"x[{i0}, {i1}]", \
            lambda x: x[i0.t.to(x.device), i1.t.to(x.device)], [a]
    if kind == "bool_self":
        return "x[x > 0]" if a.dtype != "complex64" else "x[x != 0]", \
            (lambda x: x[x > 0]) if a.dtype != "complex64" else (lambda x: x[x != 0]), [a]
    if kind == "bool_mask":
        m = Extra(make_tensor(r, shape[:1], "bool"))
        return f"x[{m}]", lambda x: x[m.t.to(x.device)], [a]
    if kind == "index_select":
        idx = Extra(_index_tensor(r, size, r.choice([(0,), (1,), (4,)])))
        return f"index_select({d}, {idx})", lambda x: torch.index_select(x, d, idx.t.to(x.device)), [a]
    if kind == "masked_fill":
        m = new_input(r, broadcast_partner(r, shape), ["bool"])
        v = r.choice([0, 1.5, -1, math.nan])
        return f"masked_fill({v})", lambda x, mm: x.masked_fill(mm, v), [a, m]
    if kind == "index_put":
        idx = Extra(_index_tensor(r, shape[0], (3,)))
        acc = r.random() < 0.5
        v = new_input(r, (3,) + shape[1:] if r.random() < 0.5 else (), [a.dtype])
        return f"index_put({idx}, accumulate={acc})", \
            lambda x, vv: x.clone().index_put_((idx.t.to(x.device),), vv, accumulate=acc), [a, v]
    if kind == "masked_select":
        m = new_input(r, broadcast_partner(r, shape), ["bool"])
        return "masked_select", lambda x, mm: torch.masked_select(x, mm), [a, m]
    if kind == "take":
        idx = Extra(_index_tensor(r, math.prod(shape), (3,)))
        return f"take({idx})", lambda x: torch.take(x, idx.t.to(x.device)), [a]
    if kind == "setitem_int":
        i = r.randrange(size) if size else 0
        def f(x):
            y = x.clone()
            y[i] = 7
            return y
        return f"x[{i}] = 7", f, [a]

    def g(x):
        y = x.clone()
        y[..., ::2] = 0
        return y
    return "x[..., ::2] = 0", g, [a]


def gen_views(r):
    torch = lazy_torch()
    a = new_input(r)
    shape = a.shape
    rank = len(shape)
    n = math.prod(shape)
    kind = r.choice(["reshape", "view", "transpose", "permute", "squeeze", "unsqueeze", "flatten", "expand",
                     "narrow", "unbind", "chunk", "split", "t", "movedim", "flip", "roll", "cat", "stack",
                     "view_dtype", "contiguous", "diagonal", "tril", "repeat", "unflatten"])
    if kind in ("reshape", "view"):
        tgt = r.choice([(-1,), (n,), (1, -1), (-1, 1), (n, 1, 1), (2, -1), ()])
        return f"{kind}{tgt}", lambda x: getattr(x, kind)(*tgt) if tgt else getattr(x, kind)(()), [a]
    if kind == "transpose":
        d0, d1 = _dim(r, rank), _dim(r, rank)
        return f"transpose({d0}, {d1})", lambda x: x.transpose(d0, d1), [a]
    if kind == "permute":
        p = list(range(rank))
        r.shuffle(p)
        return f"permute({p})", lambda x: x.permute(*p), [a]
    if kind == "squeeze":
        d = _dim(r, rank) if r.random() < 0.5 else None
        return f"squeeze({d})", (lambda x: x.squeeze(d)) if d is not None else (lambda x: x.squeeze()), [a]
    if kind == "unsqueeze":
        d = r.randrange(-rank - 1, rank + 1)
        return f"unsqueeze({d})", lambda x: x.unsqueeze(d), [a]
    if kind == "flatten":
        return "flatten", lambda x: x.flatten(), [a]
    if kind == "expand":
        tgt = (2,) + tuple(shape)
        return f"expand{tgt}", lambda x: x.expand(*tgt), [a]
    if kind == "narrow" and rank:
        d = _dim(r, rank)
        s = r.randrange(0, shape[d] + 1)
        ln = r.randrange(0, shape[d] - s + 1)
        return f"narrow({d}, {s}, {ln})", lambda x: x.narrow(d, s, ln), [a]
    if kind in ("unbind", "chunk", "split") and rank:
        d = _dim(r, rank)
        if kind == "unbind":
            return f"unbind({d})", lambda x: x.unbind(d), [a]
        k = r.choice([1, 2, 3])
        return f"{kind}({k}, {d})", lambda x: getattr(x, kind)(k, d), [a]
    if kind == "t" and rank <= 2:
        return "t", lambda x: x.t(), [a]
    if kind == "movedim" and rank:
        s, e = _dim(r, rank), _dim(r, rank)
        return f"movedim({s}, {e})", lambda x: x.movedim(s, e), [a]
    if kind == "flip":
        ds = [_dim(r, rank) for _ in range(r.choice([1, 2]))]
        return f"flip({ds})", lambda x: x.flip(*ds), [a]
    if kind == "roll" and rank:
        sh, d = r.randrange(-4, 5), _dim(r, rank)
        return f"roll({sh}, {d})", lambda x: torch.roll(x, sh, d), [a]
    if kind in ("cat", "stack"):
        b = new_input(r, shape if r.random() < 0.8 else broadcast_partner(r, shape))
        if r.random() < 0.5:
            b.dtype = a.dtype
        d = _dim(r, rank + (kind == "stack"))
        return f"{kind}(dim={d})", lambda x, y: getattr(torch, kind)([x, y], d), [a, b]
    if kind == "view_dtype":
        dt = r.choice(ALL)
        return f"view({dt})", lambda x: x.view(_dt(dt)), [a]
    if kind == "diagonal" and rank >= 2:
        off = r.randrange(-2, 3)
        return f"diagonal({off})", lambda x: x.diagonal(off), [a]
    if kind == "tril" and rank >= 2:
        k = r.randrange(-2, 3)
        return f"tril({k})", lambda x: x.tril(k), [a]
    if kind == "repeat":
        reps = (2,) * rank if rank else (2,)
        return f"repeat{reps}", lambda x: x.repeat(*reps), [a]
    if kind == "unflatten" and rank and shape[0] % 1 == 0:
        return "unflatten(0, (1, -1))", lambda x: x.unflatten(0, (1, -1)), [a]
    return "contiguous", lambda x: x.contiguous(), [a]


def gen_scatter(r):
    torch = lazy_torch()
    a = new_input(r, r.choice([s for s in SHAPES if s]))
    shape = a.shape
    rank = len(shape)
    d = _dim(r, rank)
    ishape = tuple(r.randint(0, s) for s in shape)
    idx = Extra(_index_tensor(r, shape[d], ishape))
    kind = r.choice(["gather", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy",
                     "scatter_value"])
    if kind == "gather":
        return f"gather({d}, {idx})", lambda x: torch.gather(x, d, idx.t.to(x.device)), [a]
    if kind in ("index_add", "index_copy"):
        i1 = Extra(_index_tensor(r, shape[d], (r.randint(0, 3),)))
        if kind == "index_copy":  # duplicates make the result order-dependent
            i1 = Extra(lazy_torch().randperm(shape[d])[:r.randint(0, shape[d])] if shape[d] else i1.t[:0])
        sshape = list(shape)
        sshape[d % rank] = i1.t.numel()
        src = new_input(r, tuple(sshape), [a.dtype])
        return f"{kind}({d}, {i1})", lambda x, s: getattr(x, kind)(d, i1.t.to(x.device), s), [a, src]
    if kind == "scatter_value":
        v = r.choice([1.0, -2, 0])
        return f"scatter({d}, {idx}, value={v})", lambda x: x.scatter(d, idx.t.to(x.device), v), [a]
    src = new_input(r, ishape, [a.dtype])
    if kind == "scatter":  # duplicate indices: which write wins is unspecified: no duplicates
        idx = Extra(_unique_per_slice(r, shape[d], ishape, d))
        return f"scatter({d}, {idx})", lambda x, s: x.scatter(d, idx.t.to(x.device), s), [a, src]
    if kind == "scatter_add":
        return f"scatter_add({d}, {idx})", lambda x, s: x.scatter_add(d, idx.t.to(x.device), s), [a, src]
    red = r.choice(["sum", "prod", "amax", "amin", "mean"])
    inc = r.random() < 0.5
    return f"scatter_reduce({d}, {red}, include_self={inc})", \
        lambda x, s: x.scatter_reduce(d, idx.t.to(x.device), s, red, include_self=inc), [a, src]


def _unique_per_slice(r, size, ishape, d):
    """int64 indices of ishape whose values along d are distinct (a permutation prefix)."""
    torch = lazy_torch()
    t = torch.zeros(ishape, dtype=torch.int64)
    if not t.numel():
        return t
    moved = t.movedim(d, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    for row in range(flat.shape[0]):
        perm = list(range(size))
        r.shuffle(perm)
        flat[row] = torch.tensor(perm[:flat.shape[1]])
    return flat.reshape(moved.shape).movedim(-1, d).contiguous()


def gen_order(r):
    torch = lazy_torch()
    a = new_input(r, None, [x for x in ALL if x != "complex64"])
    rank = len(a.shape)
    d = _dim(r, rank)
    kind = r.choice(["sort", "argsort", "topk", "unique", "msort", "kthvalue", "unique_consecutive"])
    if kind == "sort":
        desc = r.random() < 0.5
        return f"sort({d}, descending={desc}, stable)", \
            lambda x: torch.sort(x, dim=d, descending=desc, stable=True), [a]
    if kind == "argsort":
        return f"argsort({d}, stable)", lambda x: torch.argsort(x, dim=d, stable=True), [a]
    if kind == "topk":
        size = a.shape[d] if rank else 1
        k = r.randint(0, size + (r.random() < 0.05))
        largest = r.random() < 0.7
        return f"topk({k}, {d}, largest={largest}).values", \
            lambda x: torch.topk(x, k, dim=d, largest=largest).values, [a]
    if kind == "kthvalue":
        size = a.shape[d] if rank else 1
        k = r.randint(1, max(size, 1))
        return f"kthvalue({k}, {d}).values", lambda x: torch.kthvalue(x, k, d).values, [a]
    if kind == "unique":
        inv = r.random() < 0.5
        return f"unique(return_inverse={inv}, return_counts=True)", \
            lambda x: torch.unique(x, sorted=True, return_inverse=inv, return_counts=True), [a]
    if kind == "unique_consecutive":
        return "unique_consecutive", lambda x: torch.unique_consecutive(x), [a]
    return "msort", lambda x: torch.msort(x), [a]


def gen_matmul(r):
    torch = lazy_torch()
    dts = ["float32", "float64", "bfloat16", "float16", "int64", "complex64"]
    dt = r.choice(dts)
    m, k, n, b = (r.choice([0, 1, 2, 3, 5]) for _ in range(4))
    kind = r.choice(["matmul", "mm", "bmm", "mv", "dot", "matmul_batched", "addmm", "einsum"])
    if kind == "mm":
        shapes = [(m, k), (k, n)]
    elif kind == "bmm":
        shapes = [(b, m, k), (b, k, n)]
    elif kind == "mv":
        shapes = [(m, k), (k,)]
    elif kind == "dot":
        shapes = [(k,), (k,)]
    elif kind == "matmul_batched":
        shapes = [(b, 1, m, k), (3, k, n)]
    elif kind == "addmm":
        shapes = [(m, n) if r.random() < 0.5 else (n,), (m, k), (k, n)]
    elif kind == "einsum":
        shapes = [(b, m, k), (b, k, n)]
    else:
        shapes = r.choice([[(k,), (k, n)], [(m, k), (k,)], [(m, k), (k, n)], [(b, m, k), (k, n)], [(k,), (k,)]])
    if r.random() < 0.05:  # mismatched inner dims: both raise
        shapes[-1] = tuple(s + 1 for s in shapes[-1])
    ins = [Input(s, dt, pick_layout(r, s), r.randrange(1 << 30)) for s in shapes]
    for i in ins:  # fewer specials: matmul of inf and 0 makes NaN that differ in summation order
        i.dtype = dt
    if kind == "addmm":
        return "addmm", lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2), ins
    if kind == "einsum":
        return "einsum(bmk,bkn->bnm)", lambda x, y: torch.einsum("bmk,bkn->bnm", x, y), ins
    fn = {"matmul": torch.matmul, "matmul_batched": torch.matmul, "mm": torch.mm, "bmm": torch.bmm,
          "mv": torch.mv, "dot": torch.dot}[kind]
    return kind, lambda x, y: fn(x, y), ins


def gen_convert(r):
    torch = lazy_torch()
    a = new_input(r)
    to = r.choice(ALL)
    kind = r.choice(["to", "to", "type_as", "copy_", "method"])
    if kind == "to":
        return f"to({to})", lambda x: x.to(_dt(to)), [a]
    if kind == "type_as":
        b = new_input(r, (1,), [to])
        return f"type_as({to})", lambda x, y: x.type_as(y), [a, b]
    if kind == "copy_":
        b = new_input(r, broadcast_partner(r, a.shape), [to])
        return f"copy_ into {to}", lambda x, y: torch.empty(x.shape, dtype=y.dtype, device=x.device).copy_(
            y.expand(x.shape) if y.shape != x.shape else y), [a, b]
    m = r.choice(["float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool"])
    return f".{m}()", lambda x: getattr(x, m)(), [a]


FAMILIES = {"elementwise": gen_elementwise, "reduce": gen_reduce, "index": gen_index, "views": gen_views,
            "scatter": gen_scatter, "order": gen_order, "matmul": gen_matmul, "convert": gen_convert}


@dataclass
class Case:
    seed: int
    index: int
    family: str
    label: str
    fn: object
    inputs: list

    def __repr__(self):
        return f"case {self.seed}:{self.index} {self.family} {self.label} on {self.inputs}"


def make_case(seed: int, index: int) -> Case:
    r = random.Random(f"{seed}:{index}")
    fam = r.choice(list(FAMILIES))
    label, fn, inputs = FAMILIES[fam](r)
    return Case(seed, index, fam, label, fn, inputs)



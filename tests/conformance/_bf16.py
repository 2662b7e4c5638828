"""bfloat16 training conformance: PyTorch's OpInfo samples run forward and
backward in one graph on the xla device, judged against a float64 reference.

One case is one op in one run:

    "bf16"      the op's bfloat16 samples (inputs requiring grad), and for a
                few ops samples of ours where bf16 error grows with the inputs
                (_bf16_accuracy.py: judged by their largest errors, each
                output and gradient at most 2x CPU's against float64); outputs and
                the gradients of every floating input of
                loss = sum(output * w) over the floating outputs (w: fixed
                bf16 weights, so that softmax-like ops get a gradient that
                is not zero)
    "autocast"  the op's float32 samples under torch.autocast("xla",
                dtype=torch.bfloat16), for the ops whose traced graph
                autocast changes (a bf16 value in it); CPU's side runs
                under torch.autocast("cpu", dtype=torch.bfloat16)

Each sample runs three times: on the xla device (forward and gradients; a
case's samples traced one after the other and computed in one sync, or one
sync each where that sync fails, so that a failure is its sample's), in CPU eager at the same dtype (under CPU autocast in the
autocast run), and in CPU eager in float64 from the same inputs, bf16 or
float32 values widened exactly (float32 where the op has no float64
kernel): the judge. A floating tensor of ours passes where

    it is within bf16 tolerance of CPU's (atol 1e-2, rtol 1.6e-2), or
    its error against float64 is no worse than CPU's (up to SLACK, 1.25x),
    or within bf16 tolerance of float64: e(x) <= max(1.25 e(cpu), 1), where
    e is the largest |x - ref| / (atol + rtol |ref|) over the finite elements

(non-finite elements must be where CPU or float64 has them); integer and
bool tensors, dtypes, shapes and structure must equal CPU's, except that in
the autocast run a floating output may have another dtype than CPU's
(xla follows CUDA's cast lists, which lower more ops than CPU's: addmv,
addr, mv, einsum): noted in the record, judged by value. CPU's sort and
topk run with ties ordered as a stable sort (StableTies), the answer the
xla device gives; random ops are skipped (the float32 run checks their
shapes). Outcomes per
sample: pass, fallback (passes, through a counted CPU fallback), mismatch,
error. Each sample also records the relative L2 errors of ours and of CPU
against float64 over all its floating outputs and gradients, for the
accuracy report (report_bf16.py).

Env: TXC_BF16=on|off (default on; off collects nothing),
TXC_BF16_SAMPLES (bf16 samples per op, default 3), TXC_BF16_AUTOCAST_SAMPLES
(default 3). The whole run: 213 CPU-seconds on this host (439 + 26 ops).
"""
import os
import zlib

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import torch_xla_core as txc
from torch_xla_core._tracing import checks as _checks, tensor as _tensor

from . import _bf16_accuracy as accuracy
from ._opinfo import (CPU_ARGS, RANDOM, FetchError, computed_alone, computed_together, is_random, keep_traced,
                      message, op_db, op_id, reset, unhostable)

ENABLED = os.environ.get("TXC_BF16", "on") != "off"
SAMPLES = {"bf16": int(os.environ.get("TXC_BF16_SAMPLES", "3")),
           "autocast": int(os.environ.get("TXC_BF16_AUTOCAST_SAMPLES", "3"))}
ATOL, RTOL = 1e-2, 1.6e-2
# "no worse than CPU" up to this factor: the same precision summed in another
# order moves the largest error of a sample by that much (a conv_transpose3d
# weight gradient under autocast: 10.6x tolerance, CPU's 9.8x)
SLACK = 1.25
BF16 = torch.bfloat16
aten = torch.ops.aten


def _skip_reason(op):
    why = unhostable(op)
    if why:
        return why
    if op_id(op) in RANDOM or op.name in RANDOM:
        return "random: values come from a random stream (the float32 run checks shapes)"
    return None


def cases(run):
    """(op, skip reason or None) for every op of the run: bf16 forward and
    backward supported on CPU (bf16), float32 ones (autocast)."""
    if not ENABLED:
        return []
    dtype = BF16 if run == "bf16" else torch.float32
    return [(op, _skip_reason(op)) for op in op_db
            if dtype in op.supported_dtypes("cpu") and dtype in op.supported_backward_dtypes("cpu")]


# --- copying a sample ----------------------------------------------------------

def _copy(s, device=None, widen=None, op_name=""):
    """(input, args, kwargs) of sample s: tensors copied as leaves (to
    device); with widen=dtype, floating tensors (and dtype arguments) of the
    sample's float dtypes become that dtype (exactly: bf16/float32 values are
    float64 values)."""
    def f(x):
        if isinstance(x, torch.Tensor):
            c = x.detach()
            if widen is not None and c.dtype in (BF16, torch.float16, torch.float32):
                c = c.to(widen)
            c = c.clone() if device is None else c.to(device)
            return c.requires_grad_(x.requires_grad) if (c.is_floating_point() or c.is_complex()) else c
        if widen is not None and x in (BF16, torch.float32) and isinstance(x, torch.dtype):
            return widen
        if device is not None and (x == "cpu" if isinstance(x, str) else
                                   isinstance(x, torch.device) and x.type == "cpu"):
            return device
        return x
    inp, args, kwargs = pytree.tree_map(f, (s.input, s.args, s.kwargs))
    for i in CPU_ARGS.get(op_name, ()) if device is not None else ():
        if isinstance(s.args[i], torch.Tensor):
            args = args[:i] + (s.args[i].detach().clone(),) + args[i + 1:]
    return inp, args, kwargs


def _leaves(side):
    return [t for t in pytree.tree_leaves(side) if isinstance(t, torch.Tensor) and t.requires_grad]


def _run(op, s, side, weights):
    """Outputs (processed as the sample says) and gradients of
    sum(output * w) over floating differentiable outputs; weights: a list
    filled on the first call (CPU), reused by the others."""
    out = s.output_process_fn_grad(op(side[0], *side[1], **side[2]))
    diff = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
            and t.is_floating_point()]
    leaves = _leaves(side)
    grads = None
    if diff and leaves:
        if not weights:
            g = torch.Generator().manual_seed(0)
            weights.extend(torch.randn(o.shape, generator=g).to(BF16) for o in diff)
        if len(weights) != len(diff):
            raise Mismatch(f"{len(diff)} differentiable outputs, {len(weights)} on cpu")
        loss = sum((o * w.to(o.device, o.dtype)).sum() for o, w in zip(diff, weights))
        grads = list(torch.autograd.grad(loss, leaves, allow_unused=True))
    return out, grads


# --- ties ---------------------------------------------------------------------

class StableTies(TorchDispatchMode):
    """CPU's sort and topk with ties ordered as a stable sort orders them:
    one of the answers torch allows an unstable sort (and topk), and the one
    the xla device gives (its sort is always stable). Without it, which of
    equal bf16 values' indices CPU returns (and so where their gradients go)
    is unspecified; stable=True calls are unchanged."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.sort.default:
            x, dim, desc = (list(args) + [-1, False][len(args) - 1:])[:3]
            return aten.sort.stable(x, stable=True, dim=dim, descending=desc)
        if func is aten.sort.stable and not kwargs.get("stable"):
            return aten.sort.stable(*args, **{**kwargs, "stable": True})
        if func is aten.topk.default:
            a = dict(zip(("self", "k", "dim", "largest", "sorted"), args), **kwargs)
            x, k, dim = a["self"], a["k"], a.get("dim", -1)
            v, i = aten.sort.stable(x, stable=True, dim=dim, descending=a.get("largest", True))
            if x.dim() == 0:
                return v, i
            return aten.slice.Tensor(v, dim, 0, k).clone(), aten.slice.Tensor(i, dim, 0, k).clone()
        return func(*args, **kwargs)


# --- judging -------------------------------------------------------------------

class Mismatch(Exception):
    pass


def scaled_error(x, ref):
    """max |x - ref| / (atol + rtol |ref|) over the elements where ref and x
    are finite (float64), and whether x is non-finite where ref is finite."""
    x, ref = x.double(), ref.double()
    fin = torch.isfinite(ref)
    bad = bool((~torch.isfinite(x) & fin).any())
    if not fin.any():
        return 0.0, bad
    d = ((x - ref).abs() / (ATOL + RTOL * ref.abs()))[fin & torch.isfinite(x)]
    return (float(d.max()) if d.numel() else 0.0), bad


def judge(x, c, ref, where, policies=None, elementwise=True):
    """Raises Mismatch unless ours (x) passes against CPU (c) and the float64
    reference (ref); returns (our scaled error, CPU's scaled error).
    policies: a list to note floating dtypes that differ (the autocast run:
    CUDA's cast lists, which xla follows, lower more ops than CPU's) in,
    instead of failing on them. elementwise=False leaves out the scaled
    error's bound (compare()'s strict samples are judged by their largest
    error instead: near-zero elements of a long sum, in the gradients of
    large samples, are rounding noise in both)."""
    if policies is not None and x.shape == c.shape and x.dtype != c.dtype and x.is_floating_point() \
            and c.is_floating_point():
        policies.append(f"{where}: xla {str(x.dtype)[6:]}, cpu {str(c.dtype)[6:]}")
        x = x.to(c.dtype) if c.dtype.itemsize < x.dtype.itemsize else x
        c = c.to(x.dtype)
    if (x.shape, x.dtype) != (c.shape, c.dtype):
        raise Mismatch(f"{where}: xla {x.dtype}{list(x.shape)} vs cpu {c.dtype}{list(c.shape)}")
    if not x.is_floating_point():
        if not torch.equal(x, c):
            n = int((x != c).sum())
            raise Mismatch(f"{where}: {n} of {x.numel()} {x.dtype} elements differ from cpu")
        return 0.0, 0.0
    if ref is None or ref.shape != x.shape:
        ref = c
    ex, xbad = scaled_error(x, ref)
    ec, cbad = scaled_error(c, ref)
    if torch.allclose(x.double(), c.double(), atol=ATOL, rtol=RTOL, equal_nan=True):
        return ex, ec
    # non-finite elements: ours must have CPU's or the reference's there
    nf = ~torch.isfinite(c) | ~torch.isfinite(ref)
    x64, c64, r64 = x.double()[nf], c.double()[nf], ref.double()[nf]
    same = (x64 == c64) | (x64 == r64) | (x64.isnan() & (c64.isnan() | r64.isnan()))
    if not bool(same.all()) or (xbad and not cbad):
        raise Mismatch(f"{where}: non-finite values where cpu/float64 have others")
    if elementwise and ex > max(SLACK * ec, 1.0):
        i = int(((x.double() - c.double()).abs() - ATOL - RTOL * c.double().abs()).argmax())
        raise Mismatch(f"{where}: error vs float64 {ex:.3g} x tolerance, cpu's {ec:.3g} "
                       f"(e.g. [{i}]: xla {x.flatten()[i].item():.5g}, cpu {c.flatten()[i].item():.5g}, "
                       f"float64 {ref.flatten()[i].item():.5g})")
    return ex, ec


def _rel_l2(pairs):
    """relative L2 error of the first tensors of pairs against the second."""
    num = sum(float(((a.double() - r.double())[torch.isfinite(r)] ** 2).sum()) for a, r in pairs)
    den = sum(float((r.double()[torch.isfinite(r)] ** 2).sum()) for _, r in pairs)
    return (num / den) ** 0.5 if den > 0 else num ** 0.5


def _flat(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)] if tree is not None else []


def compare(xla, cpu, ref, policies=None, strict=None):
    """Judges (outputs, grads) of xla against cpu and the float64 ref;
    returns (our relative L2 error, CPU's) over the floating tensors.
    strict: a factor; then each tensor's largest error against float64 must
    be at most that many times CPU's (or one bf16 rounding of its largest
    value, the least a bf16 result can promise), instead of judge()'s
    elementwise bound."""
    (ox, gx), (oc, gc), (orf, gr) = xla, cpu, ref
    fx, sx = pytree.tree_flatten(ox)
    fc, sc = pytree.tree_flatten(oc)
    if sx != sc:
        raise Mismatch(f"output structure: xla {sx} vs cpu {sc}")
    fr = pytree.tree_leaves(orf) if orf is not None else [None] * len(fc)
    if len(fr) != len(fc):
        fr = [None] * len(fc)
    ours, theirs, names = [], [], []
    for i, (a, c, r) in enumerate(zip(fx, fc, fr)):
        where = f"output[{i}]" if len(fc) > 1 else "output"
        if isinstance(c, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.device.type != "xla":
                raise Mismatch(f"{where}: xla gave {type(a).__name__} on {getattr(a, 'device', None)}")
            a = a.detach().cpu()
            c = c.detach()
            r = r.detach() if isinstance(r, torch.Tensor) else None
            judge(a, c, r, where, policies, strict is None)
            if c.is_floating_point() and r is not None and r.shape == c.shape:
                ours.append((a, r))
                theirs.append((c, r))
                names.append(where)
        elif not (a == c or (isinstance(c, float) and c != c and a != a)):
            if not (isinstance(c, float) and abs(a - c) <= ATOL + RTOL * abs(c)):
                raise Mismatch(f"{where}: xla {a!r} vs cpu {c!r}")
    if (gx is None) != (gc is None) or (gc is not None and len(gx) != len(gc)):
        raise Mismatch(f"gradients: xla {gx is not None}, cpu {gc is not None}")
    for i, (a, c, r) in enumerate(zip(gx or [], gc or [], gr or [None] * len(gc or []))):
        if (a is None) != (c is None):
            raise Mismatch(f"grad[{i}]: xla {'None' if a is None else 'a tensor'}, "
                           f"cpu {'None' if c is None else 'a tensor'}")
        if c is None:
            continue
        a = a.cpu()
        judge(a, c, r, f"grad[{i}]", policies, strict is None)
        if r is not None and r.shape == c.shape:
            ours.append((a, r))
            theirs.append((c, r))
            names.append(f"grad[{i}]")
    if strict is not None:
        _no_worse(names, ours, theirs, strict)
    if not ours:
        return None, None
    return _rel_l2(ours), _rel_l2(theirs)


def _no_worse(names, ours, theirs, factor):
    """Raises Mismatch where a tensor's largest error against float64 is
    more than factor times CPU's (floor: one bf16 rounding of its largest
    value)."""
    def err(x, r):
        fin = torch.isfinite(r)
        return float((x.double() - r.double())[fin].abs().max()) if fin.any() else 0.0
    for where, (a, r), (c, _) in zip(names, ours, theirs):
        fin = torch.isfinite(r)
        floor = 2.0 ** -9 * float(r.double()[fin].abs().max()) if fin.any() else 0.0
        ex, ec = err(a, r), err(c, r)
        if ex > factor * max(ec, floor):
            raise Mismatch(f"{where}: largest error vs float64 {ex:.3g}, more than {factor:g}x CPU bf16's {ec:.3g}")


# --- running -------------------------------------------------------------------

def _reference(op, s, weights):
    for wide in (torch.float64, torch.float32):
        try:
            with StableTies():
                return _run(op, s, _copy(s, widen=wide), weights)
        except Exception:  # noqa: BLE001 - no kernel in that dtype: try the next
            continue
    return None, None


def run_sample(op, s, run, strict=None):
    """(outcome, message, our rel. L2 error, CPU's) for one sample, or None
    when CPU eager rejects it; strict: compare()'s."""
    return computed_alone(_trace_sample(op, s, run, strict), _judge_sample, pad=(None, None))


def _trace_sample(op, s, run, strict):
    """One sample run on CPU (and float64) and traced on xla, not computed:
    None when CPU eager rejects it, ("error", message, None, None) when
    tracing raised (the caller resets), else the state _judge_sample takes."""
    weights = []
    autocast = run == "autocast"
    cpu = _copy(s)
    try:
        with torch.autocast("cpu", dtype=BF16, enabled=autocast), StableTies():
            cpu_res = _run(op, s, cpu, weights)
    except Exception:  # noqa: BLE001 - not a case CPU eager runs
        return None
    ref = _reference(op, s, weights)
    xla = _copy(s, txc.device(), op_name=op.name)
    before = dict(txc.metrics.fallbacks())
    try:
        with torch.autocast("xla", dtype=BF16, enabled=autocast):
            xla_res = _run(op, s, xla, weights)
    except Exception as e:  # noqa: BLE001 - any exception is the sample's outcome
        msg = message(e)
        del e
        return "error", msg, None, None
    fallbacks = sorted(k for k, v in txc.metrics.fallbacks().items() if v != before.get(k, 0))
    return "traced", xla_res, cpu_res, ref, [] if autocast else None, strict, fallbacks


def _judge_sample(traced):
    """The outcome of a traced sample whose values are computed; raises
    FetchError where reading a value fails."""
    _, xla_res, cpu_res, ref, policies, strict, fallbacks = traced
    try:
        ex, ec = compare(xla_res, cpu_res, ref, policies, strict)
    except Mismatch as m:
        return "mismatch", str(m), None, None
    except Exception as e:  # noqa: BLE001 - fetching the value failed
        raise FetchError("fetching the result: " + message(e)) from None
    if fallbacks:
        return "fallback", "CPU fallback: " + ", ".join(fallbacks), ex, ec
    return "pass", "; ".join(policies or ()), ex, ec


def _seed(i):
    """The seed set before sample i (an OpInfo sample's index, or "large<j>")."""
    return i if isinstance(i, int) else int(i.removeprefix("large"))


def _traced(op, s, autocast):
    """Whether the sample's traced graph holds a bf16 value (or "error")."""
    xla = _copy(s, txc.device(), op_name=op.name)
    try:
        with torch.autocast("xla", dtype=BF16, enabled=autocast):
            out = op(xla[0], *xla[1], **xla[2])
        ts = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "xla"]
        return bool(ts) and ("bfloat16" in txc.debug.graph_text(ts))
    except Exception:  # noqa: BLE001 - judged by the run itself
        return "error"
    finally:
        reset()


def autocast_changes(op, s):
    """Whether autocast changes what the sample traces on xla (a bf16 value
    in its graph, or an error, where there is none without autocast): the
    ops autocast covers, on float32 inputs."""
    with_autocast = _traced(op, s, True)
    return bool(with_autocast) and with_autocast != _traced(op, s, False)


def run_case(op, run, max_samples=None):
    """Runs the op's samples; returns [(index, outcome, message, ours, cpu's)].
    The autocast run returns None when autocast leaves the op's first
    sample unchanged. The samples are traced in turn and computed together
    (computed_together), one by one where that fails."""
    max_samples = SAMPLES[run] if max_samples is None else max_samples
    dtype = BF16 if run == "bf16" else torch.float32
    torch.manual_seed(zlib.crc32(op_id(op).encode()))
    warned = set(_tensor._warned)
    try:
        picked, traced = [], []  # the samples CPU eager runs (up to max_samples), their traces

        def trace(i, s, strict):
            t = _trace_sample(op, s, run, strict)
            if t is not None:
                picked.append((i, s, strict))
                keep_traced(traced, i, t)

        samples = op.sample_inputs("cpu", dtype, requires_grad=True)
        for i, s in enumerate(samples):
            if len(picked) >= max_samples or i >= 4 * max_samples + 4:
                break
            if is_random(op, s):
                continue
            torch.manual_seed(i)
            if run == "autocast" and not picked and not autocast_changes(op, s):  # (nothing traced yet to reset)
                return None
            trace(i, s, None)
        for j, s in enumerate(accuracy.samples(op_id(op)) if run == "bf16" else ()):
            torch.manual_seed(j)
            trace(f"large{j}", s, accuracy.STRICT)
        results = computed_together(traced, _judge_sample)
        if results is None:
            results = []
            for i, s, strict in picked:
                torch.manual_seed(_seed(i))
                r = run_sample(op, s, run, strict=strict)
                if r is not None:
                    results.append((i, *r))
    finally:
        txc._C.take_handler_error()
        _tensor._warned.intersection_update(warned)
        _checks.clear()
    return results


# --- op families (the accuracy report's rows) -------------------------------------

_MATMUL = {"mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "addr", "matmul", "__rmatmul__", "mv", "dot", "vdot",
           "inner", "outer", "ger", "tensordot", "einsum", "chain_matmul", "kron", "nn.functional.linear",
           "nn.functional.bilinear", "corrcoef", "cov", "trace", "cdist", "pdist", "nn.functional.pdist"}
_SORT = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "searchsorted", "unique",
         "unique_consecutive", "max", "min", "amax", "amin", "argmax", "argmin", "aminmax", "cummax", "cummin"}
_FAMILIES = (  # (family, predicate on (name, OpInfo class name)), first match
    ("fft", lambda n, c: n.startswith("fft.") or c == "SpectralFuncInfo" or n in ("stft", "istft")),
    ("linalg", lambda n, c: n.startswith("linalg.") or n in (
        "cholesky", "cholesky_inverse", "cholesky_solve", "lu", "lu_solve", "lu_unpack", "qr", "svd", "pinverse",
        "det", "logdet", "inverse", "matrix_exp", "triangular_solve", "geqrf", "ormqr", "householder_product",
        "symeig", "pca_lowrank", "svd_lowrank")),
    ("matmul", lambda n, c: n in _MATMUL),
    ("convolution", lambda n, c: "conv" in n and n.startswith("nn.functional.")),
    ("pooling", lambda n, c: "pool" in n),
    ("normalization", lambda n, c: "batch_norm" in n or (("norm" in n) and n.startswith(("nn.functional.",
                                                                                          "native_layer")))),
    ("loss", lambda n, c: "loss" in n or n.endswith("cross_entropy") or n.endswith("nll")),
    ("sampling", lambda n, c: any(k in n for k in ("interpolate", "upsample", "grid_sample", "affine_grid",
                                                  "pixel_shuffle", "pixel_unshuffle"))),
    ("attention", lambda n, c: "attention" in n),
    ("softmax", lambda n, c: "softmax" in n or n in ("logsumexp", "nn.functional.softmin", "logcumsumexp")),
    ("sort & select", lambda n, c: n in _SORT),
    ("reduction", lambda n, c: c == "ReductionOpInfo" or n in (
        "sum", "mean", "prod", "var", "std", "var_mean", "std_mean", "norm", "renorm", "cumsum", "cumprod",
        "cumulative_trapezoid", "trapezoid", "trapz", "nansum", "nanmean", "dist", "diff")),
    ("indexing", lambda n, c: any(k in n for k in ("index", "scatter", "gather", "take", "put", "masked",
                                                  "embedding", "select", "where", "nonzero", "slice"))),
    ("special", lambda n, c: n.startswith("special.") or n in ("polygamma", "mvlgamma", "lgamma", "digamma")),
    ("activation", lambda n, c: n.startswith("nn.functional.") and c == "UnaryUfuncInfo" or n in (
        "nn.functional.gelu", "nn.functional.silu", "nn.functional.mish", "nn.functional.glu", "nn.functional.elu",
        "nn.functional.celu", "nn.functional.selu", "nn.functional.prelu", "nn.functional.rrelu",
        "nn.functional.leaky_relu", "nn.functional.hardtanh", "nn.functional.threshold", "nn.functional.softplus",
        "nn.functional.softshrink", "nn.functional.hardshrink", "nn.functional.tanhshrink",
        "nn.functional.logsigmoid", "nn.functional.hardswish", "nn.functional.hardsigmoid", "sigmoid", "tanh")),
    ("elementwise unary", lambda n, c: c == "UnaryUfuncInfo"),
    ("elementwise binary", lambda n, c: c == "BinaryUfuncInfo" or n in (
        "addcmul", "addcdiv", "lerp", "clamp", "clip", "where", "cross", "linalg.cross", "hypot", "ldexp")),
    ("nn (other)", lambda n, c: n.startswith("nn.functional.")),
)


def family(op):
    """The op's family in the accuracy report."""
    n, c = op.name, type(op).__name__
    return next((f for f, pred in _FAMILIES if pred(n, c)), "shape & other")

"""PyTorch's own OpInfo samples run on the xla device against CPU eager.

One *case* is (op, dtype, direction): run_case() takes the op's samples
(`OpInfo.sample_inputs("cpu", dtype)`, generated with a seed fixed per op),
runs each on a CPU copy and on an xla copy of the inputs and classifies it:

    pass      outputs (and inputs an op mutated) agree with CPU eager
    fallback  they agree, but an aten op ran through the counted CPU fallback
    mismatch  values, dtypes, shapes or structure differ
    error     the xla side raised (or a deferred check did at the sync)

Forward compares outputs and every input tensor after the call (in-place
ops); a case's forward samples are traced one after the other and computed
in one sync (one compile per case: XLA:CPU's compile of a tiny graph is
most of a sample's time), or one sync each where that sync fails, so that
a failure is its sample's; backward compares the gradients of sum(outputs * fixed random weights)
w.r.t. the inputs that require grad (a complex output enters the sum as its
view_as_real). Random ops (RANDOM) are compared by
shape, dtype and device only. Tolerances: the OpInfo's own CPU overrides for
the dtype where it declares any, else FLOOR_TOL; never below FLOOR_TOL.

Mode (env TXC_CONFORMANCE): "ci" (default): float32 and int64 forward on the
first 16 samples of each op plus the first applicable float32 backward
sample (a float output of an int64 case is compared with the float
tolerance); "full": every
sample forward and backward in float32, bfloat16 and int64 where the op
supports the dtype;
"off": nothing is collected. TXC_CONFORMANCE_MAX_SAMPLES bounds the samples
per case (0 = all; default 16 in ci mode, 0 in full mode).
"""
import gc
import os
import zlib

import pytest
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db

import torch_xla_core as txc
from torch_xla_core._tracing import checks as _checks, tensor as _tensor

# op_db is a few hundred thousand objects that live as long as the process: a
# full garbage collection walked them in ~0.7 s (after every failed sample,
# and whenever the collector ran on its own). Frozen, they are skipped.
gc.freeze()

MODE = os.environ.get("TXC_CONFORMANCE", "ci")
# CI mode runs the first 16 forward samples of an op (a few ops have hundreds:
# max_pool2d 1440, logspace 1201); full mode all of them.
MAX_SAMPLES = int(os.environ.get("TXC_CONFORMANCE_MAX_SAMPLES", "16" if MODE == "ci" else "0"))
DTYPES = {"ci": (torch.float32, torch.int64), "full": (torch.float32, torch.bfloat16, torch.int64), "off": ()}

# (atol, rtol): XLA:CPU's transcendental approximations and summation order
# differ from ATen's by a few ulps, and convolutions accumulate in another
# order (conv2d, conv_transpose3d: up to 5e-5 apart on values of order 10).
FLOOR_TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (1e-2, 1.6e-2), torch.complex64: (1e-4, 1e-5),
             torch.float64: (1e-7, 1e-7),
             torch.complex128: (1e-7, 1e-7)}

# Backward (atol, rtol) where the CPU reference computes with another
# algorithm than XLA, so float32 results differ by more than rounding order:
# matrix_exp is jax's Pade-13 against ATen's Taylor-18 (the forward is an
# expected mismatch; the backward's 25 entries of order 50 differ by up to
# 6e-3 on an AMD EPYC host, 1.2e-4 relative, where MKL's code paths move
# ATen's reference itself).
BWD_TOL = {"matrix_exp": (1e-2, 1e-3)}

# Ops whose values depend on a random stream (or are uninitialized memory):
# compared by shape/dtype/device only. test_opinfo checks every name exists.
RANDOM = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
    "normal", "normal.number_mean", "normal.in_place", "uniform",
    "rand_like", "randn_like", "randint_like", "randint", "randn",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "empty_permuted", "pca_lowrank", "svd_lowrank",
}


# Ops random only for some samples: a predicate on the SampleInput.
RANDOM_WHEN = {
    # dropout_p is positional arg 9 (after query, the input): random in training
    "nn.functional.multi_head_attention_forward": lambda s: s.args[9] > 0 and s.kwargs.get("training", True),
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
}


def is_random(op, s):
    """Whether sample s of op draws random numbers."""
    oid = op_id(op)
    if oid in RANDOM or op.name in RANDOM:
        return True
    return bool(RANDOM_WHEN[oid](s)) if oid in RANDOM_WHEN else False


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def unhostable(op):
    """Why the device cannot host this op meaningfully, or None."""
    name = op.name
    if "sparse" in name or name.startswith(("to_sparse", "_segment")):
        return "sparse layouts are not supported on xla"
    if name.startswith(("cuda", "jiterator", "_jiterator")) or "cuda" in op.variant_test_name:
        return "needs CUDA"
    return None


def cases(mode=MODE):
    """(op, dtype, direction, skip reason or None) for every case of the mode."""
    out = []
    for op in op_db:
        fwd = op.supported_dtypes("cpu")
        bwd = op.supported_backward_dtypes("cpu")
        why = unhostable(op)
        for dtype in DTYPES.get(mode, ()):
            if dtype in fwd:
                out.append((op, dtype, "fwd", why))
            if dtype in bwd and dtype.is_floating_point:
                out.append((op, dtype, "bwd", why))
    return out


def tolerance(op, dtype):
    atol, rtol = FLOOR_TOL.get(dtype, (0, 0))
    for info in op.decorators:
        decs = getattr(info, "decorators", [info])
        if getattr(info, "device_type", None) not in (None, "cpu") or not getattr(info, "active_if", True):
            continue
        for d in decs:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
            elif isinstance(d, precisionOverride) and dtype in d.d:
                atol = max(atol, d.d[dtype])
    return atol, rtol


# --- moving a sample --------------------------------------------------------

def _leaf(t, device):
    """A detached copy of t on device, requiring grad as t does (a leaf)."""
    c = t.detach().clone() if device is None else t.detach().to(device)
    return c.requires_grad_(t.requires_grad) if (t.is_floating_point() or t.is_complex()) else c


def copy_sample(s, device=None, op_name=""):
    """(input, args, kwargs) of SampleInput s, tensors copied (to device).
    Moving to a device also points the sample's CPU device arguments
    (factory functions' device=, Tensor.to(device)) at it."""
    def f(x):
        if isinstance(x, torch.Tensor):
            return _leaf(x, device)
        if device is not None and (x == "cpu" if isinstance(x, str) else
                                   isinstance(x, torch.device) and x.type == "cpu"):
            return device
        return x
    inp, args, kwargs = pytree.tree_map(f, (s.input, s.args, s.kwargs))
    for i in CPU_ARGS.get(op_name, ()) if device is not None else ():
        if isinstance(s.args[i], torch.Tensor):
            args = args[:i] + (_leaf(s.args[i], None),) + args[i + 1:]
    return inp, args, kwargs


# Positional args that torch requires on the CPU whatever the input's device
# (OpInfo's sample functions make them there on every device).
CPU_ARGS = {"tensor_split": (0,)}


def tensors(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


# --- comparing ---------------------------------------------------------------

class Mismatch(Exception):
    pass


def compare(actual, expected, atol, rtol, random, what="output"):
    fa, sa = pytree.tree_flatten(actual)
    fe, se = pytree.tree_flatten(expected)
    if sa != se:
        raise Mismatch(f"{what} structure: xla {sa} vs cpu {se}")
    for i, (a, e) in enumerate(zip(fa, fe)):
        where = f"{what}[{i}]" if len(fe) > 1 else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}: xla gave {type(a).__name__}, cpu a tensor")
            if a.device.type != "xla":
                raise Mismatch(f"{where}: on {a.device}, not xla")
            a = a.cpu().detach()  # detach() first would make a view: one more graph
            e = e.detach()
            if random:
                if (a.shape, a.dtype) != (e.shape, e.dtype):
                    raise Mismatch(f"{where}: xla {a.dtype}{list(a.shape)} vs cpu {e.dtype}{list(e.shape)}")
                continue
            floor = FLOOR_TOL.get(e.dtype, (0, 0))  # (an int64 case's float output: float tolerance)
            try:
                torch.testing.assert_close(a, e, atol=max(atol, floor[0]), rtol=max(rtol, floor[1]), equal_nan=True)
            except AssertionError as err:
                raise Mismatch(f"{where}: " + " ".join(str(err).split())[:400]) from None
        elif not (a == e or (isinstance(e, float) and e != e and a != a)):
            raise Mismatch(f"{where}: xla {a!r} vs cpu {e!r}")


# --- running -----------------------------------------------------------------

def reset():
    """After an xla failure: drop its deferred checks and its traced garbage,
    so it cannot poison the next sample. The dispatcher keeps the last
    exception a handler raised (for loss.backward()); its traceback keeps the
    failed op's tensors alive, and the next txc.sync() would compute them."""
    _checks.clear()
    txc._C.take_handler_error()
    gc.collect()


def _fallbacks():
    return dict(txc.metrics.fallbacks())


def _new_fallbacks(before):
    return sorted(k for k, v in txc.metrics.fallbacks().items() if v != before.get(k, 0))


def message(e, context=""):
    """An xla failure as one line: its type (and where it happened), then at
    most 300 characters of its message."""
    return f"{type(e).__name__}{context}: {' '.join(str(e).split())[:300]}"


def _verdict(before):
    """The outcome of a sample that ran: "fallback" if an op fell back to the
    CPU since `before`, else "pass"."""
    fb = _new_fallbacks(before)
    return ("fallback", "CPU fallback: " + ", ".join(fb)) if fb else ("pass", "")


def run_forward(op, s, dtype, random):
    """(outcome, message) for one sample, or None if CPU eager rejects it."""
    return computed_alone(_trace_forward(op, s, random), lambda t: _judge_forward(op, dtype, t))


class FetchError(Exception):
    """Fetching a traced sample's value failed (its message is the outcome's)."""


def computed_alone(traced, judge, pad=()):
    """A traced sample (a trace function's result: None, ("error", message,
    ...) or its state for judge) computed by a sync of its own and judged:
    its outcome tuple, ("error", message, *pad) where the sync or a value
    read raised (judge raises FetchError for a read); None passes through."""
    if traced is None or traced[0] == "error":
        if traced is not None:
            reset()
        return traced
    try:
        txc.sync(wait=True)
        return judge(traced)
    except FetchError as e:
        reset()
        return "error", str(e), *pad
    except Exception as e:  # noqa: BLE001 - any exception is the sample's outcome
        msg = message(e)
        del e
        reset()
        return "error", msg, *pad


def keep_traced(traced, i, t):
    """Adds sample i's trace t (None: not a case) to the samples to be
    computed together. After a trace error only the handler's error (whose
    traceback holds the failed op's tensors) is let go, not the deferred
    checks of the samples traced before it."""
    if t is None:
        return
    if t[0] == "error":
        txc._C.take_handler_error()
        gc.collect()
    traced.append((i, t))


def computed_together(traced, judge):
    """The traced samples [(index, traced)] computed in ONE sync (one
    compile, not one per sample: XLA:CPU's compile of a tiny graph is most
    of a sample's time) and judged: [(index, *outcome)]. None when the sync
    or a value read raised (the state reset): the caller then computes the
    samples alone (computed_alone), so that a failure is its sample's."""
    try:
        txc.sync(wait=True)
        return [(i, *(t if t[0] == "error" else judge(t))) for i, t in traced]
    except Exception:  # noqa: BLE001 - whichever sample it was: one by one finds it
        reset()
        return None


def _trace_forward(op, s, random):
    """One sample traced on xla, not computed: None if CPU eager rejects it,
    ("error", message) if tracing raised (the caller resets), else
    ("traced", xla side, cpu side, xla result, cpu result, new fallbacks, random)."""
    cpu = copy_sample(s)
    try:
        expected = op(cpu[0], *cpu[1], **cpu[2])
    except Exception:
        return None
    xla = copy_sample(s, txc.device(), op.name)
    before = _fallbacks()
    try:
        actual = op(xla[0], *xla[1], **xla[2])
    except Exception as e:  # noqa: BLE001 - any exception is the sample's outcome
        msg = message(e)
        del e
        return "error", msg
    return "traced", xla, cpu, actual, expected, _new_fallbacks(before), random


def _judge_forward(op, dtype, traced):
    """(outcome, message) of a traced sample whose values are computed;
    raises FetchError where reading a value fails."""
    _, xla, cpu, actual, expected, fallbacks, random = traced
    atol, rtol = tolerance(op, dtype)
    try:
        compare(actual, expected, atol, rtol, random)
        kept = [(x, c) for x, c in zip(tensors(xla), tensors(cpu)) if x.device.type == "xla"]
        compare([x for x, _ in kept], [c for _, c in kept], atol, rtol, random, what="input after the call")
    except Mismatch as m:
        return "mismatch", str(m)
    except Exception as e:  # noqa: BLE001 - fetching the value failed
        raise FetchError(message(e, " fetching the result")) from None
    return ("fallback", "CPU fallback: " + ", ".join(fallbacks)) if fallbacks else ("pass", "")


def _grad_outputs(op, s, side):
    """The differentiable outputs, complex ones as their real view (so the
    loss is real and the gradient flows through the complex path)."""
    out = s.output_process_fn_grad(op(side[0], *side[1], **side[2]))
    return [torch.view_as_real(t.resolve_conj()) if t.is_complex() else t for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]


def run_backward(op, s, dtype, random):
    """(outcome, message) for one sample, or None where it is not applicable
    (no differentiable output or input, or CPU eager rejects it)."""
    cpu = copy_sample(s)
    leaves_c = [t for t in tensors(cpu) if t.requires_grad]
    if not leaves_c:
        return None
    try:
        outs_c = _grad_outputs(op, s, cpu)
        if not outs_c:
            return None
        g = torch.Generator().manual_seed(0)
        ws = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs_c]
        grads_c = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs_c, ws)), leaves_c,
                                      allow_unused=True)
    except Exception:
        return None
    xla = copy_sample(s, txc.device(), op.name)
    leaves_x = [t for t in tensors(xla) if t.requires_grad]
    before = _fallbacks()
    try:
        outs_x = _grad_outputs(op, s, xla)
        if len(outs_x) != len(outs_c):
            return "mismatch", f"{len(outs_x)} differentiable outputs on xla, {len(outs_c)} on cpu"
        loss = sum((o * w.to(o.device)).sum() for o, w in zip(outs_x, ws))
        grads_x = torch.autograd.grad(loss, leaves_x, allow_unused=True)
        txc.sync(wait=True)
    except Exception as e:  # noqa: BLE001
        msg = message(e)
        del e
        reset()
        return "error", msg
    atol, rtol = tolerance(op, dtype)
    atol, rtol = BWD_TOL.get(op.name, (atol * 10, rtol * 10))
    try:
        for i, (gx, gc_) in enumerate(zip(grads_x, grads_c)):
            if (gx is None) != (gc_ is None):
                raise Mismatch(f"grad[{i}]: xla {'None' if gx is None else 'a tensor'}, "
                               f"cpu {'None' if gc_ is None else 'a tensor'}")
            if gc_ is not None:
                compare(gx, gc_, atol, rtol, random, what=f"grad[{i}]")
    except Mismatch as m:
        return "mismatch", str(m)
    except Exception as e:  # noqa: BLE001
        msg = message(e, " fetching the gradient")
        del e
        reset()
        return "error", msg
    return _verdict(before)


def run_case(op, dtype, direction, mode=MODE, max_samples=MAX_SAMPLES):
    """Runs a case's samples; returns a list of (sample index, outcome, message).
    In "ci" mode backward stops after the first applicable sample. Forward
    samples are traced in turn and computed together (computed_together),
    one by one where that fails."""
    torch.manual_seed(zlib.crc32(op_id(op).encode()))
    run = run_forward if direction == "fwd" else run_backward
    one = direction == "bwd" and mode == "ci"
    results = []
    samples = op.sample_inputs("cpu", dtype, requires_grad=direction == "bwd")
    warned = set(_tensor._warned)
    try:
        if direction == "fwd":
            kept, traced = [], []
            for i, s in enumerate(samples):  # each traced before the next is made, as the loop below does
                if max_samples and i >= max_samples:
                    break
                torch.manual_seed(i)
                kept.append(s)
                keep_traced(traced, i, _trace_forward(op, s, is_random(op, s)))
            together = computed_together(traced, lambda t: _judge_forward(op, dtype, t))
            if together is not None:
                return together
            samples = kept
        for i, s in enumerate(samples):
            if max_samples and i >= max_samples:
                break
            torch.manual_seed(i)
            r = run(op, s, dtype, is_random(op, s))
            if r is None:
                continue
            results.append((i, *r))
            if one:
                break
    finally:
        txc._C.take_handler_error()
        # a fallback warned here must still warn for the tests that check it
        _tensor._warned.intersection_update(warned)
        _checks.clear()
    return results

def judge(results, entry):
    """A case's results (sample, outcome, message, ...) against its
    expected-failure entry (or None): (counts per outcome, failures as
    [sample, outcome, message], their kinds, the verdict)."""
    counts = {}
    for r in results:
        counts[r[1]] = counts.get(r[1], 0) + 1
    failures = [list(r[:3]) for r in results if r[1] != "pass"]
    kinds = tuple(sorted({r[1] for r in failures}))
    if entry is None:
        verdict = "ok" if not kinds else "new failure"
    elif not results:
        verdict = "listed, but no sample ran"
    else:
        verdict = "expected" if kinds == entry.kinds() else ("unexpected pass" if not kinds else "changed")
    return counts, failures, kinds, verdict


def settle(what, results, entry, judged, listed_in):
    """Ends a case's test as its verdict says (after its record is kept):
    skip, fail naming the samples, or xfail with the entry's reason."""
    counts, failures, kinds, verdict = judged
    if not results and entry is None:
        pytest.skip("no applicable sample")
    detail = "\n".join(f"  sample {i}: {o}: {m}" for i, o, m in failures[:8])
    if verdict == "new failure":
        pytest.fail(f"{what}: {'+'.join(kinds)} not in {listed_in} ({counts}):\n{detail}")
    if verdict == "unexpected pass":
        pytest.fail(f"{what} passes all {len(results)} samples: remove its expected-failure entry ({entry.reason})")
    if verdict not in ("ok", "expected"):
        pytest.fail(f"{what}: {verdict}: listed {entry.fails!r} ({entry.reason}), got "
                    f"{'+'.join(kinds) or 'no samples'} ({counts}):\n{detail}")
    if verdict == "expected":
        pytest.xfail(entry.reason)


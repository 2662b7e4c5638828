"""The compat suite: what one wheel must do on every torch of the supported
range (torch_xla_core/_runtime/torch_compat.py's TORCH_RANGE). tests/compat/run.py (`nox -s
compat`) runs it in a venv per torch version with the built wheel installed
and prints a table torch version x check. In the checkout's own venv
(`pytest tests/compat`) the light checks run; the transformers models and
the OpInfo slice run when TXC_COMPAT=1 (run.py sets it), as tests/test_hf_models.py
and tests/conformance already cover them on the default torch.

Checks: import and build_info() (the wheel's flavor, the torch in range, the
ops this torch lacks and nothing else skipped); the import refusing a torch
outside the range; a traced training step; txc.compile and torch.compile
(backend="torch_xla_core") on transformers' Llama, Mixtral and BERT built
small from configs (loss and gradients against CPU eager); autocast;
torch.save/torch.load/deepcopy; the version shims; a slice of PyTorch's
OpInfo conformance suite with at least one op of every op family (_ops/*.py)."""
import copy
import importlib.metadata as md
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core._runtime import torch_compat as _compat

HEAVY = os.environ.get("TXC_COMPAT") == "1"
heavy = pytest.mark.skipif(not HEAVY, reason="TXC_COMPAT=1 (tests/compat/run.py) runs it")
TORCH = _compat.TORCH[:2]


# ---- import -------------------------------------------------------------------------

def test_import_and_build_info():
    lo, hi = _compat.TORCH_RANGE
    assert lo <= TORCH < hi, torch.__version__
    info = txc.build_info()
    assert info["torch"].split("+")[0] == torch.__version__.split("+")[0], info
    want = os.environ.get("TXC_COMPAT_FLAVOR")  # run.py: the flavor of the wheel it installed
    if want:
        assert info["flavor"] == want and info["flavor_consistent"], info
        repo = os.environ["TXC_COMPAT_REPO"]  # the wheel's package, not the checkout's
        assert not Path(txc.__file__).resolve().is_relative_to(repo), txc.__file__
    # ops this torch lacks are skipped by the registry, and only those
    absent = {k for k, why in _compat.ABSENT.items() if why.here()}
    assert {s.split(".")[0] for s in _compat.SKIPPED} == absent, _compat.SKIPPED


def test_declared_ranges_match_compat():
    """pyproject's torch and jax ranges are _compat's (the import check's)."""
    repo = os.environ.get("TXC_COMPAT_REPO", str(Path(__file__).resolve().parents[2]))
    import tomllib
    deps = tomllib.loads((Path(repo) / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = {re.split(r"[<>=\[ ]", d)[0]: re.sub(r"^[\w\-]+", "", d) for d in deps}
    assert spec["torch"] == _compat.TORCH_SPEC and spec["jax"] == spec["jaxlib"] == _compat.JAX_SPEC, spec
    # the torches run.py tests: one per minor version of the range, its bounds included;
    # the default torch (sessions, images, release smoke) among them
    sys.path.insert(0, str(Path(repo) / "tests" / "compat"))
    import run
    lo, hi = _compat.TORCH_RANGE
    assert sorted(_compat.version_tuple(v)[:2] for v in run.TORCHES.values()) == \
        [(lo[0], m) for m in range(lo[1], hi[1])], run.TORCHES
    import flavors
    assert flavors.load().default_torch in run.TORCHES.values()
    if os.environ.get("TXC_COMPAT_FLAVOR"):  # the installed wheel's metadata says the same
        reqs = {re.split(r"[<>=\[ ;]", r)[0]: r for r in md.requires("torch_xla_core")}
        assert _compat.TORCH_SPEC.split(",")[0] in reqs["torch"], reqs


@pytest.mark.parametrize("version", ["2.10.2", "2.16.0"])
def test_import_refuses_torch_outside_the_range(version):
    """`import torch_xla_core` under a torch outside the range raises an
    ImportError naming that version and the range (run in a subprocess whose
    torch reports `version`)."""
    code = (f"import torch; torch.__version__ = {version!r}\n"
            "try:\n import torch_xla_core\nexcept ImportError as e:\n print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(__file__)).stdout
    assert "REFUSED" in out and version in out and _compat.TORCH_SPEC in out, out


def test_unsupported_torch_override_warns(monkeypatch):
    monkeypatch.setenv("TXC_UNSUPPORTED_TORCH", "1")
    with pytest.warns(RuntimeWarning, match="this is torch 2.16.0"):
        _compat.check_torch("2.16.0")
    monkeypatch.delenv("TXC_UNSUPPORTED_TORCH")
    with pytest.raises(ImportError, match="TXC_UNSUPPORTED_TORCH=1"):
        _compat.check_torch("2.16.0")
    _compat.check_torch(torch.__version__)  # this one: in range, no warning


# ---- training -----------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 4))


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def test_traced_training_step(dev):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(3)]
    out = {}
    for d in ("cpu", dev):
        m = _mlp().to(d)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        losses = []
        for x, y in data:
            losses.append(_step(m, opt, x.to(d), y.to(d)).cpu())
            if d != "cpu":
                txc.sync()
        out[str(d)] = (torch.stack(losses), [p.detach().cpu() for p in m.parameters()])
    (lc, pc), (lx, px) = out["cpu"], out[str(dev)]
    torch.testing.assert_close(lx, lc, atol=1e-5, rtol=1e-5)
    for a, b in zip(px, pc):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not txc.metrics.fallbacks()


# ---- transformers models: txc.compile and torch.compile -----------------------------------

def _hf(name):
    T = pytest.importorskip("transformers")
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**common, num_key_value_heads=2))
    if name == "mixtral":
        # experts through F.grouped_mm where this torch has it (transformers' own fallback reads the
        # routing on the host: replay cannot take that)
        grouped = {"experts_implementation": "grouped_mm"} if hasattr(F, "grouped_mm") else {}
        return T.MixtralForCausalLM(T.MixtralConfig(**common, num_key_value_heads=2, num_local_experts=4,
                                                    num_experts_per_tok=2, router_jitter_noise=0.0, **grouped))
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(**common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    raise ValueError(name)


def _hf_loss(model, ids, **kw):
    return model(input_ids=ids, labels=ids, **kw).loss


def _hf_train(name, route, dev):
    """SGD steps of the model on CPU eager and on xla through `route`
    ("txc.compile" or "dynamo"); returns the losses and parameters of each."""
    torch.manual_seed(0)
    model = _hf(name).train()
    g = torch.Generator().manual_seed(2)
    # txc.compile: call 1 makes the optimizer state, 2 records, 3 replays; dynamo compiles on call 1
    batches = [torch.randint(0, 64, (2, 8), generator=g) for _ in range(3 if route == "txc.compile" else 2)]
    kw = {} if name == "bert" else {"use_cache": False}
    res = {}
    for d in ("cpu", dev):
        m = copy.deepcopy(model).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        if d == "cpu":
            fwd = m
        elif route == "dynamo":
            fwd = torch.compile(m, backend="torch_xla_core", dynamic=False)
        else:
            fwd = None

        def step(fwd, opt, ids):
            opt.zero_grad()
            loss = _hf_loss(fwd, ids, **kw)
            loss.backward()
            opt.step()
            return loss.detach()
        if d != "cpu" and route == "txc.compile":
            step = txc.compile(step)
        losses = []
        for ids in batches:
            losses.append(step(fwd if fwd is not None else m, opt, ids.to(d)))
            if d != "cpu":
                txc.sync()
        res[str(d)] = (torch.stack([x.cpu() for x in losses]), [p.detach().cpu() for p in m.parameters()])
    return res["cpu"], res[str(dev)]


@heavy
@pytest.mark.parametrize("route", ["txc.compile", "dynamo"])
@pytest.mark.parametrize("name", ["llama", "mixtral", "bert"])
def test_hf_model_training(name, route, dev):
    if route == "dynamo":
        torch._dynamo.reset()
    (lc, pc), (lx, px) = _hf_train(name, route, dev)
    torch.testing.assert_close(lx, lc, atol=1e-4, rtol=1e-4)
    scale = max(p.abs().max().item() for p in pc)
    for a, b in zip(px, pc):
        torch.testing.assert_close(a, b, atol=1e-4 * scale, rtol=1e-4)
    if route == "dynamo":
        assert txc.metrics.counters().get("dynamo_graph", 0) >= 2
    else:
        assert txc.metrics.counters().get("replay", 0) >= 1, txc.metrics.counters()


def test_dynamo_device_constant_where_cuda_is_available(dev, monkeypatch):
    """torch.tensor(data, device="xla") inside a compiled region on a machine
    where torch also has CUDA (simulated: dynamo._accelerator_available): the
    constant is made on the CPU and moved as a fake tensor. It failed on
    torch 2.11 on an H200 (lift_fresh of a real xla tensor) and, with the
    fake mode not avoiding device init, on every torch ("found at least two
    devices, xla:0 and xla:0")."""
    from torch_xla_core import dynamo
    monkeypatch.setattr(dynamo, "_accelerator_available", lambda: True)
    torch._dynamo.reset()

    def f(x):
        empty = torch.tensor([], dtype=torch.bfloat16, device=x.device)
        c = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16, device=x.device)
        return torch.cat([empty, x]) * c
    x = torch.randn(3, dtype=torch.bfloat16)
    out = torch.compile(f, backend="torch_xla_core", dynamic=False)(x.to(dev))
    torch.testing.assert_close(out.cpu(), f(x))
    torch._dynamo.reset()


@heavy
def test_dynamo_hf_llama_bf16_with_cache_where_cuda_is_available(dev, monkeypatch):
    """The report's case: a bf16 Llama through torch.compile with its default
    use_cache (transformers makes device constants), CUDA simulated."""
    from torch_xla_core import dynamo
    monkeypatch.setattr(dynamo, "_accelerator_available", lambda: True)
    torch._dynamo.reset()
    m = _hf("llama").eval().to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 8))
    cm = torch.compile(copy.deepcopy(m).to(dev), backend="torch_xla_core", dynamic=False)
    with torch.no_grad():
        out = cm(input_ids=ids.to(dev)).logits
        ref = m(input_ids=ids).logits
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=5e-2, rtol=5e-2)
    torch._dynamo.reset()


# ---- autocast, serialization ------------------------------------------------------------

def test_autocast(dev):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = lin(x).float().softmax(-1)
    lx = copy.deepcopy(lin).to(dev)
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = lx(x.to(dev))
        assert y.dtype == torch.bfloat16
        out = y.float().softmax(-1)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-2, rtol=1e-2)
    y.float().sum().backward()
    assert lx.weight.grad.dtype == torch.float32


def test_save_load_deepcopy(dev):
    m = _mlp().to(dev)
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "t": torch.arange(6.0, device=dev).view(2, 3)}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["t"].device.type == "xla"
    torch.testing.assert_close(state["t"].cpu(), torch.arange(6.0).view(2, 3))
    m2 = _mlp().to(dev)
    with torch.no_grad():
        for p in m2.parameters():
            p.zero_()
    m2.load_state_dict(state["model"])
    x = torch.randn(3, 8)
    torch.testing.assert_close(m2(x.to(dev)).cpu(), _mlp()(x), atol=1e-5, rtol=1e-5)
    c = copy.deepcopy(m2)
    with torch.no_grad():
        next(c.parameters()).add_(1)
    assert not torch.equal(next(c.parameters()).cpu(), next(m2.parameters()).cpu())


# ---- the shims (_compat.py) ------------------------------------------------------------

def test_op_registry_skips_absent():
    """An @impl naming an op this torch lacks registers nothing and is
    recorded; calling it names it. (torch >= 2.14: aten.cholesky; torch
    2.11-2.13: linalg_matrix_sqrth and linalg_polar; the import test checks
    that these are the ones skipped.)"""
    from torch_xla_core import _ops
    from torch_xla_core._ops import HANDLERS
    before = dict(HANDLERS)
    absent = _ops.aten.txc_no_such_op.default
    assert isinstance(absent, _compat.Absent)

    @_ops.impl(absent, _ops.aten.txc_no_such_op)
    def h(x):
        return x
    assert HANDLERS == before and "aten::txc_no_such_op.default" in _compat.SKIPPED
    _compat.SKIPPED.discard("aten::txc_no_such_op.default")
    _compat.SKIPPED.discard("aten::txc_no_such_op")
    with pytest.raises(NotImplementedError, match="txc_no_such_op.default does not exist in torch"):
        absent(torch.ones(1))
    assert _ops.aten.add is torch.ops.aten.add  # real packets are torch's own objects
    with pytest.raises(AttributeError):
        _ops.aten.__no_such_protocol__
    if _compat.ABSENT["aten::cholesky"].here():
        assert not hasattr(torch.ops.aten, "cholesky")
        x = torch.tensor([[4.0, 2.0], [2.0, 3.0]])  # torch.cholesky is gone there too; linalg.cholesky runs
        torch.testing.assert_close(torch.linalg.cholesky(x.to(txc.device())).cpu(), torch.linalg.cholesky(x))


def test_array_result_handler_either_jaxlib(monkeypatch):
    """jaxlib < 0.11 takes _skip_checks, jaxlib >= 0.11 does not: the shim
    works with both (the other one is a stand-in), learns once."""
    from jax._src.lib import xla_client as xc
    real = xc.array_result_handler
    calls = []

    def new_jaxlib(aval, sharding, committed):  # jaxlib 0.11's signature
        calls.append("new")
        return "handler"

    def old_jaxlib(aval, sharding, committed, _skip_checks=False):
        calls.append(_skip_checks)
        return "handler"
    import jax
    a = jax.numpy.arange(3.0)
    for fake, first, later in ((new_jaxlib, ["new"], ["new"]), (old_jaxlib, [True], [True])):
        monkeypatch.setattr(_compat, "_SKIP_CHECKS", [{"_skip_checks": True}])
        monkeypatch.setattr(xc, "array_result_handler", fake)
        calls.clear()
        h = _compat.array_result_handler(a.aval, a.sharding, a._committed)
        assert calls == first and h == "handler"
        calls.clear()
        _compat.array_result_handler(a.aval, a.sharding, a._committed)
        assert calls == later
    monkeypatch.undo()  # this jaxlib, through the runtime's outputs
    assert _compat.array_result_handler(a.aval, a.sharding, a._committed) is not None
    d = txc.device()
    torch.testing.assert_close((torch.ones(3, device=d) * 2).cpu(), torch.full((3,), 2.0))


def test_linear_cross_entropy_ops(dev):
    """torch >= 2.13 has torch.nn.modules.linear_cross_entropy (chunked custom
    ops, registered on the device); torch 2.11/2.12 lack the module and
    the import skips them."""
    try:
        from torch.nn.modules import linear_cross_entropy as lce
    except ImportError:
        assert TORCH < (2, 13)
        return
    from torch_xla_core._ops import HANDLERS
    assert lce._linear_cross_entropy_batch_chunked._opoverload in HANDLERS


# ---- OpInfo slice: an op or more of every op family ------------------------------------------

SLICE = {
    "elementwise": ["add", "mul", "exp", "sigmoid", "where", "clamp"],
    "reduce": ["sum", "mean", "amax", "var"],
    "shape": ["cat", "reshape", "permute", "expand"],
    "factory": ["arange", "full_like", "linspace"],
    "linalg": ["matmul", "bmm", "addmm"],
    "linalg_lapack": ["linalg.cholesky", "linalg.solve", "linalg.qr", "cholesky_inverse"],
    "nn": ["softmax", "nn.functional.layer_norm", "nn.functional.cross_entropy",
           "nn.functional.embedding", "nn.functional.max_pool2d"],
    "index": ["index_select", "gather", "scatter_add", "index_put"],
    "random": ["bernoulli", "uniform"],
    "conv": ["nn.functional.conv2d"],
    "upsample": ["nn.functional.interpolate.bilinear"],
    "special": ["special.i0e", "erf", "lgamma"],
    "special_bessel": ["special.bessel_j0"],
    "special_polynomials": ["special.chebyshev_polynomial_t"],
    "nn_grads": ["nn.functional.grid_sample"],
    "order": ["sort", "topk", "cumsum"],
    "misc": ["take", "index_reduce.prod"],
    "nn_extra": ["nn.functional.embedding_bag", "nn.functional.multi_margin_loss"],
    "transformer": ["nn.functional.scaled_dot_product_attention"],
    "complex": ["view_as_real", "polar"],
    "fft": ["fft.fft", "fft.rfft"],
    "einsum": ["einsum"],
    "moe": ["histc"],
}
# families that OpInfo's op_db has no entry for: checked directly against CPU below
DIRECT = {
    "foreach": lambda ts: torch._foreach_add(ts, ts, alpha=0.5),
    "quantize": lambda ts: torch.fake_quantize_per_tensor_affine(ts[0], 0.1, 3, -128, 127),
    "rnn": lambda ts: _gru()(ts[0].view(2, 3, 4))[0],
}


# families whose point is refusing what torch refuses: the call raises on CPU and on xla, naming the op
REFUSED = {
    "dtype_rules": ("celu", lambda t: F.celu(t)),  # an integer input: float math truncated
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_family_refuses_like_cpu(family, dev):
    name, fn = REFUSED[family]
    x = torch.tensor([-2, 1, 3])
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(x)
    with pytest.raises((RuntimeError, NotImplementedError, TypeError), match=name):
        fn(x.to(dev))


def _gru():
    torch.manual_seed(0)
    return torch.nn.GRU(4, 5, batch_first=True)
SAMPLES = 4
# modules of torch_xla_core/_ops that are no op family of their own: jax's LAPACK calls, the coverage table's
# generator, the autograd engine hook, the scan operator, its body trace and its policies (no aten overloads of their
# own), the dispatch table, the registry and the resolution
NOT_FAMILIES = {"_lapack_jax", "coverage", "engine", "scan", "scan_trace", "scan_policy", "table", "registry",
                "resolution"}


def test_slice_covers_every_op_family():
    import pkgutil
    from torch_xla_core import _ops
    families = {m.name for m in pkgutil.iter_modules(_ops.__path__)} - NOT_FAMILIES
    covered = set(SLICE) | set(DIRECT) | set(REFUSED)
    assert families == covered, families ^ covered


def _slice_params():
    return [pytest.param(fam, name, id=f"{fam}-{name}") for fam, names in SLICE.items() for name in names]


@pytest.mark.parametrize("family", sorted(DIRECT))
def test_family_direct(family, dev):
    ts = [torch.randn(2, 3, 4), torch.randn(2, 3, 4)]
    ref = DIRECT[family](ts)
    xs = [t.to(dev) for t in ts]
    if family == "rnn":
        _gru_dev = _gru().to(dev)
        out = _gru_dev(xs[0].view(2, 3, 4))[0]
    else:
        out = DIRECT[family](xs)
    for a, b in zip(out if isinstance(out, (list, tuple)) else [out], ref if isinstance(ref, (list, tuple)) else [ref]):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
    assert not txc.metrics.fallbacks()


@heavy
@pytest.mark.parametrize("family,name", _slice_params())
def test_opinfo_slice(family, name):
    from conformance import _opinfo, expected_failures
    ops = [op for op in _opinfo.op_db if _opinfo.op_id(op) == name]
    if not ops:
        pytest.skip(f"no OpInfo {name} in torch {torch.__version__}")
    (op,) = ops
    bad = []
    for direction, dtype in (("fwd", torch.float32), ("bwd", torch.float32)):
        if direction == "bwd" and not op.supports_autograd:
            continue
        results = _opinfo.run_case(op, dtype, direction, mode="ci", max_samples=SAMPLES)
        kinds = tuple(sorted({o for _, o, _ in results if o != "pass"}))
        entry = expected_failures.lookup(name, direction, dtype, "ci")
        if kinds != (entry.kinds() if entry else ()) and not (entry and not kinds):
            bad += [f"{direction} sample {i}: {o}: {m}" for i, o, m in results if o != "pass"][:3]
    assert not bad, "\n".join(bad)

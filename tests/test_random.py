"""Device random numbers: seeding through torch.manual_seed, reproducibility,
independence of draws, no recompiles across steps or seeds, distribution
sanity, dropout forward/backward, and errors."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc


def _no_fallbacks(before):
    after = txc.metrics.fallbacks()
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not new, f"unexpected CPU fallbacks: {new}"


def _draws(dev):
    """One of each random op; returns CPU results."""
    out = [
        torch.randn(7, device=dev),
        torch.rand(2, 3, device=dev),
        torch.randint(0, 100, (9,), device=dev),
        torch.randperm(10, device=dev),
        torch.normal(1.0, 2.0, (4,), device=dev),
        torch.empty(5, device=dev).normal_(),
        torch.empty(5, device=dev).uniform_(-2, 2),
        torch.empty(8, device=dev).bernoulli_(0.3),
        torch.empty(6, device=dev).exponential_(),
        torch.empty(6, dtype=torch.int32, device=dev).random_(),
        F.dropout(torch.ones(12, device=dev), 0.5),
    ]
    txc.sync()  # one graph for all of them
    return [t.cpu() for t in out]


def test_same_seed_same_numbers(dev):
    before = txc.metrics.fallbacks()
    torch.manual_seed(1234)
    a = _draws(dev)
    torch.manual_seed(1234)
    b = _draws(dev)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    _no_fallbacks(before)


def test_different_seeds_differ(dev):
    torch.manual_seed(1)
    a = torch.randn(100, device=dev).cpu()
    torch.manual_seed(2)
    b = torch.randn(100, device=dev).cpu()
    assert not torch.equal(a, b)
    # Large and negative seeds are accepted as torch accepts them (its CPU
    # generator takes -5 as 2**64 - 5 too).
    torch.manual_seed(-5)
    c = torch.randn(100, device=dev).cpu()
    torch.manual_seed(2 ** 64 - 5)
    d = torch.randn(100, device=dev).cpu()
    assert torch.equal(c, d)
    assert not torch.equal(a, c)


def test_draws_in_one_graph_differ(dev):
    txc.sync()
    n0 = txc.metrics.counters().get("execute", 0)
    a = torch.randn(1000, device=dev)
    b = torch.randn(1000, device=dev)
    m1 = F.dropout(torch.ones(1000, device=dev), 0.5)
    m2 = F.dropout(torch.ones(1000, device=dev), 0.5)
    txc.sync()
    assert txc.metrics.counters()["execute"] == n0 + 1  # all in one graph
    a, b, m1, m2 = (t.cpu() for t in (a, b, m1, m2))
    assert not torch.equal(a, b)
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) < 0.15
    assert not torch.equal(m1, m2)


def test_successive_steps_differ_without_recompiling(dev):
    txc.sync()

    def step():
        x = torch.rand(256, device=dev) + torch.randn(256, device=dev)
        txc.sync()
        return x

    step()
    # The state is computed at sync like any live tensor: device data again,
    # so the next step's graph starts from a parameter, not a growing chain.
    from torch_xla_core._tracing import random as _random
    assert _random.peek_state().is_data
    c0 = txc.metrics.counters()
    vals = [step().cpu() for _ in range(3)]
    c1 = txc.metrics.counters()
    assert c1["compile"] == c0["compile"]
    assert c1["cache_hit"] >= c0.get("cache_hit", 0) + 3
    assert not torch.equal(vals[0], vals[1]) and not torch.equal(vals[1], vals[2])


def test_new_seed_does_not_recompile(dev):
    torch.manual_seed(10)
    a = torch.randn(64, device=dev)
    txc.sync()
    c0 = txc.metrics.counters()["compile"]
    torch.manual_seed(11)
    b = torch.randn(64, device=dev)
    txc.sync()
    assert txc.metrics.counters()["compile"] == c0
    assert not torch.equal(a.cpu(), b.cpu())


def test_training_loop_with_dropout_compiles_once(dev):
    before = txc.metrics.fallbacks()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(32, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 8).to(dev)
    compiles, hits, losses = [], [], []
    for _ in range(5):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        txc.sync()
        c = txc.metrics.counters()
        compiles.append(c["compile"])
        hits.append(c.get("cache_hit", 0))
        losses.append(loss.detach().cpu().item())
    # Steps 2.. reuse one compiled graph (the first may differ: grads start as None).
    assert compiles[-1] == compiles[1]
    assert hits[-1] - hits[1] >= 3
    assert len(set(losses)) > 1  # masks differ per step
    _no_fallbacks(before)


def test_normal_statistics(dev):
    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    xs = [torch.randn(100_000, device=dev, dtype=dtype) for dtype in dtypes]
    txc.sync()
    for dtype, x in zip(dtypes, xs):
        assert x.dtype == dtype
        x = x.cpu().double()
        assert abs(x.mean().item()) < 0.02, dtype
        assert abs(x.std().item() - 1) < 0.02, dtype
        assert abs(((x > 1).double().mean() - 0.1587)).item() < 0.01
    y = torch.empty(100_000, device=dev).normal_(3.0, 0.5).cpu()
    assert abs(y.mean().item() - 3) < 0.01 and abs(y.std().item() - 0.5) < 0.01
    # tensor mean/std broadcast
    m = torch.tensor([[-10.0], [10.0]]).to(dev)
    z = torch.normal(m, torch.full((2, 50_000), 2.0).to(dev)).cpu()
    assert z.shape == (2, 50_000)
    assert torch.allclose(z.mean(1), torch.tensor([-10.0, 10.0]), atol=0.05)
    assert torch.allclose(z.std(1), torch.tensor([2.0, 2.0]), atol=0.05)


def test_uniform_statistics(dev):
    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    us = [torch.rand(100_000, device=dev, dtype=dtype) for dtype in dtypes]
    txc.sync()
    for dtype, u in zip(dtypes, us):
        u = u.cpu()
        assert u.dtype == dtype
        assert u.min() >= 0 and u.max() < 1
        assert abs(u.double().mean().item() - 0.5) < 0.01
        assert abs(u.double().var().item() - 1 / 12) < 0.005
    v = torch.empty(100_000, device=dev).uniform_(-3, 5).cpu()
    assert v.min() >= -3 and v.max() < 5 and abs(v.mean().item() - 1) < 0.05


def test_bernoulli_rates(dev):
    bs = {p: torch.empty(100_000, device=dev).bernoulli_(p) for p in (0.1, 0.5, 0.9)}
    txc.sync()
    for p, b in bs.items():
        b = b.cpu()
        assert set(b.unique().tolist()) <= {0.0, 1.0}
        assert abs(b.mean().item() - p) < 0.01
    probs = torch.tensor([0.0, 0.25, 1.0]).expand(40_000, 3).contiguous().to(dev)
    s = torch.bernoulli(probs).cpu()
    assert s.dtype == torch.float32
    assert torch.allclose(s.mean(0), torch.tensor([0.0, 0.25, 1.0]), atol=0.01)
    assert s[:, 0].sum() == 0 and s[:, 2].sum() == 40_000


def test_integers_and_permutations(dev):
    r = torch.randint(-3, 4, (50_000,), device=dev).cpu()
    assert r.dtype == torch.int64
    assert r.min() == -3 and r.max() == 3
    counts = torch.bincount(r + 3)
    assert counts.min() > 50_000 / 7 * 0.9
    big = torch.randint(0, 2 ** 40, (1000,), device=dev).cpu()
    assert big.min() >= 0 and big.max() < 2 ** 40 and big.max() > 2 ** 39
    dtypes = (torch.uint8, torch.int32, torch.bool, torch.float32)
    xs = [torch.empty(10_000, dtype=dtype, device=dev).random_(0, 2) for dtype in dtypes]
    txc.sync()
    for dtype, x in zip(dtypes, xs):
        x = x.cpu()
        assert x.dtype == dtype and set(x.tolist()) == {0, 1}
    u8 = torch.empty(20_000, dtype=torch.uint8, device=dev).random_().cpu()
    assert u8.min() == 0 and u8.max() == 255
    f = torch.empty(1000, device=dev).random_().cpu()
    assert f.min() >= 0 and f.max() <= 2 ** 24 and torch.equal(f, f.round())
    p = torch.randperm(1000, device=dev).cpu()
    assert torch.equal(p.sort().values, torch.arange(1000)) and not torch.equal(p, torch.arange(1000))
    assert torch.randperm(0, device=dev).cpu().numel() == 0
    # edge sizes and ranges: 0-d, empty, exactly 2**32 values, the full int64 range
    zero_d = torch.randn((), device=dev)
    empty = torch.rand(0, 3, device=dev)
    r32 = torch.randint(0, 2 ** 32, (2000,), device=dev)
    full = torch.empty(2000, dtype=torch.int64, device=dev).random_(-2 ** 63, None)
    txc.sync()
    assert zero_d.cpu().shape == () and empty.cpu().shape == (0, 3)
    r32 = r32.cpu()
    assert r32.min() >= 0 and r32.max() < 2 ** 32 and r32.max() > 2 ** 31
    full = full.cpu()
    assert (full < 0).any() and (full > 2 ** 62).any()


def test_exponential_and_friends(dev):
    e = torch.empty(100_000, device=dev).exponential_(2.0).cpu()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 0.01
    ln = torch.empty(100_000, device=dev).log_normal_(0.0, 0.5).cpu()
    assert abs(ln.log().mean().item()) < 0.01 and abs(ln.log().std().item() - 0.5) < 0.01
    c = torch.empty(100_000, device=dev).cauchy_(1.0, 2.0).cpu()
    assert abs(c.median().item() - 1) < 0.05
    assert abs(((c - 1).abs() < 2).double().mean().item() - 0.5) < 0.01  # quartiles at median +- sigma


def test_like_factories_and_inplace_on_view(dev):
    x = torch.zeros(4, 5, dtype=torch.float64, device=dev)
    assert torch.randn_like(x).dtype == torch.float64
    assert torch.rand_like(x).shape == (4, 5)
    ri = torch.randint_like(x, 3, 7).cpu()
    assert ri.dtype == torch.float64 and ri.min() >= 3 and ri.max() < 7
    x[1].normal_()
    c = x.cpu()
    assert (c[1] != 0).all() and (c[0] == 0).all() and (c[2:] == 0).all()


def test_generator_argument_is_reproducible(dev):
    a = torch.randn(6, device=dev, generator=torch.Generator().manual_seed(7)).cpu()
    b = torch.randn(6, device=dev, generator=torch.Generator().manual_seed(7)).cpu()
    c = torch.randn(6, device=dev, generator=torch.Generator().manual_seed(8)).cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rng_state_roundtrip(dev):
    from torch_xla_core._tracing import random as _random
    torch.manual_seed(3)
    torch.randn(3, device=dev)
    st = _random.get_rng_state()
    a = torch.randn(10, device=dev).cpu()
    _random.set_rng_state(st)
    b = torch.randn(10, device=dev).cpu()
    assert torch.equal(a, b)


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_forward_backward(dev, p):
    before = txc.metrics.fallbacks()
    x_cpu = torch.rand(64, 128) + 0.5  # nonzero: a zero output means dropped
    x = x_cpu.to(dev).requires_grad_()
    y = F.dropout(x, p, training=True)
    g = torch.randn(64, 128)
    y.backward(g.to(dev))
    yc, gx = y.detach().cpu(), x.grad.cpu()
    kept = yc != 0
    scale = 1 / (1 - p)
    assert abs(kept.double().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(yc[kept], x_cpu[kept] * scale)
    assert (gx[~kept] == 0).all()
    torch.testing.assert_close(gx[kept], g[kept] * scale)
    # eval mode and p=0 are the identity; p=1 drops everything
    torch.testing.assert_close(F.dropout(x, p, training=False).detach().cpu(), x_cpu)
    torch.testing.assert_close(F.dropout(x, 0.0, training=True).detach().cpu(), x_cpu)
    assert (F.dropout(x, 1.0, training=True).detach().cpu() == 0).all()
    _no_fallbacks(before)


def test_native_dropout_mask(dev):
    x = torch.ones(1000, device=dev)
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    assert mask.dtype == torch.bool
    out, mask = out.cpu(), mask.cpu()
    torch.testing.assert_close(out, mask.float() / 0.75)
    back = torch.ops.aten.native_dropout_backward(torch.full((1000,), 3.0).to(dev), mask.to(dev), 1 / 0.75)
    torch.testing.assert_close(back.cpu(), mask.float() * 4.0)


@pytest.mark.parametrize("fn,msg", [
    (lambda d: torch.zeros(3, dtype=torch.long, device=d).normal_(), "normal_"),
    (lambda d: torch.zeros(3, device=d).normal_(0, -1), "normal expects std >= 0.0"),
    (lambda d: torch.zeros(3, device=d).uniform_(2, 1), "uniform_ expects to return a [from, to) range"),
    (lambda d: torch.zeros(3, device=d).bernoulli_(1.5), "bernoulli_ expects p to be in [0, 1]"),
    (lambda d: torch.randint(5, 3, (2,), device=d), "expects 'from' to be less than 'to'"),
    (lambda d: torch.zeros(3, device=d).exponential_(-1), "exponential_ expects lambda > 0.0"),
    (lambda d: torch.zeros(3, dtype=torch.uint8, device=d).random_(0, 300), "to - 1 is out of bounds"),
    (lambda d: torch.randn(3, dtype=torch.int64, device=d), "randn"),
])
def test_errors_name_the_op(dev, fn, msg):
    with pytest.raises(RuntimeError, match=msg.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        fn(dev)
    # CPU raises the same kind of error
    with pytest.raises(RuntimeError):
        fn("cpu")


# --- graph structure: compile cost linear in the number of draws --------------

def _rng_chain_text(dev, n):
    """StableHLO of n chained randn + matmul steps (not run)."""
    from torch_xla_core import _C
    txc.sync()
    h = torch.ones(2, 8, device=dev)
    for _ in range(n):
        h = h @ torch.randn(8, 8, device=dev)
    text = _C.GraphCut([h._lt]).lower()
    txc.sync()
    return text


def _normalized_ops(text):
    """The body's op lines with SSA names and parameter numbers erased."""
    import re
    lines = [ln.strip() for ln in text.splitlines() if '= "' in ln]
    return [re.sub(r"%(v|arg)\d+", r"%\1", ln) for ln in lines]


def test_rng_graph_is_linear_and_every_draw_lowers_alike(dev):
    # Each draw's ops are the same ops on other parameters: no per-draw
    # constant (XLA would compile a kernel per draw), no chain of state
    # updates (XLA duplicated the chain into every draw: superlinear compile),
    # and the bits are counter-based integer arithmetic (no rng_bit_generator:
    # XLA expanded one Philox computation per draw, 3x the compile time of
    # the same graph with its random tensors as inputs).
    ops = {n: _normalized_ops(_rng_chain_text(dev, n)) for n in (4, 8, 16)}
    per_draw = (len(ops[16]) - len(ops[8])) / 8
    assert len(ops[8]) - len(ops[4]) == 4 * per_draw  # op count exactly linear in the draws
    assert per_draw <= 28  # a small body per draw (hash + normal transform + matmul)
    assert set(ops[16]) == set(ops[4])  # no op text that is new per draw
    for n in (4, 8, 16):  # no backend-specific generator: the same bits everywhere
        text = _rng_chain_text(dev, n)
        assert "rng_bit_generator" not in text and "stablehlo.rng" not in text
        # the draws of one shape share their element counters (one iota), and
        # the graph's key is computed once (one remainder: see draw_bits)
        assert text.count('"stablehlo.iota"') == 1
        assert text.count('"stablehlo.remainder"') == 1
        # a draw adds its stream (made on the host, _random.stream) to the key:
        # no per-draw scalar arithmetic for it; its 24 bits become a float
        # through i32 (a u64 -> f32 convert compiled into a long sequence);
        # and it is computed over its 64 elements flat, reshaped once at the
        # end (a reshape among its ops cost XLA's simplifier extra rounds)
        assert '"stablehlo.shift_left"' not in text
        assert "xui64>) -> tensor<64xf32>" not in text and text.count("(tensor<64xui64>) -> tensor<64xi32>") == n
        assert text.count("(tensor<64xf32>) -> tensor<8x8xf32>") == n and "xui64>) -> tensor<8x8x" not in text
    # the draws read the graph's one state parameter and an offset each
    text = _rng_chain_text(dev, 16)
    sig = text[text.index("@main("):text.index(")", text.index("@main("))]
    assert sig.count("tensor<2xi64>") == 1 and sig.count("tensor<i64>") == 16


def test_draws_are_the_documented_counter_based_bits(dev):
    # csrc/ops/random.cpp: element i of the draw at offset c from the state
    # [seed, counter] is mix(key + (c * 2^40 + i) * G), key = (mix(seed +
    # counter * G) + G) mod (2^64 - 1); a float32 uniform takes its top 24
    # bits. The stream (c * 2^40) * G is made on the host (_random.stream):
    # a wrong one would still look random, so the bits are checked exactly.
    M, G = (1 << 64) - 1, 11400714819323198485

    def mix(z):
        z = ((z ^ (z >> 30)) * 13787848793156543929) & M
        z = ((z ^ (z >> 27)) * 10723151780598845931) & M
        return z ^ (z >> 31)

    torch.manual_seed(1234)
    draws = [torch.rand(6, device=dev) for _ in range(3)]
    got = [d.cpu().tolist() for d in draws]
    key = ((mix(1234) + G) & M) % M
    want = [[(mix((key + ((c << 40) + i) * G) & M) >> 40) * 2.0 ** -24 for i in range(6)] for c in range(3)]
    assert got == want


def test_draw_offsets_are_parameters_not_part_of_the_hash(dev):
    from torch_xla_core import _C
    txc.sync()
    a = torch.rand(5, device=dev)
    b = torch.rand(5, device=dev)
    h1 = _C.GraphCut([a._lt, b._lt]).hash
    txc.sync()
    c = torch.rand(5, device=dev)
    d = torch.rand(5, device=dev)
    assert _C.GraphCut([c._lt, d._lt]).hash == h1
    assert not torch.equal(a.cpu(), c.cpu()) and not torch.equal(b.cpu(), d.cpu())


# --- partial syncs (.item() without sync()) carry the RNG state ---------------

def test_item_without_sync_compiles_once_and_state_stays_bounded(dev):
    from torch_xla_core import _C
    from torch_xla_core._tracing import random as _random
    txc.sync()
    compiles, live, pending, vals = [], [], [], []
    for _ in range(12):
        vals.append(torch.rand(3, device=dev).sum().item())
        compiles.append(txc.metrics.counters()["compile"])
        live.append(_C.live_count())
        s = _random.peek_state()
        pending.append(0 if s.is_data else _C.GraphCut([s]).num_nodes)
    assert compiles[-1] == compiles[1]  # no recompiles after the first steps
    assert live[-1] == live[1]  # no storages pile up
    assert max(pending) == 0  # the partial sync computed the state too
    assert len(set(vals)) == len(vals)  # and it moved on: fresh numbers each step


def test_pending_state_is_one_op_however_many_draws(dev):
    from torch_xla_core import _C
    from torch_xla_core._tracing import random as _random
    txc.sync()
    for k in range(1, 40):
        torch.randn(2, device=dev)
        assert _C.GraphCut([_random.peek_state()]).num_nodes <= 4  # rng_advance(state, offset): no chain


def test_partial_sync_then_full_sync_continue_the_stream(dev):
    # Draws after an .item() (a partial sync) come from the moved-on state:
    # the same numbers as with a full sync in between.
    def run(partial):
        torch.manual_seed(5)
        a = torch.rand(4, device=dev)
        if partial:
            a.sum().item()
        else:
            txc.sync()
        b = torch.rand(4, device=dev)
        return a.cpu(), b.cpu()

    a1, b1 = run(True)
    a2, b2 = run(False)
    assert torch.equal(a1, a2) and torch.equal(b1, b2) and not torch.equal(a1, b1)


def test_counter_based_bits_look_uniform_and_independent(dev):
    """The SplitMix64 counter-based bits: a million uniforms fill 64 bins evenly (chi-square far
    below its 1e-4 tail, 112 for 63 degrees of freedom), neighbours within a draw and the two draws
    of one graph are uncorrelated, and integer draws hit every value of a 2^16 range about equally."""
    torch.manual_seed(123)
    u, v = torch.rand(1 << 20, device=dev), torch.rand(1 << 20, device=dev)
    k = torch.randint(0, 1 << 16, (1 << 20,), device=dev)
    u, v, k = u.cpu().double(), v.cpu().double(), k.cpu()
    counts = torch.histc(u, bins=64, min=0, max=1)
    expected = u.numel() / 64
    assert ((counts - expected) ** 2 / expected).sum().item() < 112
    for a, b in ((u[:-1], u[1:]), (u, v)):
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 5e-3
    per_value = torch.bincount(k, minlength=1 << 16).double()
    assert per_value.min().item() > 0 and per_value.std().item() < 1.2 * per_value.mean().sqrt().item()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_randn_and_rand_draw_their_parts_as_torch(dtype, dev):
    """torch draws a complex randn as two independent N(0, 1/2) parts (unit
    variance) and a complex rand as two U[0, 1) parts; compared with CPU's
    own draws of the same size (5 sigma bounds on 20000 samples)."""
    n = 20000
    for f in (torch.randn, torch.rand):
        ours, cpu = f(n, dtype=dtype, device=dev), f(n, dtype=dtype)
        assert ours.dtype == dtype and ours.shape == (n,)
        o = ours.cpu()
        for part in (torch.real, torch.imag):
            a, b = part(o).double(), part(cpu).double()
            se = b.std().item() / n ** 0.5
            assert abs(a.mean().item() - b.mean().item()) < 5 * 2 ** 0.5 * se
            assert abs(a.var().item() / b.var().item() - 1) < 0.05
        assert float(torch.corrcoef(torch.stack([o.real, o.imag]).double())[0, 1]) < 0.05
    assert torch.randn_like(torch.zeros(3, dtype=dtype, device=dev)).dtype == dtype

"""torch_xla_core._bench_core: the core-only microbenchmark bench/flavors.py
compares across the C++-ABI flavors, a module of its own built as an
extension of the core (no benchmark code in _C). Its timings are sane, the
graph it lowers is real StableHLO that compiles and computes what the ops
say, and its cut is the one a sync of the same ops makes."""
import math

import pytest
import torch
import torch.nn.functional as F

from torch_xla_core import _bench_core, _C, runtime


@pytest.mark.parametrize("kind", ["build", "hash", "lower"])
def test_timings_positive(kind):
    t = _bench_core.bench_core(kind, 70, 3)
    assert len(t) == 3
    assert all(isinstance(x, float) and math.isfinite(x) and 0 < x < 5 for x in t), t


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="kind must be 'build', 'hash' or 'lower', got 'hsah'"):
        _bench_core.bench_core("hsah", 10, 1)
    with pytest.raises(ValueError, match="n must be"):
        _bench_core.bench_core("build", 0, 1)
    with pytest.raises(ValueError, match="repeats must be"):
        _bench_core.bench_core("lower", 10, 0)


def test_lowering_compiles_and_computes():
    # 14 ops = 2 layers: dot + bias, gelu ("none" then "tanh"), reshape there
    # and back, gate, residual.
    text = _bench_core.bench_core_text(14)
    assert text.count("stablehlo.dot_general") == 2
    assert "chlo.erf" in text and "stablehlo.tanh" in text   # both gelu variants
    exe = runtime.compile_text(text)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g)
    ws = [torch.randn(64, 64, generator=g) / 8 for _ in range(2)]
    bs = [torch.randn(64, generator=g) for _ in range(2)]
    params = [x, ws[0], bs[0], ws[1], bs[1]]
    (out,), t0 = runtime.launch(exe, [runtime.to_device(p) for p in params])
    runtime.wait_ready([out], t0)
    h = x
    for w, b, approx in zip(ws, bs, ("none", "tanh")):
        y = F.gelu(h @ w + b, approximate=approx).reshape(512).reshape(8, 64)
        h = h + y * h
    torch.testing.assert_close(runtime.to_host(out), h, atol=1e-4, rtol=1e-4)


def test_module_is_an_extension_not_part_of_C():
    assert not hasattr(_C, "bench_core") and not hasattr(_C, "bench_core_text")
    assert _bench_core.flavor == _C._api_flavor      # built with the core's flavor, checked at import
    assert _bench_core.ops == {}                     # it registers no op of its own


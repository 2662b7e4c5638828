"""Visible recompiles (torch_xla_core/_execution/recompiles.py): every compile after the
first at a call site is counted, and with TXC_DEBUG=recompiles explained by
the actual difference from the nearest earlier graph, naming the user's line
that synced."""
import os
import subprocess
import sys

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import executor, recompiles


@pytest.fixture
def explaining():
    executor.clear_cache()
    recompiles.enable()
    yield
    recompiles.disable()
    recompiles._forced = None
    recompiles.clear()


def _step(x, w):
    return (x @ w).relu().sum().cpu()   # the sync happens on this line


def _last():
    ex = recompiles.explanations()
    assert ex, "no recompile was explained"
    return ex[-1]


def test_changed_batch_size_is_named(dev, explaining, capsys):
    w = torch.randn(3, 5).to(dev)
    for batch in (4, 8):
        x = torch.randn(batch, 3)
        got = _step(x.to(dev), w)
        torch.testing.assert_close(got, (x @ w.cpu()).relu().sum())
    e = _last()
    assert "test_recompiles.py" in e.site and "_step" in e.site
    assert len(e.differences) == 1 and e.differences[0].startswith("shape of %0"), e.differences
    assert "float32[4, 3] -> float32[8, 3]" in e.differences[0]
    assert e.nearest is not None and e.nearest != e.graph
    assert txc.metrics.counters()["recompile"] == 1
    assert "recompile #1" in capsys.readouterr().err


def test_changed_dtype_is_named(dev, explaining):
    for dt in (torch.float32, torch.float64):
        x = torch.randn(4, 3, dtype=dt)
        torch.testing.assert_close((x.to(dev) * 2).sum().cpu(), (x * 2).sum())
    d = _last().differences
    assert d[0] == "dtype of %0 (made by aten.copy_.default) data: float32[4, 3] -> float64[4, 3]", d


def test_changed_matmul_precision_is_named(dev, explaining):
    old = torch.get_float32_matmul_precision()
    w = torch.randn(3, 5).to(dev)
    x = torch.randn(4, 3).to(dev)
    try:
        for prec in ("highest", "high"):
            torch.set_float32_matmul_precision(prec)
            _step(x, w)
    finally:
        torch.set_float32_matmul_precision(old)
    assert _last().differences == ["matmul precision (torch.set_float32_matmul_precision): 'highest' -> 'high'"]


def test_numbers_equal_in_another_pattern_are_named(dev, explaining):
    """Equal Python numbers share a parameter; a call whose numbers are
    equal in another pattern compiles, and the explanation names the number
    that now reads its own parameter."""
    x = torch.randn(4).to(dev)
    for a, b in ((2.0, 2.0), (2.0, 3.0)):
        (x * a + x.cos() * b).cpu()
    d = _last().differences
    assert len(d) == 1 and d[0].startswith("attributes of %") and "scalar: {arg 1} -> {arg 2}" in d[0], d


def test_same_graph_twice_is_no_recompile(dev, explaining):
    w = torch.randn(3, 5).to(dev)
    for _ in range(3):
        _step(torch.randn(4, 3).to(dev), w)
    assert recompiles.explanations() == []
    assert txc.metrics.counters().get("recompile", 0) == 0


def test_limit_raises_naming_the_site(dev, monkeypatch):
    executor.clear_cache()
    monkeypatch.setenv("TXC_RECOMPILE_LIMIT", "2")
    w = torch.randn(3, 5).to(dev)
    _step(torch.randn(1, 3).to(dev), w)
    _step(torch.randn(2, 3).to(dev), w)
    with pytest.raises(recompiles.RecompileLimitError, match=r"TXC_RECOMPILE_LIMIT=2.*"):
        _step(torch.randn(3, 3).to(dev), w)
    executor.clear_cache()


def test_env_var_prints_explanations():
    code = ("import torch, torch_xla_core as txc\n"
            "for n in (2, 3):\n"
            "    (torch.ones(n).to('xla') * 2).cpu()\n")
    env = dict(os.environ, TXC_DEBUG="recompiles", TXC_COMPILE_CACHE="off")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "recompile #1 at <string>:3 in <module>" in r.stderr, r.stderr
    assert "float32[2] -> float32[3]" in r.stderr, r.stderr


def test_txc_debug_explain_recompiles_turns_explaining_on_and_lists_them(dev):
    """txc.debug.explain_recompiles(): what TXC_DEBUG=recompiles does, from code."""
    executor.clear_cache()
    try:
        assert txc.debug.explain_recompiles() == [] and recompiles.enabled()
        w = torch.randn(3, 5).to(dev)
        for batch in (2, 6):
            _step(torch.randn(batch, 3).to(dev), w)
        ex = txc.debug.explain_recompiles(enable=False)
        assert len(ex) == 1 and "float32[2, 3] -> float32[6, 3]" in ex[0].differences[0], ex
    finally:
        recompiles.disable()
        recompiles._forced = None
        recompiles.clear()

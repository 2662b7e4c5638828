"""The debug face of the executor (torch_xla_core/_features/debug.py, TXC_DUMP_DIR):
what a sync would compile, without running it."""
import os

import pytest
import torch

import torch_xla_core as txc


def test_graph_text_names_core_and_aten_ops(dev):
    x = torch.arange(4.0).to(dev)
    y = (x * 2).relu()
    text = txc.debug.graph_text(y)
    lines = text.splitlines()
    assert lines[0].startswith("%0 = data() : float32[4]")
    assert any(" = mul(%0, %1) : float32[4]  # aten.mul.Tensor" in l for l in lines), text
    assert lines[-1] == f"outputs: %{len(lines) - 2}"
    assert txc.metrics.counters().get("compile", 0) == 0  # nothing ran
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_stablehlo_is_what_the_sync_compiles(dev, tmp_path, monkeypatch):
    monkeypatch.setenv("TXC_DUMP_DIR", str(tmp_path))
    x = torch.ones(3).to(dev)
    y = x.exp()
    text = txc.debug.stablehlo([y])
    assert "stablehlo.exponential" in text
    key = txc.debug.cache_key([y])
    assert key.precision == torch.get_float32_matmul_precision() and key.device == 0
    y.cpu()
    dumped = [f for f in os.listdir(tmp_path) if f.startswith(f"graph-{key.graph:016x}")]
    assert len(dumped) == 1
    assert (tmp_path / dumped[0]).read_text().split("\n", 1)[1] == text


def test_debug_rejects_cpu_tensors():
    with pytest.raises(TypeError, match="expected xla tensors.*cpu"):
        txc.debug.stablehlo(torch.ones(2))

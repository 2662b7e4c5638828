"""bench/llama.py (issue 29's Llama training step per runtime) at its tiny
size on CPU: CPU eager and ours traced, two steps each in processes of their
own; the JSON has every field the table shows, the same loss on both
runtimes (same seed, same two AdamW steps), the issue's FLOP count, and the
replay counters of our runtime. Speed is not checked: this is the CI smoke
run. The runtime options map to the settings they name; a floor row (issue
43's diagnostic) runs its graphs once and then nothing on the device."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_llama", ROOT / "bench" / "llama.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_llama_bench_tiny_smoke(tmp_path):
    import torch
    import transformers
    out = tmp_path / "llama.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "llama.py"), "--tiny", "--steps", "2", "--warmup", "0",
                        "--runtimes", "cpu_eager", "traced", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ms/step" in p.stdout and "traced" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "torch_xla_core/bench/llama/1" and doc["batch"] == 2 and doc["seq"] == 32
    rows = {r["runtime"]: r for r in doc["rows"]}
    assert set(rows) == {"cpu_eager", "traced"}, rows
    # the MFU numerator: 6 * (parameters without the input embedding) + 12 * layers * hidden * seq
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**doc["config"]))
    n = sum(q.numel() for q in m.parameters()) - m.get_input_embeddings().weight.numel()
    for name, r in rows.items():
        assert "error" not in r, r
        for k in ("ms_per_step", "tokens_per_s", "first_step_s", "loss", "flops_per_token", "device", "mfu",
                  "peak_bytes"):
            assert k in r, (name, k)
        assert r["steps"] == 2 and r["ms_per_step"] > 0 and r["first_step_s"] > 0
        # the host's share: no more than the wall time (traced: until the step's sync returns; eager: all of it)
        assert 0 < r["host_ms_per_step"] <= r["ms_per_step"] * 1.001, r
        assert 0 < r["host_thread_cpu_ms_per_step"], r
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / (r["ms_per_step"] / 1e3), rel=1e-6)
        assert r["params_non_embedding"] == n and r["flops_per_token"] == 6 * n + 12 * 2 * 64 * 32
        assert r["mfu"] is None  # no peak FLOP/s known for a CPU
    t = rows["traced"]
    assert (t["replay"], t["replay_trace"], t["replay_refused"]) == (0, 0, 0)  # traced: no capture involved
    # timed: steps 2 and 3 (no warmup). Step 2 is a graph of its own (AdamW's state now exists), compiled once;
    # step 3 runs it again: a recompile per step would count 2. Each step is one launch (its sync's graph).
    assert t["compile"] == 1 and t["launches_per_step"] == 1, t
    assert t["env"]["PJRT_DEVICE"] == "CPU"
    assert "replay" not in rows["cpu_eager"]
    torch.testing.assert_close(torch.tensor(t["loss"]), torch.tensor(rows["cpu_eager"]["loss"]), rtol=2e-2, atol=2e-2)


def test_llama_bench_runtime_options():
    b = _bench()
    assert b.parse_spec("txc_compile:cublas,sdpa=cudnn") == ("txc_compile", {"cublas": True, "sdpa": "cudnn"})
    env = b.spec_env({"cublas": True, "sdpa": "flash", "autotune": "0"})
    assert "--xla_gpu_enable_triton_gemm=false" in env["XLA_FLAGS"] and "--xla_gpu_autotune_level=0" in env["XLA_FLAGS"]
    assert env["TXC_SDPA_KERNEL"] == "flash"
    for bad, msg in (("eager", "unknown runtime 'eager'"), ("traced:fast", "unknown option 'fast'"),
                     ("cuda_eager:cublas", "apply to our runtimes only"), ("txc_compile:floor", "the dynamo rows only"),
                     ("dynamo:floor=1", "unknown option 'floor=1'")):
        with pytest.raises(SystemExit, match=msg):
            b.parse_spec(bad)
    assert b.parse_spec("dynamo_step:floor") == ("dynamo_step", {"floor": True})


@pytest.mark.usefixtures("fresh_dynamo")
def test_llama_bench_floor_row_runs_nothing_after_its_first_step():
    """dynamo_opt:floor (bench/dynamo_floor.py): after the first step no graph
    replays, traces or launches, and nothing is read on the host: what its
    steps cost is torch's own work."""
    b = _bench()
    r = b.run_one("dynamo_opt:floor", dict(b.TINY), 2, 32, steps=2, warmup=1)
    assert r["launches_per_step"] == 0 and r["transfers_per_step"] == 0, r
    assert r["replay"] == r["replay_trace"] == r["compile"] == 0, r

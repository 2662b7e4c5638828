"""torch_xla-style helpers: mark_step, wait_device_ops, optimizer_step,
metrics.short_report."""
import os

import torch

import torch_xla_core as txc


def test_mark_step_runs_pending_graph():
    x = torch.ones(3, device=txc.device()) * 2
    txc.mark_step()
    assert txc.metrics.counters().get("execute") == 1
    txc.wait_device_ops()
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_optimizer_step_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    m = torch.nn.Linear(4, 2)
    m.load_state_dict(ref.state_dict())
    m = m.to(txc.device())
    opt, ropt = torch.optim.AdamW(m.parameters(), lr=0.01), torch.optim.AdamW(ref.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    for _ in range(3):
        m(x.to(txc.device())).sum().backward()
        txc.optimizer_step(opt, barrier=True)
        opt.zero_grad()
        ref(x).sum().backward()
        ropt.step()
        ropt.zero_grad()
    assert txc.metrics.counters().get("execute", 0) >= 3  # the barrier ran each step
    torch.testing.assert_close(m.weight.cpu(), ref.weight.detach(), atol=1e-5, rtol=1e-5)
    calls = []

    class Opt:
        def step(self, closure=None):
            calls.append(closure)
            return 7
    assert txc.optimizer_step(Opt(), optimizer_args={"closure": "c"}) == 7 and calls == ["c"]


def test_short_report():
    x = torch.randn(4).to(txc.device())
    txc.sync()  # the RNG state seeded by the test fixture
    txc.executor.clear_cache()  # an earlier test may have compiled x + 1
    txc.metrics.clear()
    for _ in range(2):
        (x + 1).cpu()
    r = txc.metrics.short_report()
    lines = r.splitlines()
    assert lines[0].startswith("compiles: 1 ")
    assert "1 hits, 1 misses" in lines[1]
    assert lines[2].startswith("executions: 2")
    assert "cpu fallbacks: 0" in lines[4]


def test_timer_percentiles_and_torch_xla_metric_aliases():
    from torch_xla_core import executor, metrics
    executor.clear_cache()
    metrics.clear()
    x = torch.ones(3, device=txc.device())
    keep = []  # a sync runs what live tensors need
    for i in range(4):
        keep.append((x * i).sum())
        txc.sync()
    keep.append(x.exp().amax())  # another graph
    txc.sync()
    cs = metrics.counters()
    st = metrics.timer_stats("compile")
    assert st["count"] == cs["compile"] >= 2
    assert st["min"] <= st["p50"] <= st["p90"] <= st["p99"] <= st["max"]
    assert abs(st["mean"] * st["count"] - st["total"]) < 1e-9
    assert metrics.timer_stats("never-timed") == {}
    # torch_xla's names read ours
    n, total, samples = metrics.metric_data("CompileTime")
    assert (n, total) == metrics.timers()["compile"] and len(samples) == cs["compile"]
    assert metrics.metric_data("ExecuteTime")[0] == 5
    assert metrics.counter_value("UncachedCompile") == cs["compile"]
    assert metrics.counter_value("CachedCompile") == cs["cache_hit"] == 5 - cs["compile"] > 0
    assert {"CompileTime", "ExecuteTime", "compile"} <= set(metrics.metric_names())
    assert {"CachedCompile", "UncachedCompile", "cache_hit"} <= set(metrics.counter_names())
    assert "p99=" in metrics.metrics_report()


def test_torch_xla_dtype_flags_warn_and_are_ignored():
    import subprocess
    import sys
    code = ("import torch, torch_xla_core as txc\n"
            "x = torch.ones(2, device=txc.device())\n"
            "print(x.dtype, (x * 1.5).dtype)\n")
    env = dict(os.environ, XLA_USE_BF16="1", XLA_USE_32BIT_LONG="1")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["torch.float32", "torch.float32"]
    assert "XLA_USE_BF16 is set but torch_xla_core ignores it" in p.stderr
    assert "torch.autocast('xla', dtype=torch.bfloat16)" in p.stderr
    assert "XLA_USE_32BIT_LONG is set" in p.stderr
    env = dict(os.environ, XLA_USE_BF16="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "XLA_USE_BF16" not in p.stderr


def test_long_compile_shows_a_progress_line():
    import subprocess
    import sys
    code = ("import torch, torch_xla_core as txc\n"
            "x = torch.ones(64, 64, device=txc.device())\n"
            "for _ in range(400):  # a graph that compiles for well over the 0.05 s wait slice\n"
            "    x = torch.tanh(x @ x) + x.sum(0)\n"
            "txc.sync()\n")
    run = lambda v: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,  # noqa: E731
                                   env=dict(os.environ, TXC_COMPILE_PROGRESS=v))
    p = run("0.001")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("torch_xla_core: compil")]
    assert lines[0].startswith("torch_xla_core: compiling graph ") and " ops, 1 outputs): " in lines[0]
    assert lines[-1].startswith("torch_xla_core: compiled graph ") and lines[-1].endswith(" s")
    p = run("0")
    assert p.returncode == 0 and "torch_xla_core: compil" not in p.stderr

"""txc.profiler.trace: the Chrome trace JSON loads and holds the spans of
a step (trace, sync, lower, compile, execute, transfers, step markers) in
order and nested as they ran, with the graph's aten op names."""
import json
import os

import pytest
import torch

import torch_xla_core as txc


def _spans(path, ours=True):
    """Complete events: ours (this process's pid) or, ours=False, the merged JAX/PJRT ones."""
    with open(path) as f:
        doc = json.load(f)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and (e["pid"] == os.getpid()) == ours]


def _inside(inner, outer):
    return outer["ts"] <= inner["ts"] + 1e-3 and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_trace_spans(tmp_path):
    w = torch.randn(8, 8)
    txc.sync()  # the RNG state seeded by the test fixture: not part of the steps' graph
    txc.executor.clear_cache()  # the first step must compile
    with txc.profiler.trace(str(tmp_path / "prof")) as t:
        for i in range(2):
            with txc.profiler.step(i):
                x = torch.randn(4, 8).to(txc.device())
                y = torch.softmax(x @ w.to(txc.device()), -1).sum()
                txc.sync(wait=True)
                y.cpu()
    assert os.path.dirname(t.path) == str(tmp_path / "prof")
    spans = _spans(t.path)
    names = [e["name"] for e in spans]
    for n in ("step 0", "step 1", "trace", "sync", "lower", "compile", "execute", "transfer_to_device",
              "transfer_to_host"):
        assert n in names, n
    syncs = [e for e in spans if e["name"] == "sync" and "graph" in e.get("args", {})]
    assert len(syncs) == 2 and syncs[0]["args"]["graph"] == syncs[1]["args"]["graph"]  # one graph, cached
    ops = syncs[0]["args"]["ops"]
    assert any("mm" in k for k in ops) and any("softmax" in k for k in ops), ops
    assert names.count("compile") == 1  # the second step hit the cache
    steps = [e for e in spans if e["name"].startswith("step ")]
    lower = next(e for e in spans if e["name"] == "lower")
    assert _inside(lower, syncs[0]) and _inside(syncs[0], steps[0]) and _inside(syncs[1], steps[1])
    execs = [e for e in spans if e["name"] == "execute"]
    assert all(any(_inside(e, s) for s in syncs) for e in execs)
    traces = [e for e in spans if e["name"] == "trace"]
    assert traces[0]["ts"] + traces[0]["dur"] <= syncs[0]["ts"] + 1e-3  # tracing precedes its sync
    assert steps[0]["ts"] + steps[0]["dur"] <= steps[1]["ts"]


def test_device_trace_is_merged_on_one_clock(tmp_path):
    """device=True (the default): JAX's profiler trace of the same block (PJRT's executable launches,
    XLA's compiler passes) lands in the same file on our clock, and JAX's own files stay beside it."""
    w = torch.randn(16, 16)
    txc.sync()
    txc.executor.clear_cache()
    with txc.profiler.trace(str(tmp_path)) as t:
        for i in range(3):
            with txc.profiler.step(i):
                y = torch.tanh(torch.randn(16, 16).to(txc.device()) @ w.to(txc.device())).sum()
                txc.sync(wait=True)
    ours, jax_spans = _spans(t.path), _spans(t.path, ours=False)
    assert os.path.exists(os.path.join(t.device_dir, "perfetto_trace.json.gz"))
    assert any(f.endswith(".xplane.pb") for f in os.listdir(t.device_dir))  # TensorBoard's profile plugin
    assert not any(e["name"] == "txc_clock" for e in jax_spans)  # the alignment mark is consumed
    launches = [e for e in jax_spans if e["name"] == "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice"]
    syncs = [e for e in ours if e["name"] == "sync"]
    assert len(launches) == 3 and len(syncs) >= 3, (len(launches), len(syncs))
    slack = 20e3  # us: the mark is placed to within its own duration; 20 ms is far above that
    for launch in launches:  # every PJRT launch happened inside one of our syncs
        assert any(s["ts"] - slack <= launch["ts"] <= s["ts"] + s["dur"] + slack for s in syncs), launch
    assert any("xla" in e["name"].lower() or "hlo" in e["name"].lower() or e["name"] == "cse" for e in jax_spans)
    y.cpu()


def test_host_only_trace_has_no_jax_events(tmp_path):
    with txc.profiler.trace(str(tmp_path), device=False) as t:
        (torch.ones(3).to(txc.device()) * 2).cpu()
    assert t.device_dir is None and _spans(t.path) and not _spans(t.path, ours=False)


def test_no_listener_when_off(tmp_path):
    with txc.profiler.trace(str(tmp_path)):
        pass
    assert not txc.metrics._listeners
    with txc.profiler.step(0):  # no trace: a no-op
        pass


def test_unwritable_dir_fails_before_the_run(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    ran = []
    with pytest.raises(RuntimeError, match="cannot write the trace"):
        with txc.profiler.trace(str(f / "sub")):
            ran.append(1)
    assert not ran


def _jax_run_files(t):
    return sorted(os.listdir(t.device_dir))


@pytest.mark.parametrize("damage", [b"", b"\x1f\x8b\x08\x00garbage", None, b"[1, 2]"])
def test_an_unreadable_device_trace_keeps_our_spans(tmp_path, monkeypatch, damage):
    """JAX's trace file of the run truncated, not gzip, cut mid-stream, or
    not a trace: a warning naming it, our trace written with our spans, and
    JAX's files left where they are."""
    import gzip
    real_stop = txc.profiler.Trace.stop_device

    def stop_and_damage(self):
        real_stop(self)
        (f,) = [os.path.join(self.device_dir, n) for n in os.listdir(self.device_dir) if n.endswith(".trace.json.gz")]
        if damage is None:  # a valid gzip header, the stream cut in the middle
            with open(f, "rb") as g:
                whole = g.read()
            data = whole[:len(whole) // 2]
        elif damage.startswith(b"["):
            data = gzip.compress(damage)
        else:
            data = damage
        with open(f, "wb") as g:
            g.write(data)
    monkeypatch.setattr(txc.profiler.Trace, "stop_device", stop_and_damage)
    with pytest.warns(RuntimeWarning, match=r"JAX's device trace .*\.trace\.json\.gz could not be read"):
        with txc.profiler.trace(str(tmp_path)) as t:
            (torch.ones(3).to(txc.device()) * 2).cpu()
    assert "sync" in [e["name"] for e in _spans(t.path)] and not _spans(t.path, ours=False)
    assert any(f.endswith(".trace.json.gz") for f in _jax_run_files(t))
    assert any(f.endswith(".xplane.pb") for f in _jax_run_files(t))


def test_an_older_run_in_the_directory_is_never_merged(tmp_path):
    """A trace directory already holding a JAX run (here a damaged one, dated
    in the future so that it is the newest): this trace merges its own run."""
    old = tmp_path / "jax" / "plugins" / "profile" / "2099_01_01_00_00_00"
    old.mkdir(parents=True)
    (old / "perfetto_trace.json.gz").write_bytes(b"not gzip")
    os.utime(old, (4102444800, 4102444800))
    with txc.profiler.trace(str(tmp_path)) as t:
        (torch.ones(3).to(txc.device()) * 2).cpu()
    assert t.device_dir != str(old) and _spans(t.path, ours=False)
    assert (old / "perfetto_trace.json.gz").read_bytes() == b"not gzip"


def test_a_jax_entry_that_is_a_file_fails_before_the_run(tmp_path):
    (tmp_path / "jax").write_text("")
    ran = []
    with pytest.raises(RuntimeError, match=r"jax' is not a directory, and JAX's profiler writes its files there"):
        with txc.profiler.trace(str(tmp_path)):
            ran.append(1)
    assert not ran and not txc.metrics._listeners


def test_a_failed_jax_export_keeps_our_trace_and_the_profiler_usable(tmp_path, monkeypatch):
    """JAX's export failing at the end of a trace (a full disk, say): a
    warning, our trace written, and the next trace starts and merges."""
    import jax

    def failing_stop():
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(jax.profiler, "stop_trace", failing_stop)
        with pytest.warns(RuntimeWarning, match="JAX's profiler could not write its trace .*No space left"):
            with txc.profiler.trace(str(tmp_path / "a")) as t:
                (torch.ones(3).to(txc.device()) * 2).cpu()
    assert _spans(t.path) and t.device_dir is None
    with txc.profiler.trace(str(tmp_path / "b")) as t2:
        (torch.ones(3).to(txc.device()) * 3).cpu()
    assert _spans(t2.path, ours=False)

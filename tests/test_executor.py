"""The executor (torch_xla_core/_execution/executor.py): a failed graph raises once and
names its op, leaving other tensors working; out-of-memory names the largest
buffers; the compile cache is bounded; a compile interrupted by Ctrl-C is
reused, not repeated; concurrent threads with deferred checks; a handler's
error is not kept alive."""
import _thread
import gc
import re
import signal
import threading
import time
import weakref

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import compile_cache, executor, runtime
from torch_xla_core._runtime import dtypes as _dtypes


def _count(name):
    return txc.metrics.counters().get(name, 0)


@pytest.fixture
def failing_op(monkeypatch):
    """Compiles fail, as XLA's parser fails, at the line of any stablehlo.cosine:
    a compiler error at a known op (the messages carry '-:LINE:COL')."""
    real = runtime.compile_text

    def compile_text(text, *a, **k):
        for i, line in enumerate(text.splitlines(), 1):
            if "stablehlo.cosine" in line:
                raise RuntimeError(f"INVALID_ARGUMENT: -:{i}:12: error: injected failure")
        return real(text, *a, **k)
    monkeypatch.setattr(runtime, "compile_text", compile_text)


def test_failed_graph_raises_once_names_the_aten_op_and_spares_the_rest(dev, failing_op):
    ok = torch.ones(3, device=dev) * 2           # pending, unrelated
    bad = torch.ones(3, device=dev).cos() + 1    # its graph fails
    with pytest.raises(executor.GraphError, match=r"core op 'cos'.*aten\.cos\.default.*injected failure"):
        txc.sync()
    assert _count("graph_failed") == 1
    # The unrelated tensor still computes; so do new ones.
    assert ok.cpu().tolist() == [2.0, 2.0, 2.0]
    assert (torch.arange(3.0, device=dev) + 1).cpu().tolist() == [1.0, 2.0, 3.0]
    txc.sync()  # no longer fails
    # The failed tensor raises the same clear error when read or used.
    with pytest.raises(RuntimeError, match="aten.cos.default"):
        bad.cpu()
    with pytest.raises(RuntimeError, match="aten.cos.default"):
        bad * 2
    del bad
    txc.sync()


def test_failed_materialize_keeps_raising_and_other_syncs_work(dev, failing_op):
    x = torch.ones(2, device=dev).cos()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="core op 'cos'"):
            x.cpu()
    assert (torch.ones(2, device=dev) - 3).cpu().tolist() == [-2.0, -2.0]


def test_unlocated_failure_finds_the_failing_tensor_by_halves(dev, monkeypatch):
    real = runtime.compile_text

    def compile_text(text, *a, **k):
        if "stablehlo.cosine" in text:
            raise RuntimeError("INTERNAL: injected failure without a location")
        return real(text, *a, **k)
    monkeypatch.setattr(runtime, "compile_text", compile_text)
    good = [torch.full((2,), float(i), device=dev) + 1 for i in range(5)]
    bad = torch.ones(2, device=dev).cos()
    with pytest.raises(executor.GraphError, match="without a location"):
        txc.sync()
    assert [g.cpu().tolist() for g in good] == [[i + 1.0] * 2 for i in range(5)]
    with pytest.raises(RuntimeError, match="without a location"):
        bad.cpu()


def test_a_real_compile_failure_is_named(dev):
    # A core op XLA refuses, built straight from the core (torch ops never
    # make it): stablehlo.iota has no bool results.
    bad = txc._tensor.op("iota", attrs=(_dtypes.code(torch.bool), [3], 0))
    fine = torch.ones(2, device=dev) + 1
    with pytest.raises(executor.GraphError, match=r"core op 'iota' bool\[3\].*stablehlo\.iota"):
        txc.sync()
    assert fine.cpu().tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="core op 'iota'"):
        bad.cpu()


def test_out_of_memory_names_the_largest_buffers(dev, monkeypatch):
    def launch(exe, params):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.")
    a = torch.ones(1024, 512, device=dev)
    b = a @ torch.ones(512, 1024, device=dev)
    monkeypatch.setattr(runtime, "launch", launch)
    with pytest.raises(torch.OutOfMemoryError) as info:
        txc.sync()
    msg = str(info.value)
    first = msg.splitlines()[1]
    assert first == "  4.0 MiB: core op 'dot' float32[1024, 1024], made by aten.mm.default", first
    assert "RESOURCE_EXHAUSTED" in msg
    monkeypatch.undo()
    # Nothing was marked failed: after freeing memory the same tensors compute.
    assert b.cpu()[0, 0].item() == 512.0


def test_compile_cache_is_bounded_lru(dev, monkeypatch):
    monkeypatch.setenv("TXC_COMPILE_CACHE_SIZE", "2")
    executor.clear_cache()
    x = torch.ones(4, device=dev)
    graphs = [lambda: (x + 1).cpu(), lambda: (x * 3).cpu(), lambda: (x - 5).exp().cpu()]
    for g in graphs:
        g()
    assert executor.cached_count() == 2 and _count("cache_evict") == 1 and _count("compile") == 3
    graphs[2]()                      # most recent: a hit
    assert _count("compile") == 3
    graphs[0]()                      # evicted first: compiles again
    assert _count("compile") == 4 and _count("cache_evict") == 2
    monkeypatch.setenv("TXC_COMPILE_CACHE_SIZE", "zero")
    with pytest.raises(ValueError, match="TXC_COMPILE_CACHE_SIZE"):
        executor.cache_size()


def test_interrupted_compile_is_reused_not_repeated(dev, monkeypatch, request):
    gc.collect()
    txc.sync(wait=True)  # nothing an earlier test left pending (a sharded graph compiles another way) joins this sync
    # Ctrl-C as Python delivers it by default (a library imported by an earlier test in this process may have
    # replaced the SIGINT handler; interrupt_main() then raises nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    real = runtime.compile_text
    started, sent = threading.Event(), threading.Event()

    def slow_compile(text, *a, **k):
        started.set()
        sent.wait(10)     # the interrupt is on its way before this compile can end
        time.sleep(0.5)
        return real(text, *a, **k)
    monkeypatch.setattr(runtime, "compile_text", slow_compile)
    monkeypatch.setattr(compile_cache, "load", lambda key, text: None)  # compiled here, whatever was cached
    executor.clear_cache()  # the graph must really compile (an earlier test may have cached it)
    x = torch.arange(5.0).to(dev)

    def interrupt():
        if started.wait(10):
            _thread.interrupt_main()
        sent.set()
    threading.Thread(target=interrupt).start()
    y = x.sin() * 7
    try:
        txc.sync()
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    assert started.is_set(), "the graph did not compile through runtime.compile_text"
    assert interrupted, (f"no KeyboardInterrupt reached the sync (thread {threading.current_thread().name}, "
                         f"SIGINT handler {signal.getsignal(signal.SIGINT)})")
    assert _count("compile") == 0  # control came back before the compile ended
    txc.sync()  # the same graph again: waits for the compile under way
    torch.testing.assert_close(y.cpu(), torch.arange(5.0).sin() * 7)
    assert _count("compile") == 1 and _count("compile_reused") == 1


def test_threads_with_deferred_checks(dev):
    w = torch.randn(10, 4, device=dev)
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(20):
                idx = torch.randint(0, 10, (6,), generator=g).to(dev)
                t = torch.randint(0, 4, (6,), generator=g).to(dev)
                loss = torch.nn.functional.cross_entropy(w.index_select(0, idx), t)
                loss.item()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    # A violated check from a thread still raises, naming the op.
    bad = w.index_select(0, torch.tensor([11]).to(dev))
    with pytest.raises(IndexError, match="index_select"):
        bad.cpu()


def test_metrics_count_exactly_under_threads():
    def work():
        for _ in range(2000):
            txc.metrics.counter_add("threads_test")
    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert _count("threads_test") == 8000


def test_handler_error_is_not_kept_alive(dev):
    class Marker:
        pass

    def fail(marker):
        torch.ones(2, device=dev).view(3)  # the view handler raises; its traceback holds `marker`

    m = Marker()
    ref = weakref.ref(m)
    try:
        fail(m)
    except RuntimeError:
        pass
    del m
    gc.collect()
    (torch.ones(1, device=dev) + 1).cpu()  # the next op drops the old error
    gc.collect()
    assert ref() is None


def test_load_all_surfaces_import_errors(monkeypatch):
    import importlib
    from torch_xla_core import _ops
    real = importlib.import_module

    def imp(name, *a, **k):
        if name == "torch_xla_core._ops.conv":
            raise ModuleNotFoundError("No module named 'torch_xla_core._ops.conv'", name="torch_xla_core._ops.conv")
        return real(name, *a, **k)
    monkeypatch.setattr(importlib, "import_module", imp)
    with pytest.raises(ModuleNotFoundError, match="conv"):
        _ops.load_all()


def test_a_graph_failing_while_it_runs_poisons_what_it_computes(dev, monkeypatch):
    """A sync(wait=True) hands the outputs to their tensors before it waits
    (that host work overlaps the device's); a failure found while waiting
    leaves those tensors holding the error, named, not a garbage value."""
    a = torch.ones(4, 4).to(dev)  # device data: an input of the graph
    b = (a * 3).sum(0)
    real = runtime.wait_ready

    def failing(outs, t0):
        raise RuntimeError("INTERNAL: injected failure while running")
    monkeypatch.setattr(runtime, "wait_ready", failing)
    with pytest.raises(executor.GraphError, match="failed while running: INTERNAL: injected"):
        txc.sync(wait=True)
    monkeypatch.setattr(runtime, "wait_ready", real)
    with pytest.raises(RuntimeError, match="failed while running: INTERNAL: injected"):
        b.cpu()
    assert a.cpu().sum().item() == 16.0  # an input, not computed by it: unaffected

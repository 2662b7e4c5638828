"""torch_xla_core/_runtime/peers.py without processes: where a job's listeners bind
for a coordinator address and the settings, and how a wait turns a peer's
death (a ring link closing without a goodbye) into PeerLostError. The processes
themselves: tests/test_multiprocess.py."""
import threading
import time
import types

import pytest

from torch_xla_core import peers


@pytest.mark.parametrize("coordinator, env, want", [
    ("127.0.0.1:1234", {}, ("127.0.0.1:1234", "127.0.0.1")),
    ("localhost:1234", {}, ("localhost:1234", "127.0.0.1")),
    ("[::1]:1234", {}, ("[::1]:1234", "127.0.0.1")),
    ("10.0.0.5:1234", {}, ("10.0.0.5:1234", None)),  # several machines: the address named; gloo's default
    ("node0.cluster:1234", {}, ("node0.cluster:1234", None)),
    ("10.0.0.5:1234", {"TXC_COORDINATOR_BIND": "[::]:1234", "TXC_GLOO_HOSTNAME": "10.0.0.6"},
     ("[::]:1234", "10.0.0.6")),  # every interface only when asked
])
def test_bind_addresses(monkeypatch, coordinator, env, want):
    for k in ("TXC_COORDINATOR_BIND", "TXC_GLOO_HOSTNAME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert peers.bind_addresses(coordinator) == want


def test_a_coordinator_without_a_port_is_refused():
    with pytest.raises(RuntimeError, match=r"TXC_COORDINATOR='node0' is not host:port"):
        peers.bind_addresses("node0")


class _Pending:
    """A device value that never becomes ready (its collective waits on a dead peer)."""

    def is_ready(self):
        return False

    def block_until_ready(self):
        raise AssertionError("blocked for good")


class _KV:
    """jax's key-value store as _Ring uses it (the coordination service's)."""

    def __init__(self):
        self.d, self.cv = {}, threading.Condition()

    def key_value_set(self, k, v):
        with self.cv:
            self.d[k] = v
            self.cv.notify_all()

    def blocking_key_value_get(self, k, timeout_ms):
        with self.cv:
            assert self.cv.wait_for(lambda: k in self.d, timeout_ms / 1000)
            return self.d[k]


def _ring_of_two():
    kv, rings = _KV(), {}
    ths = [threading.Thread(target=lambda r=r: rings.__setitem__(r, peers._Ring(kv, r, 2, "127.0.0.1", 10)))
           for r in (0, 1)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return rings


def _close(ring):
    ring.close()  # as the process's death would: the kernel ends its connections


def test_a_peer_whose_link_closes_raises_in_the_waiting_call(monkeypatch):
    monkeypatch.setattr(peers, "_watching", True)
    monkeypatch.setattr(peers, "_lost", None)
    rings = _ring_of_two()
    monkeypatch.setattr(peers, "_ring", rings[0])
    threading.Timer(0.2, lambda: _close(rings[1])).start()  # process 1 dies: its links close, no goodbye
    t0 = time.monotonic()
    with pytest.raises(peers.PeerLostError) as e:
        peers.wait([_Pending()], "copying an xla tensor to the CPU")
    assert time.monotonic() - t0 < 5
    assert (e.value.peer, e.value.status) == (1, None)
    assert str(e.value).startswith("copying an xla tensor to the CPU: process 1 of 2 died (its link to process 0 "
                                   "closed without a goodbye: killed, or crashed), and this value waits on it")
    assert isinstance(e.value, RuntimeError) and "Save what you need from the host now" in str(e.value)
    _close(rings[0])


def test_a_goodbye_is_no_loss_and_a_notice_is_passed_on(monkeypatch):
    monkeypatch.setattr(peers, "_lost", None)
    rings = _ring_of_two()
    monkeypatch.setattr(peers, "_ring", rings[0])
    rings[1].send("bye")
    _close(rings[1])
    time.sleep(0.3)
    assert peers.lost() is None  # a clean exit
    rings = _ring_of_two()
    got = []
    monkeypatch.setattr(peers._Ring, "send", lambda self, line: got.append(line))  # what is passed on
    for s in rings[1].links:  # process 1 passes on a notice about process 2
        s.sendall(b"lost 2 7 process 2 of 3 exited with status 7\n")
    for _ in range(100):
        if peers.lost() is not None:
            break
        time.sleep(0.01)
    assert peers._lost == ("process 2 of 3 exited with status 7", 2, 7)
    assert got == ["lost 2 7 process 2 of 3 exited with status 7"]
    for r in rings.values():
        _close(r)


def test_one_process_waits_as_before(dev):
    import torch
    x = (torch.ones(3).to(dev) * 2)
    from torch_xla_core._tracing import tensor as _tensor
    assert not peers._watching
    peers.wait([_tensor.materialize(x)])  # block_until_ready: no polling, nothing raised
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_blocking_hands_back_values_and_errors_and_raises_once_a_peer_is_lost(monkeypatch):
    monkeypatch.setattr(peers, "_watching", True)
    monkeypatch.setattr(peers, "_lost", None)
    assert peers.blocking(lambda: 42, "a barrier") == 42
    with pytest.raises(KeyError, match="nope"):
        peers.blocking(lambda: {}["nope"], "a barrier")
    release = threading.Event()
    threading.Timer(0.2, lambda: setattr(peers, "_lost", ("process 0 of 2 exited with status 9", 0, 9))).start()
    with pytest.raises(peers.PeerLostError, match=r"^torch.save of a sharded xla tensor: process 0 of 2 exited"):
        peers.blocking(lambda: release.wait(30), "torch.save of a sharded xla tensor")  # a barrier for good
    release.set()
    with pytest.raises(peers.PeerLostError):  # known dead before the call: raised at once
        peers.blocking(lambda: 1, "a barrier")


class _Held:
    """A device value that becomes ready once `release` is set."""

    def __init__(self):
        self.release = threading.Event()

    def is_ready(self):
        return self.release.is_set()

    def block_until_ready(self):
        assert self.release.wait(30)


def _held_value(monkeypatch):
    """(_Held, the thread names that blocked on it): jaxlib's one call for a
    list of buffers, made to wait on _Held values."""
    blocked = []

    def batched(arrays):
        blocked.append(threading.current_thread().name)
        for a in arrays:
            a.block_until_ready()
    monkeypatch.setattr(peers, "_jax", types.SimpleNamespace(batched_block_until_ready=batched))
    return _Held(), blocked


def test_a_multi_process_wait_blocks_on_a_helper_thread_until_the_value_is_ready(monkeypatch):
    monkeypatch.setattr(peers, "_watching", True)
    monkeypatch.setattr(peers, "_lost", None)
    y, blocked = _held_value(monkeypatch)
    threading.Timer(0.2, y.release.set).start()
    peers.wait([y], "waiting on the device")
    assert y.is_ready() and blocked == ["txc-wait"]  # the helper waited, not the caller
    peers.wait([y], "waiting on the device")  # ready: returns without asking the helper
    assert blocked == ["txc-wait"]


def test_a_peer_lost_while_the_helper_waits_raises_in_the_waiting_call(monkeypatch):
    monkeypatch.setattr(peers, "_watching", True)
    monkeypatch.setattr(peers, "_lost", None)
    y, blocked = _held_value(monkeypatch)
    rings = _ring_of_two()
    monkeypatch.setattr(peers, "_ring", rings[0])
    threading.Timer(0.2, lambda: _close(rings[1])).start()  # process 1 dies while y is not ready
    t0 = time.monotonic()
    with pytest.raises(peers.PeerLostError, match=r"^a step's sync: process 1 of 2 died"):
        peers.wait([y], "a step's sync")
    assert time.monotonic() - t0 < 5  # woken by the loss, not by the value
    assert not y.is_ready() and blocked == ["txc-wait"]
    y.release.set()  # the helper's wait ends; a value ready after the loss still returns
    peers.wait([y], "waiting on the device")
    _close(rings[0])

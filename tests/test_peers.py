"""torch_xla_core/peers.py without processes: where a job's listeners bind
for a coordinator address and the settings, and how a wait turns a peer's
death (the launcher's notice) into PeerLostError. The processes
themselves: tests/test_multiprocess.py."""
import os
import threading
import time

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


def test_a_notice_from_the_launcher_raises_in_the_waiting_call(monkeypatch):
    r, w = os.pipe()
    monkeypatch.setattr(peers, "_watching", True)
    monkeypatch.setattr(peers, "_lost", None)
    monkeypatch.setenv("TXC_COLLECTIVE_TIMEOUT", "7")
    threading.Thread(target=peers._read_notices, args=(r,), daemon=True).start()
    threading.Timer(0.2, lambda: os.write(w, b"lost 1 3 process 1 of 2 exited with status 3\n")).start()
    t0 = time.monotonic()
    with pytest.raises(peers.PeerLostError) as e:
        peers.wait([_Pending()], "copying an xla tensor to the CPU")
    assert time.monotonic() - t0 < 5
    assert (e.value.peer, e.value.status) == (1, 3)
    assert str(e.value).startswith("copying an xla tensor to the CPU: process 1 of 2 exited with status 3, and "
                                   "this value waits on it")
    assert "7 s (TXC_COLLECTIVE_TIMEOUT)" in str(e.value) and isinstance(e.value, RuntimeError)
    assert peers.lost() == "process 1 of 2 exited with status 3"
    os.close(w)
    os.close(r)


def test_the_launcher_gone_is_a_lost_peer(monkeypatch):
    r, w = os.pipe()
    monkeypatch.setattr(peers, "_lost", None)
    os.close(w)  # the launcher's end closed: it exited (or was killed)
    peers._read_notices(r)
    assert peers.lost().startswith("the launcher (torch_xla_core.launch, pid ")
    os.close(r)


def test_one_process_waits_as_before(dev):
    import torch
    x = (torch.ones(3).to(dev) * 2)
    from torch_xla_core import _tensor
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

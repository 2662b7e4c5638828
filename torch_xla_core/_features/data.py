"""DeviceLoader: batches already on the xla device, moved in the background.

    loader = txc.data.DeviceLoader(torch_loader, prefetch=4)
    for x, y in loader:        # xla tensors; the next batches are in flight
        step(x, y)

It wraps any iterable (a torch DataLoader, a list, a generator) of tensors or
pytrees of them (tuples, lists, dicts, namedtuples); a background thread
moves the next `prefetch` batches to the device (jax's device_put is
asynchronous) through a bounded queue while the current step runs. Leaves
that are not tensors pass through untouched. An exception raised by the
wrapped iterable (or a DataLoader's workers) is re-raised in the consumer,
at the batch where it happened. Breaking out of the loop (or an exception in
the loop body) stops the thread and drops the prefetched batches; each
`iter()` starts afresh, so the loader can be iterated once per epoch.

As torch_xla's MpDeviceLoader, each batch after the first starts with a
sync (txc.mark_step) of what the previous step traced, so a loop over the
loader needs no sync of its own (mark_step=False turns that off).
`transform(batch)` runs on the loader thread on each moved batch: the hook
for input sharding. With DataLoader(num_workers>0), use the "spawn" or
"forkserver" start method: this process already runs PJRT threads, which
fork does not copy."""
import queue
import threading

import torch
import torch.utils._pytree as pytree

from .._tracing import tensor as _tensor

_END = object()


class _Raised:
    def __init__(self, exc):
        self.exc = exc


class DeviceLoader:
    """Iterates a loader's batches moved to the xla device, `prefetch` batches ahead (torch_xla's MpDeviceLoader)."""
    def __init__(self, loader, prefetch: int = 4, device=None, mark_step: bool = True, transform=None):
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"DeviceLoader: prefetch={prefetch!r} must be an int >= 1 (batches moved ahead)")
        if device is None:
            device = _tensor.DEVICE  # xla:0
        self.loader = loader
        self.prefetch = prefetch
        self.device = torch.device(device)
        self.mark_step = mark_step
        self.transform = transform

    def __len__(self) -> int:
        try:
            return len(self.loader)
        except TypeError:
            raise TypeError(f"DeviceLoader: the wrapped {type(self.loader).__name__} has no len()") from None

    def _move(self, batch):
        def leaf(x):
            return x.to(self.device, non_blocking=True) if isinstance(x, torch.Tensor) else x
        out = pytree.tree_map(leaf, batch)
        return self.transform(out) if self.transform is not None else out

    def _produce(self, q: queue.Queue, stop: threading.Event):
        def put(item) -> bool:  # False once the consumer has gone
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in self.loader:
                if stop.is_set() or not put(self._move(batch)):
                    return
        except BaseException as e:  # re-raised in the consumer
            put(_Raised(e))
            return
        put(_END)

    def __iter__(self):
        q = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(q, stop), name="txc-device-loader", daemon=True)
        thread.start()
        first = True
        try:
            while True:
                item = q.get()
                if self.mark_step and not first:
                    _tensor.sync_lazy()  # the step that consumed the previous batch
                first = False
                if item is _END:
                    return
                if isinstance(item, _Raised):
                    raise item.exc
                yield item
        finally:
            stop.set()
            while True:  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
            thread.join()

"""SIGKILL during saves (tests/test_atomic_save.py): `kill_saves.py MODE DIR N OUT`.
MODE txc: txc.save of a state of xla tensors (~6 MiB) to DIR/ckpt.pt;
MODE dcp: dcp.save with SPMDSavePlanner and AtomicFileSystemWriter to DIR/ckpt.
This process imports torch_xla_core but never starts its runtime; it forks
one child per save (the child starts the runtime, uploads the state of
version v, says so on a pipe, then saves), kills the child with SIGKILL a
random delay after that (uniform over 0 .. a span: first 1.5x an unkilled
save's length, then shortened after a kill that came too late and widened
after one that came before the temporary file),
and reads the path back on the CPU: it must hold the last committed version
or the new one, bit-equal. Writes OUT (JSON): one record per kill."""
import json
import traceback
import os
import random
import signal
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.tensor  # noqa: F401  (imported by a first .to("xla"): here once, not in every child)

import torch_xla_core as txc
from torch_xla_core.distributed_checkpoint import AtomicFileSystemWriter, SPMDSavePlanner

torch.set_num_threads(1)  # no OpenMP pool in this process: a forked child would wait on its locks for good
mode, folder, n_kills, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
path = os.path.join(folder, "ckpt.pt" if mode == "txc" else "ckpt")
SIZES = {"a": (512, 1024), "b": (256, 2048), "c": (1000,)}  # float32: 2 + 2 MiB + 4 KB; "d": bf16 1 MiB


def state(v: int) -> dict:
    g = torch.Generator().manual_seed(v)
    s = {k: torch.randn(*shape, generator=g) for k, shape in SIZES.items()}
    s["d"] = torch.randn(512, 1024, generator=g).to(torch.bfloat16)
    return s


def save_in_child(v: int, w: int) -> None:
    """The child: the state of version v on the device, a byte on w, the save."""
    try:
        xs = {k: t.to("xla") for k, t in state(v).items()}
        txc.sync()
        xs["a"].cpu()  # the runtime started and the data uploaded before the byte
        os.write(w, b"r")
        if mode == "txc":
            txc.save({"version": v, **xs}, path)
        else:
            dcp.save({"version": v, **xs}, storage_writer=AtomicFileSystemWriter(path), planner=SPMDSavePlanner())
        os._exit(0)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)


def read() -> dict:
    if mode == "txc":
        return torch.load(path, map_location="cpu", weights_only=True)
    st = {"version": None, **{k: torch.empty(0) for k in ("a", "b", "c", "d")}}
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    st.update({k: torch.empty(md[k].size, dtype=md[k].properties.dtype) for k in ("a", "b", "c", "d")})
    dcp.load(st, checkpoint_id=path, planner=dcp.DefaultLoadPlanner())
    return st


def temps() -> list:
    return [n for n in os.listdir(folder) if ".txc-tmp." in n]


def run(v: int, delay):
    """Saves version v in a child, killed `delay` s after it starts saving
    (None: not killed); returns (seconds from the byte to the child's end or
    kill, the child's exit status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        save_in_child(v, w)
    os.close(w)
    if os.read(r, 1) != b"r":
        os.waitpid(pid, 0)
        raise RuntimeError(f"the child saving version {v} died before saving")
    os.close(r)
    t0 = time.perf_counter()
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return time.perf_counter() - t0, status


os.makedirs(folder, exist_ok=True)
length, status = run(0, None)  # version 0, committed: the old checkpoint of the first kill
assert status == 0 and read()["version"] == 0, status
lengths = [length]
for v in (1, 2):
    length, status = run(v, None)
    assert status == 0
    lengths.append(length)
committed = 2
span = 1.5 * sorted(lengths)[1]
rng = random.Random(0)
records = []
for i in range(n_kills):
    v = committed + 1
    delay = rng.uniform(0, span)
    _, status = run(v, delay)
    left = temps()  # a temporary file or directory left: the kill landed mid-write
    rec = {"version": v, "delay_s": round(delay, 4), "killed": os.WIFSIGNALED(status), "temp_left": bool(left)}
    try:
        got = read()
    except Exception as e:  # noqa: BLE001  (a lost checkpoint)
        rec.update(result="lost", error=f"{type(e).__name__}: {e}"[:300])
    else:
        found = got["version"]
        rec["result"] = "new" if found == v else "old" if found == committed else f"other {found}"
        want = state(found)
        rec["bit_equal"] = all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in want.items())
        if found == v:
            committed = v
    records.append(rec)
    # home in on the write: a kill after the commit shortens the span, one before the temporary file widens it
    if rec["result"] == "new":
        span *= 0.8
    elif not left:
        span *= 1.25
json.dump({"mode": mode, "save_s": lengths, "kill_span_s": span, "kills": records,
           "temps_at_end": temps()}, open(out, "w"), indent=1)

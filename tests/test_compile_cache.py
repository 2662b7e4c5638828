"""The persistent compile cache (torch_xla_core/_execution/compile_cache.py): a second
process loads what the first compiled (one-device graphs and graphs
partitioned over a mesh, in one process and in two; another mesh misses),
corrupt entries are recompiled and rewritten, the directory is
size-bounded; only this user's own directory and files feed it (an unsafe
directory is not used, a planted entry never loaded). Always a temporary
directory."""
import json
import os
import subprocess
import sys

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import compile_cache, executor

_PROGRAM = r"""
import json, torch, torch_xla_core as txc
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("xla")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(5, 8).to("xla")
for _ in range(2):
    loss = m(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    txc.sync()
c = txc.metrics.counters()
print(json.dumps({"loss": loss.item(), "compile": c.get("compile", 0),
                  "hit": c.get("persistent_cache_hit", 0), "miss": c.get("persistent_cache_miss", 0),
                  "corrupt": c.get("persistent_cache_corrupt", 0), "write": c.get("persistent_cache_write", 0)}))
"""


def _run(cache_dir, xla_flags=""):
    env = dict(os.environ, TXC_COMPILE_CACHE=str(cache_dir), PJRT_DEVICE="CPU", XLA_FLAGS=xla_flags)
    r = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_second_process_compiles_nothing_and_corrupt_entries_recompile(tmp_path):
    cold, _ = _run(tmp_path)
    assert cold["compile"] >= 1 and cold["hit"] == 0 and cold["miss"] == cold["compile"] == cold["write"]
    entries = sorted(tmp_path.glob("*.xexe"))
    assert len(entries) == cold["compile"]

    warm, _ = _run(tmp_path, xla_flags="--xla_dump_to=" + str(tmp_path / "dump"))  # a dump flag: same code
    assert warm["compile"] == 0 and warm["hit"] == cold["compile"] and warm["miss"] == 0
    assert warm["loss"] == cold["loss"]

    # a flag that changes the code XLA emits: another key, compiled, never the other flags' executable
    fast, _ = _run(tmp_path, xla_flags="--xla_cpu_enable_fast_math=true")
    assert fast["compile"] == cold["compile"] and fast["hit"] == 0 and fast["write"] == cold["compile"]
    entries = sorted(tmp_path.glob("*.xexe"))
    assert len(entries) == 2 * cold["compile"]

    for e in entries:  # flip a byte in every payload
        b = bytearray(e.read_bytes())
        b[-10] ^= 0xFF
        e.write_bytes(bytes(b))
    bad, err = _run(tmp_path)
    assert bad["compile"] == cold["compile"] and bad["corrupt"] == cold["compile"] and bad["hit"] == 0
    assert "is unusable (checksum mismatch)" in err
    assert bad["loss"] == cold["loss"]
    again, _ = _run(tmp_path)  # rewritten: hits again
    assert again["compile"] == 0 and again["hit"] == cold["compile"]


_MESH_PROGRAM = r"""
import json, sys, torch, torch_xla_core as txc, torch_xla_core.sharding as xs
shape, ids = tuple(json.loads(sys.argv[1])), json.loads(sys.argv[2])
names = ("data", "model")[:len(shape)]
mesh = xs.Mesh(ids, shape, names)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("xla")
xs.mark_sharding(m[0].weight, mesh, (names[-1], None))
opt = torch.optim.AdamW(m.parameters(), lr=0.1)
x = torch.randn(8, 8).to("xla")
xs.mark_sharding(x, mesh, ("data", None))
for _ in range(3):
    loss = m(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    txc.sync()
c = txc.metrics.counters()
steps = {"compile": c.get("compile", 0), "hit": c.get("persistent_cache_hit", 0)}  # the training step's graphs
s = xs.get_sharding(m[0].weight)
out = {"steps": steps, "loss": loss.item(), "spec": list(s.partition_spec), "mesh": list(s.mesh.device_ids),
       "shards": [list(t.shape) for t in xs.local_shards(m[0].weight)],
       "params": [p.cpu().tolist() for p in m.parameters()]}
c = txc.metrics.counters()
out.update(compile=c.get("compile", 0), hit=c.get("persistent_cache_hit", 0), miss=c.get("persistent_cache_miss", 0),
           write=c.get("persistent_cache_write", 0))
print(json.dumps(out))
"""


def _run_mesh(cache_dir, shape, ids):
    env = dict(os.environ, TXC_COMPILE_CACHE=str(cache_dir), PJRT_DEVICE="CPU", TXC_NUM_CPU_DEVICES="4")
    r = subprocess.run([sys.executable, "-c", _MESH_PROGRAM, json.dumps(shape), json.dumps(ids)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_mesh_graphs_load_from_disk_and_another_mesh_misses(tmp_path):
    cold = _run_mesh(tmp_path, [2, 2], [0, 1, 2, 3])
    assert cold["compile"] >= 2 and cold["miss"] == cold["write"] == cold["compile"] and cold["hit"] == 0
    entries = len(list(tmp_path.glob("*.xexe")))
    assert entries == cold["compile"]
    warm = _run_mesh(tmp_path, [2, 2], [0, 1, 2, 3])  # a fresh interpreter: every graph from disk
    assert warm["compile"] == 0 and warm["hit"] == cold["compile"] and warm["miss"] == 0
    assert cold["steps"] == {"compile": 2, "hit": 0} and warm["steps"] == {"compile": 0, "hit": 2}
    for k in ("loss", "params", "spec", "mesh", "shards"):
        assert warm[k] == cold[k], k  # the same values, laid out as the compiled program says
    assert warm["spec"] == ["model", None] and warm["shards"] == [[8, 8]] * 4
    # another device order, another mesh shape: their own entries, never the first mesh's executable
    for shape, ids, spec in (([2, 2], [3, 2, 1, 0], ["model", None]), ([4], [0, 1, 2, 3], ["data", None])):
        other = _run_mesh(tmp_path, shape, ids)
        assert other["steps"] == {"compile": 2, "hit": 0}, (shape, ids)  # the step graphs: compiled, not loaded
        assert other["miss"] == other["compile"] == other["write"]
        assert other["spec"] == spec and other["mesh"] == ids
        assert other["loss"] == pytest.approx(cold["loss"], rel=1e-5)
        entries += other["write"]
        assert len(list(tmp_path.glob("*.xexe"))) == entries


def test_two_processes_load_their_mesh_graphs_from_disk(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "scripts", "dp_train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    env["TXC_COMPILE_CACHE"] = str(tmp_path / "cache")
    runs = []
    for i in range(2):
        out = tmp_path / str(i)
        out.mkdir()
        r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2", script,
                            str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        runs.append([json.loads((out / f"rank{k}.json").read_text()) for k in (0, 1)])
    for cold, warm in zip(*runs):  # per process: the first launch compiles, the second loads every graph
        assert cold["compile"] >= 2 and cold["hit"] == 0
        assert warm["compile"] == 0 and warm["hit"] == cold["compile"]
        assert warm["losses"] == cold["losses"] and warm["params"] == cold["params"]
    assert len(list((tmp_path / "cache").glob("*.xexe"))) == 2 * runs[0][0]["compile"]  # one entry per process


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TXC_COMPILE_CACHE", str(tmp_path))
    executor.clear_cache()
    yield tmp_path
    executor.clear_cache()


def test_in_process_hit_after_clearing_the_memory_cache(dev, cache_dir):
    x = torch.randn(6, 7)
    y = (x.to(dev).sin() * 3).cpu()
    c = txc.metrics.counters()
    assert c["compile"] == 1 and c["persistent_cache_write"] == 1
    executor.clear_cache()
    y2 = (x.to(dev).sin() * 3).cpu()
    c = txc.metrics.counters()
    assert c["compile"] == 1 and c["persistent_cache_hit"] == 1
    torch.testing.assert_close(y, x.sin() * 3)
    torch.testing.assert_close(y2, y)
    assert txc.metrics.timers()["persistent_cache_load"][0] >= 2


def test_truncated_entry_is_ignored_with_a_warning(dev, cache_dir):
    x = torch.randn(3)
    (x.to(dev) + 1).cpu()
    (entry,) = cache_dir.glob("*.xexe")
    entry.write_bytes(b"TXC")
    executor.clear_cache()
    with pytest.warns(RuntimeWarning, match="bad header"):
        y = (x.to(dev) + 1).cpu()
    torch.testing.assert_close(y, x + 1)
    assert txc.metrics.counters()["compile"] == 2
    assert entry.stat().st_size > 100  # rewritten whole


def test_size_bound_evicts_least_recently_used(dev, cache_dir, monkeypatch):
    x = torch.randn(4)
    (x.to(dev) + 1).cpu()
    (first,) = cache_dir.glob("*.xexe")
    monkeypatch.setenv("TXC_COMPILE_CACHE_MAX_BYTES", str(first.stat().st_size + 1))
    os.utime(first, (1, 1))  # long unused
    (x.to(dev) * 5).cpu()
    left = list(cache_dir.glob("*.xexe"))
    assert len(left) == 1 and left[0] != first
    assert txc.metrics.counters()["persistent_cache_evict"] == 1


def test_settings(monkeypatch):
    monkeypatch.setenv("TXC_COMPILE_CACHE", "off")
    assert compile_cache.directory() is None
    monkeypatch.delenv("TXC_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert compile_cache.directory() == "/x/cache/torch_xla_core"
    monkeypatch.setenv("TXC_COMPILE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="TXC_COMPILE_CACHE_MAX_BYTES='lots'"):
        compile_cache.max_bytes()


def test_key_covers_precision_and_runtime(dev, cache_dir):
    key = executor.Key(1, "highest", 0, "cpu", (), ())
    a = compile_cache.entry_name(key, "module {}")
    assert a != compile_cache.entry_name(key._replace(precision="high"), "module {}")
    assert a != compile_cache.entry_name(key, "module { }")
    assert a == compile_cache.entry_name(key._replace(graph=2), "module {}")  # the text is the graph
    from torch_xla_core._execution.spmd import Spmd
    mesh = key._replace(spmd=Spmd((0, 1, 2, 3), ("{devices=[4,1]<=[4]}",)))
    names = {compile_cache.entry_name(k, "module {}") for k in (
        key, mesh, mesh._replace(spmd=Spmd((3, 2, 1, 0), mesh.spmd.params)),  # another device order
        mesh._replace(spmd=Spmd((0, 1, 2, 3), ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}",))))}
    assert len(names) == 4


# --- trust: only this user's own files feed the cache ----------------------------------------------------

_STRANGER = 12345  # a uid that is not this user's (the tests run as root, so chown works)


def _warnings_of(fn):
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(m.message) for m in w if issubclass(m.category, RuntimeWarning)]


def test_the_directory_is_created_0700(dev, tmp_path, monkeypatch):
    d = tmp_path / "made" / "cache"
    monkeypatch.setenv("TXC_COMPILE_CACHE", str(d))
    old = os.umask(0)  # even with no umask at all
    try:
        executor.clear_cache()
        (torch.randn(3).to(dev) + 2).cpu()
    finally:
        os.umask(old)
        executor.clear_cache()
    assert (d.stat().st_mode & 0o777) == 0o700 and len(list(d.glob("*.xexe"))) == 1
    assert all((e.stat().st_mode & 0o777) == 0o600 for e in d.glob("*.xexe"))


@pytest.mark.parametrize("mode, why", [(0o777, "writable by everyone (mode 0777)"),
                                       (0o770, "writable by its group (mode 0770)"),
                                       (None, f"owned by uid {_STRANGER}, not by this user")])
def test_an_unsafe_directory_is_not_used(dev, cache_dir, mode, why):
    """A cache directory others can write (or another user's) is neither
    read nor written: a warning names it and the fix; counted; the graph
    compiles as with no cache. Fixed (chmod 700), it is used again."""
    x = torch.randn(5)
    (x.to(dev) * 3).cpu()
    (entry,) = cache_dir.glob("*.xexe")  # written while the directory was safe
    if mode is None:
        os.chown(cache_dir, _STRANGER, -1)
    else:
        cache_dir.chmod(mode)
    executor.clear_cache()
    y, warned = _warnings_of(lambda: (x.to(dev) * 3 + 1).cpu() + (x.to(dev) * 3).cpu())
    torch.testing.assert_close(y, (x * 3 + 1) + x * 3)
    c = txc.metrics.counters()
    assert c["compile"] == 3 and c.get("persistent_cache_hit", 0) == 0  # the cached entry was not loaded
    assert c["persistent_cache_unsafe"] >= 2 and c["persistent_cache_write"] == 1  # nothing written since
    assert list(cache_dir.glob("*.xexe")) == [entry]
    msg = [w for w in warned if "compile cache directory is not used" in w]
    assert len(msg) == 1 and why in msg[0] and str(cache_dir) in msg[0]  # once, naming it
    assert f"chmod 700 {cache_dir}" in msg[0] and "TXC_COMPILE_CACHE=off" in msg[0]
    os.chown(cache_dir, os.geteuid(), -1)
    cache_dir.chmod(0o700)
    executor.clear_cache()
    (x.to(dev) * 3).cpu()
    assert txc.metrics.counters()["persistent_cache_hit"] == 1  # trusted again: loaded


@pytest.mark.parametrize("plant", ["foreign owner", "world-writable", "symlink"])
def test_an_entry_not_this_users_own_is_never_loaded(dev, cache_dir, tmp_path_factory, plant):
    """An entry with the right name and a valid digest (anyone can compute
    both) that is another user's file, writable by others or a symlink is
    not loaded: a warning, a recompile, and the next write replaces it."""
    x = torch.randn(4)
    (x.to(dev) - 1).cpu()
    (entry,) = cache_dir.glob("*.xexe")
    if plant == "foreign owner":
        os.chown(entry, _STRANGER, -1)
    elif plant == "world-writable":
        entry.chmod(0o666)
    else:
        elsewhere = tmp_path_factory.mktemp("elsewhere") / "planted.xexe"
        elsewhere.write_bytes(entry.read_bytes())
        entry.unlink()
        entry.symlink_to(elsewhere)
    executor.clear_cache()
    y, warned = _warnings_of(lambda: (x.to(dev) - 1).cpu())
    torch.testing.assert_close(y, x - 1)
    c = txc.metrics.counters()
    assert c["compile"] == 2 and c.get("persistent_cache_hit", 0) == 0 and c["persistent_cache_unsafe"] == 1
    assert any(str(entry) in w and "never" in w and "loaded" in w for w in warned), warned
    st = os.lstat(entry)  # rewritten: this user's regular file, 0600
    assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o600 and not entry.is_symlink()
    executor.clear_cache()
    (x.to(dev) - 1).cpu()
    assert txc.metrics.counters()["persistent_cache_hit"] == 1


def test_a_fifo_entry_does_not_block(dev, cache_dir):
    x = torch.randn(4)
    (x.to(dev) * 7).cpu()
    (entry,) = cache_dir.glob("*.xexe")
    entry.unlink()
    os.mkfifo(entry, 0o600)
    executor.clear_cache()
    y, warned = _warnings_of(lambda: (x.to(dev) * 7).cpu())  # an open() without O_NONBLOCK would wait forever
    torch.testing.assert_close(y, x * 7)
    assert any("not a regular file" in w for w in warned), warned


@pytest.mark.parametrize("damage", ["empty", "magic only", "half", "payload replaced, digest valid"])
def test_a_damaged_entry_recompiles_and_the_others_still_load(dev, cache_dir, damage):
    """Truncated or corrupt entries (one with a valid digest over a payload
    PJRT refuses) are warned about, deleted and recompiled; the other
    entries of the directory are untouched and still load."""
    import hashlib
    x = torch.randn(6)
    (x.to(dev) + 4).cpu()
    (bad,) = cache_dir.glob("*.xexe")
    (x.to(dev) * 4).cpu()
    (good,) = set(cache_dir.glob("*.xexe")) - {bad}
    good_bytes = good.read_bytes()
    blob = bad.read_bytes()
    head = len(compile_cache._MAGIC) + 32
    bad.write_bytes({"empty": b"", "magic only": compile_cache._MAGIC, "half": blob[:len(blob) // 2],
                     "payload replaced, digest valid": compile_cache._MAGIC + hashlib.sha256(b"x" * 99).digest()
                     + b"x" * 99}[damage])
    executor.clear_cache()
    (y, z), warned = _warnings_of(lambda: ((x.to(dev) + 4).cpu(), (x.to(dev) * 4).cpu()))
    torch.testing.assert_close(y, x + 4)
    torch.testing.assert_close(z, x * 4)
    why = {"empty": "bad header", "magic only": "bad header", "half": "checksum mismatch",
           "payload replaced, digest valid": "PJRT could not load it"}[damage]
    assert any(str(bad) in w and why in w for w in warned), warned
    c = txc.metrics.counters()
    assert c["compile"] == 3 and c["persistent_cache_corrupt"] == 1 and c["persistent_cache_hit"] == 1
    assert good.read_bytes() == good_bytes and bad.stat().st_size > head  # the other kept, the bad rewritten


def test_trusted_directory(tmp_path):
    assert compile_cache.trusted_directory(str(tmp_path)) is None
    assert compile_cache.trusted_directory(str(tmp_path / "no")) == f"{tmp_path / 'no'} does not exist"
    f = tmp_path / "file"
    f.write_text("")
    assert compile_cache.trusted_directory(str(f)) == f"{f} is not a directory"
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)  # sticky, as /tmp: still writable by everyone
    assert "writable by everyone (mode 1777)" in compile_cache.trusted_directory(str(d))

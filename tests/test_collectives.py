"""Collectives across processes (torch_xla_core/distributed): in one
process, each collective's StableHLO and the errors of bad arguments; in
two processes (torch_xla_core.launch --nproc 2 --devices 1, one launch for
the module: tests/scripts/collectives_train.py), the collectives' values,
issue 42's txc.optimizer_step example and DistributedDataParallel over the
"xla" backend equal to one process on the whole batch (CPU, <= 1e-6), one
execution per step, the step replayed under txc.compile, dist.* and
functional collectives, DTensor, rendezvous and mesh_reduce."""
import os
import re

import pytest
import torch
import torch.distributed as dist

import torch_xla_core as txc
from torch_xla_core import distributed as xd
from torch_xla_core._runtime import runtime
from torch_xla_core.distributed import collectives as cc
from launched_ranks import launched_ranks

pytestmark = pytest.mark.xdist_group("processes2")  # the launches of test_multiprocess.py and this, one at a time
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "collectives_train.py")


# --- one process --------------------------------------------------------------

def test_each_collective_lowers_to_its_stablehlo_op():
    x = torch.arange(4.0, device="xla")
    outs = [xd.all_reduce("max", x, scale=2.0), xd.all_gather(x), xd.reduce_scatter("sum", x, 1.0, 0, 1),
            xd.all_to_all(x.reshape(2, 2), 0, 1, 1), xd.collective_permute(x, [[0, 0]])]
    hlo = txc.debug.stablehlo(outs)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"):
        assert f'"stablehlo.{op}"' in hlo, op
    assert "stablehlo.maximum" in hlo and "replica_groups = dense<[[0]]> : tensor<1x1xi64>" in hlo
    assert "source_target_pairs = dense<[[0, 0]]> : tensor<1x2xi64>" in hlo
    # one process: each is its input (max times the scale for the first)
    torch.testing.assert_close(outs[0].cpu(), torch.arange(4.0) * 2)
    for o in outs[1:]:
        torch.testing.assert_close(o.cpu().reshape(-1), torch.arange(4.0))


def _lines_with(hlo, text):
    return [i for i, line in enumerate(hlo.splitlines()) if text in line]


def test_collectives_run_in_trace_order_each_after_the_previous():
    # Traced: all_reduce of x, then all_gather of y; the graph walk reaches the
    # all_gather first (operand 0 of the add). Processes whose graphs differ
    # elsewhere must still take them in the order they were called (else they
    # wait on each other forever), so the lowering emits them in trace order
    # and the all_gather's input depends on the all_reduce's result: y minus a
    # 0 that XLA cannot fold, computed from that result. An optimization
    # barrier would not do: XLA:CPU removes barriers before it schedules.
    x, y = torch.arange(4.0, device="xla"), torch.arange(6.0, device="xla")
    a = xd.all_reduce("sum", x)
    b = xd.all_gather(y)
    out = b.sum() + a.sum()
    hlo = txc.debug.stablehlo([out])
    (reduce_at,), (gather_at,) = _lines_with(hlo, '"stablehlo.all_reduce"'), _lines_with(hlo, '"stablehlo.all_gather"')
    assert reduce_at < gather_at
    lines = hlo.splitlines()
    names = {line.split(" = ")[0].strip(): line for line in lines if " = " in line}

    def depends_on(name, target):
        line = names.get(name, "")
        args = line.split("(", 2)[1].split(")")[0] if '"(' in line else ""
        return name == target or any(depends_on(a.strip().split("#")[0], target)
                                     for a in args.split(",") if a.strip().startswith("%"))

    reduced = lines[reduce_at].split(" = ")[0].strip()
    gathered = lines[gather_at].split('"stablehlo.all_gather"(')[1].split(")")[0]
    assert depends_on(gathered, reduced)
    # and XLA keeps it: in the optimized program the all-gather's operand is computed from the all-reduce
    exe = runtime.compile_text(hlo)
    opt = exe.hlo_modules()[0].to_string()
    ar = re.search(r"%(all-reduce[.\w]*) = ", opt).group(1)
    ag_operand = re.search(r" all-gather\(%([\w.-]+)\)", opt).group(1)
    assert re.search(rf"%{re.escape(ag_operand)} = .*\(%{re.escape(ar)}\)", opt), opt
    assert out.item() == 6.0 + 15.0  # one process: each collective is its input
    # the dependency changes no bit: a second collective (chained after the first) gives the first's bits, in
    # every dtype, -0.0 and NaN included (XLA's bf16 all-gather itself makes NaNs canonical: both do)
    bits = lambda t: t if t.dtype == torch.bool else t.view(torch.uint8)  # noqa: E731
    for dt in (torch.float32, torch.bfloat16, torch.float64, torch.complex64, torch.int64, torch.uint8, torch.bool):
        v = (torch.tensor([-0.0, 1.5, float("nan")]) if dt.is_floating_point else torch.tensor([1, 0, 3])).to(dt)
        first, second = xd.all_gather(v.to("xla")), xd.all_gather(v.to("xla"))
        text = txc.debug.stablehlo([first, second])
        assert text.count("stablehlo.popcnt") == 1 and ("stablehlo.subtract" if dt.is_complex else "stablehlo.or") \
            in text, dt
        txc.sync()
        one, two = first.cpu(), second.cpu()
        assert two.dtype == dt and torch.equal(bits(two), bits(one)), (dt, one, two)  # the chained one: same bits
        torch.testing.assert_close(one, v, rtol=0, atol=0, equal_nan=True)
        if dt.is_floating_point:
            assert torch.equal(torch.signbit(two), torch.signbit(v))  # -0.0 stays -0.0
    # one collective: nothing to order
    assert "stablehlo.popcnt" not in txc.debug.stablehlo([xd.all_reduce("sum", x)])


def test_a_list_is_reduced_in_place_in_one_collective_per_dtype():
    ts = [torch.ones(2, device="xla"), torch.full((3,), 2.0, device="xla"), torch.ones(2, dtype=torch.int32,
                                                                                        device="xla")]
    assert xd.all_reduce("sum", ts, scale=3.0) is ts
    assert txc.debug.stablehlo(ts).count('"stablehlo.all_reduce"') == 2  # float32 and int32
    assert ts[0].cpu().tolist() == [3.0, 3.0] and ts[1].cpu().tolist() == [6.0] * 3


@pytest.mark.parametrize("call, message", [
    (lambda x: xd.all_reduce("xor", x), "unknown reduce type 'xor'"),
    (lambda x: xd.all_reduce("sum", x, groups=[[0], [1]]), "exactly once"),
    (lambda x: xd.all_reduce("sum", x.cpu()), "expected an xla tensor"),
    (lambda x: xd.reduce_scatter("sum", x, 1.0, 0, 2), "shard_count=2 but the groups have 1"),
    (lambda x: xd.all_to_all(x, 0, 0, 4), "split_count=4"),
    (lambda x: xd.collective_permute(x, [[0, 1]]), "within 0..0"),
])
def test_bad_arguments_raise_naming_the_collective(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(torch.arange(4.0, device="xla"))


def test_optimizer_step_with_one_process_is_a_plain_step():
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 1)
    m = torch.nn.Linear(8, 1).to("xla")
    m.load_state_dict(ref.state_dict())
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for model, opt, dev in ((ref, torch.optim.SGD(ref.parameters(), lr=0.1), "cpu"),
                            (m, torch.optim.SGD(m.parameters(), lr=0.1), "xla")):
        ((model(x.to(dev)) - y.to(dev)) ** 2).mean().backward()
        txc.optimizer_step(opt, barrier=True)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=0, atol=1e-6)


def test_host_meeting_points_with_one_process():
    assert txc.rendezvous("one", b"payload") == [b"payload"]
    assert txc.mesh_reduce("one", {"a": torch.ones(2, device="xla")}, lambda xs: len(xs)) == 1
    assert txc.spawn(lambda i, k: i + k, (5,), nprocs=1) == {0: 5}


def test_the_xla_backend_is_registered_for_the_xla_device():
    assert "xla" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["xla"] == "xla"
    assert not {"x", "l", "a"} & set(dist.Backend.default_device_backend_map)  # a str is iterated per char


# --- two processes ------------------------------------------------------------

@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launched_ranks(SCRIPT, 2, tmp_path_factory.mktemp("collectives"))



def _sgd_on_whole_batch(model, steps, rows, cols_in, cols_out, seed):
    """One process on the concatenated batch: the reference (CPU eager)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(rows, cols_in, generator=g), torch.randn(rows, cols_out, generator=g)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _close(got, want):
    for p, q in zip(got, want):
        torch.testing.assert_close(torch.tensor(p), q, rtol=0, atol=1e-6)


def test_collectives_across_two_processes(ranks):
    x = [torch.arange(4.0) + 10 * r for r in (0, 1)]
    for r, res in enumerate(ranks):
        c = res["collectives"]
        assert c["sum"] == (x[0] + x[1]).tolist()
        assert c["max_scaled"] == (x[1] * 0.5).tolist()
        assert c["gather"] == torch.cat(x).tolist()
        assert c["gather_dim1"] == torch.cat([t.reshape(2, 2) for t in x], 1).tolist()
        assert c["scatter"] == (x[0] + x[1])[2 * r:2 * r + 2].tolist()
        assert c["to_all"] == torch.cat([t[2 * r:2 * r + 2] for t in x]).tolist()
        assert c["permute"] == x[1 - r].tolist()
        assert c["list_in_place"] == [[3.0, 3.0], [30.0] * 3]


def test_issue_example_optimizer_step_equals_one_process(ranks):
    torch.manual_seed(0)
    want = _sgd_on_whole_batch(torch.nn.Linear(8, 1), 3, 8, 8, 1, seed=1)
    for res in ranks:
        ex = res["example"]
        _close(ex["params"], want)
        assert ex["executions"] == [1, 1, 1]  # the step, its collective included, is one graph
        assert ex["all_reduce"] >= 1 and ex["replicas"]
    assert ranks[0]["example"]["params"] == ranks[1]["example"]["params"]


def test_the_collective_step_replays_under_txc_compile(ranks):
    torch.manual_seed(0)
    want = _sgd_on_whole_batch(torch.nn.Linear(8, 1), 6, 8, 8, 1, seed=1)
    for res in ranks:
        rep = res["replayed"]
        _close(rep["params"], want)
        c = rep["counters"]
        assert (c.get("replay_record"), c.get("replay")) == (1, 5), c
        assert rep["executions"][2:] == [1, 1, 1, 1]  # each replayed step: one graph


def test_ranks_donating_and_not_donating_the_old_grads_replay_the_same_step(ranks):
    """Rank 0's replays write the new grads into the old ones' buffers (the
    donating executable); rank 1 holds its grads, so its replays run the
    recorded executable: the all-reduce between them still meets, the
    weights equal one process's, and rank 1's held grads keep their values."""
    torch.manual_seed(0)
    want = _sgd_on_whole_batch(torch.nn.Linear(8, 1), 6, 8, 8, 1, seed=1)
    for res in ranks:
        rep = res["replayed_donated"]
        _close(rep["params"], want)
        # the first call (no grads yet) and the second are traced, the third recorded
        assert (rep["counters"].get("replay_record"), rep["counters"].get("replay")) == (1, 4), rep["counters"]
        assert rep["executions"][2:] == [1, 1, 1, 1]
    assert ranks[0]["replayed_donated"]["params"] == ranks[1]["replayed_donated"]["params"]
    m0, m1 = ranks[0]["replayed_donated"]["grad_memory"], ranks[1]["replayed_donated"]["grad_memory"]
    assert m0[3] == m0[4] == m0[5]  # written in place
    assert len(set(m1[3:])) == 3  # new buffers: the held ones kept
    assert ranks[1]["replayed_donated"]["held_kept"]


def test_ddp_over_the_xla_backend_equals_one_process(ranks):
    torch.manual_seed(0)  # rank 0's initial weights: DDP broadcasts them
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    want = _sgd_on_whole_batch(net, 3, 8, 8, 4, seed=2)
    for res in ranks:
        _close(res["ddp"]["params"], want)
        assert res["ddp"]["executions"] == [1, 1, 1]


def test_the_ddp_step_replays_under_txc_compile_and_dynamo(ranks):
    """DDP's reducer keeps its gradient buckets out of the walk's reach:
    the first call reads a bucket nobody passed (refused, recorded again
    with the buckets the backend's all-reduces wrote among the inputs), the
    second makes new buckets (DDP rebuilds them once), the third records,
    and every later call is one replayed graph. Under dynamo each graph
    (forward, backward, optimizer) replays; dynamo breaks the frame at
    .backward(), so a step is several graphs there."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    want = _sgd_on_whole_batch(net, 6, 8, 8, 4, seed=2)
    for res in ranks:
        t, d = res["ddp_txc"], res["ddp_dynamo"]
        _close(t["params"], want)
        _close(d["params"], want)
        c = t["counters"]
        assert (c.get("replay_retry"), c.get("replay_record"), c.get("replay"), c.get("replay_refused")) == \
            (2, 1, 3, None), c
        assert t["executions"][3:] == [1, 1, 1]  # each replayed step: one graph, its all-reduces included
        assert d["counters"].get("replay", 0) >= 3 * 3 and d["counters"].get("dynamo_graph") == 3, d["counters"]
        ca = res["ddp_dynamo_ca"]  # compiled autograd traces DDP's reducer: forward, backward, optimizer graphs
        _close(ca["params"], want)
        # (5 launches a step without compiled autograd; 3 unfused: the three graphs' replays run as one launch,
        # compiled with the backward's replicated options: its all-reduces meet across the ranks)
        assert ca["executions"][1:] == [1] * 5 and ca["counters"].get("replay") == 15, ca


def test_dist_functional_collectives_and_dtensor(ranks):
    t = [torch.arange(3.0) + 10 * r for r in (0, 1)]
    full = torch.arange(8.0).reshape(4, 2)
    for r, res in enumerate(ranks):
        d = res["dist"]
        assert d["all_reduce"] == d["funcol"] == (t[0] + t[1]).tolist()
        assert d["avg"] == ((t[0] + t[1]) / 2).tolist()
        assert d["all_gather"] == [v.tolist() for v in t]
        assert d["into_tensor"] == d["funcol_gather"] == torch.cat(t).tolist()
        assert d["reduce_scatter"] == (torch.arange(4.0) * 3)[2 * r:2 * r + 2].tolist()
        assert d["broadcast"] == t[1].tolist()
        assert d["all_to_all"] == torch.cat([torch.arange(4.0)[2 * r:2 * r + 2] + 10 * s for s in (0, 1)]).tolist()
        assert d["dtensor_local"] == full[2 * r:2 * r + 2].tolist()
        assert d["dtensor_full"] == full.tolist()
        assert d["dtensor_mm"] == (full @ torch.arange(6.0).reshape(2, 3)).tolist()
        assert res["host"] == {"rendezvous": ["r0", "r1"], "mesh_reduce": 4.0}


def test_cpu_tensors_on_the_xla_group_and_the_mixed_backend(ranks):
    """CPU tensors' collectives (object collectives, gather, send/recv:
    what gloo does) run on the group's gloo backend, on "xla" and on
    "cpu:gloo,xla:xla" (torch drops gloo when a creator returns a whole
    group; ours serves both), beside an xla all_reduce in the graph."""
    c = [torch.arange(3.0) + 10 * r for r in (0, 1)]
    for r, res in enumerate(ranks):
        for key in ("cpu", "mixed"):
            d = res[key]
            assert d["sum"] == (c[0] + c[1]).tolist() and d["xla"] == [3.0, 3.0]
            assert d["objects"] == [{"rank": 0}, {"rank": 1}]
            assert d["gather"] == ([v.tolist() for v in c] if r == 0 else None)
            assert d["recv"] == (None if r == 0 else (c[0] * 2).tolist())
            assert "'xla' process group gather: not supported on xla tensors" in d["refused"]


def test_torch_reduce_ops_map_to_core_reductions():
    """One table for the 'xla' backend's ReduceOp objects and funcol's names (collectives.torch_reduce_op)."""
    assert cc.torch_reduce_op(dist.ReduceOp(dist.ReduceOp.MAX), 2, "w") == ("max", 1.0)  # a ReduceOp object
    assert cc.torch_reduce_op(dist.ReduceOp.AVG, 4, "w") == ("sum", 0.25)
    assert [cc.torch_reduce_op(s, 2, "w") for s in ("avg", "ReduceOp.PRODUCT", "band", "bor", "min")] == [
        ("sum", 0.5), ("mul", 1.0), ("and", 1.0), ("or", 1.0), ("min", 1.0)]
    for op in (dist.ReduceOp.PREMUL_SUM, "premul_sum"):
        with pytest.raises(NotImplementedError, match=r"(?i)all_reduce on xla tensors: reduce op .*premul_sum is not "
                                                      r"supported \(sum, avg, product, min, max, band, bor are\)"):
            cc.torch_reduce_op(op, 2, "all_reduce on xla tensors")


@pytest.mark.parametrize("op,attrs,says", [
    ("reduce_scatter", ("sum", -2, (0, 1), 2), "reduce_scatter: scatter dimension 0 of size 3"),
    ("all_to_all", (-2, 1, (0, 1), 2), "all_to_all: split dimension 0 of size 3")])
def test_a_split_dimension_that_does_not_divide_raises(op, attrs, says):
    """The core's shape rule (csrc/ops/collective.cpp split_dim), when the node is built: the dim normalized."""
    x = torch.zeros(3, 4).to("xla")
    with pytest.raises(RuntimeError, match=says + " does not split into 2 equal parts"):
        cc.collective(op, x, attrs, "w")

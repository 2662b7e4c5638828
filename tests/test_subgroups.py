"""torch.distributed sub-groups on the "xla" backend: in one process, the
replica groups a sub-group's collective gets (collectives.subgroup); in
four processes (one launch, tests/scripts/subgroups_train.py), every
collective of the backend on row, column and singleton sub-groups equal to
the same collective on CPU tensors over gloo groups of the same ranks, the
StableHLO replica groups, a 2-D DeviceMesh ("dp", "tp") built from the
groups and torch's init_device_mesh("xla", (2, 2)) with DTensor on them
against the full tensors, HSDP on that mesh after the DTensor code left
collectives pending (they run in its first step's graph, which differs by
rank), and the error of a group whose size does not divide the world's."""
import os

import pytest
import torch

from torch_xla_core.distributed import collectives as cc
from launched_ranks import launched_ranks
from test_fsdp import _close, _whole_batch

pytestmark = pytest.mark.xdist_group("processes2")  # one multi-process launch at a time
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "subgroups_train.py")


@pytest.mark.parametrize("ranks, groups", [
    ([0, 1, 2, 3], None),                       # the world: no groups argument
    ([0, 1], [[0, 1], [2, 3]]),
    ([2, 3], [[0, 1], [2, 3]]),                 # siblings get the same list: one program
    ([1, 3], [[0, 2], [1, 3]]),
    ([3, 1], [[0, 2], [3, 1]]),                 # the group's own order is kept (its ranks' order)
    ([2], [[0], [1], [2], [3]]),
])
def test_a_sub_group_is_one_replica_group_and_the_rest_fill_its_size(monkeypatch, ranks, groups):
    monkeypatch.setattr(cc, "world_size", lambda: 4)
    assert cc.subgroup(ranks, "t") == groups
    if groups:
        assert cc.groups_of(groups, "t")[1] == len(ranks)  # a valid partition of the 4 processes


def test_a_sub_group_whose_size_does_not_divide_the_world_raises(monkeypatch):
    monkeypatch.setattr(cc, "world_size", lambda: 4)
    with pytest.raises(NotImplementedError, match=r"ranks \[0, 1, 2\] on 4 processes.*\[1, 2, 4\] ranks"):
        cc.subgroup([0, 1, 2], "all_reduce")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launched_ranks(SCRIPT, 4, tmp_path_factory.mktemp("subgroups"))


def test_sub_group_collectives_equal_gloo_on_the_same_ranks(ranks):
    for r, res in enumerate(ranks):
        for name, (xla, gloo) in res["groups"].items():
            assert xla == gloo, (r, name)
        # not trivially equal: the row's sum is of this rank and its neighbour
        x = [torch.arange(4.0) + 10 * i for i in range(4)]
        row = 2 * (r // 2)
        assert res["groups"]["row"][0][0] == (x[row] + x[row + 1]).tolist()
        assert res["groups"]["col"][0][0] == (x[r % 2] + x[r % 2 + 2]).tolist()
        assert res["groups"]["single"][0][0] == x[r].tolist()


def test_sibling_groups_compile_one_program(ranks):
    assert {tuple(res["hlo"]) for res in ranks} == {("[[0, 2], [1, 3]]",)}


def test_a_2d_mesh_and_its_sub_meshes_compute_as_the_full_tensors(ranks):
    full = torch.arange(32.0).reshape(8, 4)
    w = torch.arange(12.0).reshape(4, 3) / 10
    for r, res in enumerate(ranks):
        m, dp, tp = res["mesh"], r // 2, r % 2
        assert m["coordinate"] == m["local_ranks"] == [dp, tp]
        assert m["tp_ranks"] == [2 * dp, 2 * dp + 1] and m["dp_ranks"] == [tp, tp + 2]
        assert m["local"] == full[4 * dp:4 * dp + 4, 2 * tp:2 * tp + 2].tolist()
        assert m["rows_only"] == full[4 * dp:4 * dp + 4].tolist()
        assert m["full"] == m["sub_mesh_full"] == full.tolist()
        torch.testing.assert_close(torch.tensor(m["mm"]), full @ w)
        assert m["sum_tp"] == full.sum(1)[4 * dp:4 * dp + 4].tolist()
        init = res["init_device_mesh"]
        assert init["groups"] == [[tp, tp + 2], [2 * dp, 2 * dp + 1]] and init["coordinate"] == [tp]
        assert init["full"] == full.tolist()


def test_a_sub_group_of_a_size_not_dividing_the_world_raises_on_its_members(ranks):
    for res in ranks[:3]:
        assert "ranks [0, 1, 2] on 4 processes" in res["bad"]


def test_hsdp_after_pending_dtensor_collectives_trains_equal_to_one_process(ranks):
    """The first HSDP step's graph holds the collectives the DTensor code
    left pending and FSDP2's, over the world, rows and columns, and its other
    ops differ by rank. XLA:CPU's scheduler ordered independent collectives
    by buffer sizes, so the ranks took them in different orders and waited
    on each other forever; each collective's input now depends on the
    previous one's result (csrc/lower/emitter.cpp: ordered_in)."""
    want = _whole_batch(torch.optim.SGD, lr=0.1)[-1]
    for res in ranks:
        _close(res["hsdp"], want)

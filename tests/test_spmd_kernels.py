"""Kernels under SPMD run per shard (kernels/per_shard.py) on 8 CPU devices
(a child process: tests/multidevice.py): call_jax(mesh=, in_specs=,
out_specs=), flash_attention with segment ids under data parallelism and
with heads on "model", multi_queries_paged_attention's Pallas kernel
(interpreted). Checked: the manual region in the StableHLO (@Sharding,
SPMDFullToShardShape {manual} to shard shapes, SPMDShardToFullShape back),
numerics and gradients against the unsharded call and CPU references,
compile counts, no fallback, and the errors before compiling."""
import re

import pytest
import torch

import torch_xla_core as txc
import torch_xla_core.sharding as xs
from torch_xla_core import executor, kernels, metrics
from torch_xla_core.kernels import reference
from multidevice import on_devices

pytestmark = pytest.mark.xdist_group("devices8_kernels")


def _mesh():
    return xs.Mesh(range(8), (4, 2), ("data", "model"))


def _manual_region(text):
    """(full shape, shard shape) of each SPMDFullToShardShape, and the
    shapes each SPMDShardToFullShape restores."""
    to_shard = re.findall(r"@SPMDFullToShardShape\(%\w+\) \{[^}]*mhlo\.sharding = \"\{manual\}\"\} : "
                          r"\(tensor<([^>]*)>\) -> tensor<([^>]*)>", text)
    to_full = re.findall(r"@SPMDShardToFullShape\(%\w+\) \{[^\n]*?\"\} : \(tensor<([^>]*)>\) -> tensor<([^>]*)>", text)
    return to_shard, to_full


@on_devices(8)
def test_call_jax_per_shard_emits_a_manual_region_and_matches_cpu():
    mesh = _mesh()

    def f(x, w):  # per device: its rows of x, all of w
        return (x * w).sum(-1), x * 2

    x, w = torch.randn(8, 6), torch.randn(6)
    X, W = x.to("xla").requires_grad_(), w.to("xla").requires_grad_()
    a, b = kernels.call_jax(f, X, W, mesh=mesh, in_specs=[("data", None), None], out_specs=("data",))
    text = txc.debug.stablehlo([a, b])
    assert "mhlo.num_partitions = 8 : i32" in text  # nothing else is sharded: the kernel's inputs decide
    to_shard, to_full = _manual_region(text)
    assert to_shard == [("8x6xf32", "2x6xf32"), ("6xf32", "6xf32")]
    assert to_full == [("2xf32", "8xf32"), ("2x6xf32", "8x6xf32")]
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ar, br = (xr * wr).sum(-1), xr * 2
    (ar.sum() * 3 + (br * br).sum()).backward()
    executor.clear_cache()
    metrics.clear()
    (a.sum() * 3 + (b * b).sum()).backward()
    txc.sync()
    assert metrics.counters().get("compile", 0) == 1
    torch.testing.assert_close(a.cpu(), ar.detach())
    torch.testing.assert_close(b.cpu(), br.detach())
    torch.testing.assert_close(X.grad.cpu(), xr.grad)
    torch.testing.assert_close(W.grad.cpu(), wr.grad)  # w's cotangent summed over the "data" shards
    assert xs.get_sharding(a).partition_spec == ("data",)
    assert not metrics.fallbacks()


def _flash_inputs(b=8, h=4, hkv=4, s=16, d=8):
    torch.manual_seed(0)
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    seg = torch.randint(0, 3, (b, s)).sort(1).values  # packed sequences
    return q, k, v, seg


def _flash_step(q, k, v, seg, **kw):
    """Output and q/k/v gradients of flash attention with segment ids on xla
    (kw: partition_spec, mesh), synced."""
    Q, K, V = (t.to("xla").requires_grad_() for t in (q, k, v))
    S = seg.to("xla")
    out = kernels.flash_attention(Q, K, V, causal=True, q_segment_ids=S, kv_segment_ids=S, sm_scale=0.5, **kw)
    text = txc.debug.stablehlo([out])
    (out * out).sum().backward()
    txc.sync()
    return out, (Q.grad, K.grad, V.grad), text


@on_devices(8)
def test_flash_attention_with_segment_ids_data_parallel_runs_per_shard():
    mesh = _mesh()
    q, k, v, seg = _flash_inputs()
    base, base_grads, base_text = _flash_step(q, k, v, seg)  # unsharded: one device
    assert "SPMDFullToShardShape" not in base_text and xs.get_sharding(base) is None
    executor.clear_cache()
    metrics.clear()
    out, grads, text = _flash_step(q, k, v, seg, partition_spec=("data", None, None, None), mesh=mesh)
    assert metrics.counters().get("compile", 0) == 1  # forward and backward in one partitioned graph
    assert metrics.counters().get("kernel_per_shard") == 1
    to_shard, to_full = _manual_region(text)
    # q, k, v: batch 8 split over "data" (4); the segment ids alike
    assert to_shard == [("8x4x16x8xf32", "2x4x16x8xf32")] * 3 + [("8x16xi32", "2x16xi32")] * 2
    assert to_full == [("2x4x16x8xf32", "8x4x16x8xf32")]
    torch.testing.assert_close(out.cpu(), base.cpu(), rtol=1e-5, atol=1e-5)
    for g, bg in zip(grads, base_grads):
        torch.testing.assert_close(g.cpu(), bg.cpu(), rtol=1e-5, atol=1e-5)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = reference.flash_attention(qr, kr, vr, causal=True, q_segment_ids=seg, kv_segment_ids=seg, sm_scale=0.5)
    (ref * ref).sum().backward()
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, (qr, kr, vr)):
        torch.testing.assert_close(g.cpu(), r.grad, rtol=1e-4, atol=1e-5)
    assert xs.get_sharding(out).partition_spec[0] == "data"
    assert not metrics.fallbacks()


@on_devices(8)
def test_flash_attention_follows_a_sharded_q_and_splits_gqa_heads_on_model():
    mesh = _mesh()
    q, k, v, seg = _flash_inputs(h=4, hkv=2)
    base, base_grads, _ = _flash_step(q, k, v, seg)
    Q, K, V = (t.to("xla").requires_grad_() for t in (q, k, v))
    S = seg.to("xla")
    with torch.no_grad():
        xs.mark_sharding(Q, mesh, ("data", "model", None, None))  # no partition_spec: q's layout decides
    out = kernels.flash_attention(Q, K, V, causal=True, q_segment_ids=S, kv_segment_ids=S, sm_scale=0.5)
    to_shard, _ = _manual_region(txc.debug.stablehlo([out]))
    # q heads 4 -> 2 and kv heads 2 -> 1 per device: each keeps its GQA group
    assert to_shard[:3] == [("8x4x16x8xf32", "2x2x16x8xf32"), ("8x2x16x8xf32", "2x1x16x8xf32"),
                            ("8x2x16x8xf32", "2x1x16x8xf32")]
    (out * out).sum().backward()
    txc.sync()
    torch.testing.assert_close(out.cpu(), base.cpu(), rtol=1e-5, atol=1e-5)
    for g, bg in zip((Q.grad, K.grad, V.grad), base_grads):
        torch.testing.assert_close(g.cpu(), bg.cpu(), rtol=1e-5, atol=1e-5)
    # a pending q that mark_sharding annotated decides as well; one left to propagation does not
    with torch.no_grad():
        q2 = q.to("xla") * 1
        xs.mark_sharding(q2, mesh, ("data", None, None, None))
        out2 = kernels.flash_attention(q2, K, V, causal=True, q_segment_ids=S, kv_segment_ids=S, sm_scale=0.5)
        assert _manual_region(txc.debug.stablehlo([out2]))[0][0] == ("8x4x16x8xf32", "2x4x16x8xf32")
        torch.testing.assert_close(out2.cpu(), base.cpu(), rtol=1e-5, atol=1e-5)
        out3 = kernels.flash_attention(q2 * 1, K, V, causal=True, q_segment_ids=S, kv_segment_ids=S, sm_scale=0.5)
        assert "SPMDFullToShardShape" not in txc.debug.stablehlo([out3])


@on_devices(8)
def test_paged_attention_pallas_kernel_runs_per_shard():
    from test_paged_attention import _inputs
    mesh = _mesh()
    torch.manual_seed(0)
    args = _inputs(4, 4, 4, 2, 8, 4, 4, [7, 16, 1, 12], [3, 4, 1, 2])
    cq, ck, cv = (a.clone().requires_grad_() for a in args[:3])
    ref = reference.multi_queries_paged_attention(cq, ck, cv, *args[3:])
    (ref * ref).sum().backward()
    dev = [a.to("xla") for a in args]
    for a in dev[:3]:
        a.requires_grad_()
    executor.clear_cache()
    metrics.clear()
    out = kernels.multi_queries_paged_attention(*dev, 2, 4, impl="pallas", partition_spec=("data", None, "model", None),
                                                mesh=mesh)
    to_shard, to_full = _manual_region(txc.debug.stablehlo([out]))
    assert to_shard == [("4x4x4x8xf32", "1x4x2x8xf32"), ("2x18x4x8xf32", "1x18x4x8xf32"),
                        ("2x18x4x8xf32", "1x18x4x8xf32"), ("4xi32", "1xi32"), ("4x4xi32", "1x4xi32"),
                        ("4xi32", "1xi32")]
    assert to_full == [("1x4x2x8xf32", "4x4x4x8xf32")]
    (out * out).sum().backward()
    txc.sync()
    assert metrics.counters().get("compile", 0) == 1
    torch.testing.assert_close(out.cpu(), ref.detach(), atol=2e-5, rtol=2e-5)
    # the pages are whole on every "data" shard: their gradients are summed over the shards
    for g, r in zip((a.grad for a in dev[:3]), (cq, ck, cv)):
        torch.testing.assert_close(g.cpu(), r.grad, atol=1e-4, rtol=1e-4)
    assert metrics.counters().get("kernel_per_shard") == 1 and not metrics.fallbacks()


@on_devices(8)
def test_per_shard_errors_name_the_setting_before_compiling():
    mesh = _mesh()
    q, k, v, seg = (t.to("xla") for t in _flash_inputs(h=4, hkv=2))
    metrics.clear()
    with pytest.raises(ValueError, match=r"flash_attention: partition_spec .* splits dims \[2\] of q"):
        kernels.flash_attention(q, k, v, partition_spec=("data", None, "model", None), mesh=mesh)
    with pytest.raises(ValueError, match=r"k/v has 2 heads, which do not split alike"):
        kernels.flash_attention(q, k, v, partition_spec=(None, "data", None, None), mesh=mesh)
    with pytest.raises(ValueError, match=r"flash_attention: unknown mesh axis 'rows'"):
        kernels.flash_attention(q, k, v, partition_spec=("rows", None, None, None), mesh=mesh)
    with pytest.raises(ValueError, match=r"partition_spec needs mesh="):
        kernels.flash_attention(q, k, v, partition_spec=("data", None, None, None))
    with pytest.raises(ValueError, match=r"mesh= given without partition_spec="):
        kernels.flash_attention(q, k, v, mesh=mesh)
    f = lambda a: a * 2  # noqa: E731
    with pytest.raises(ValueError, match=r"in_specs must hold one partition spec per tensor argument \(1\)"):
        kernels.call_jax(f, q, mesh=mesh, in_specs=[None, None], out_specs=())
    with pytest.raises(ValueError, match=r"tensor arguments \[0\] are not on xla:0"):
        kernels.call_jax(f, torch.ones(8, device="xla:1"), mesh=mesh, in_specs=[None], out_specs=())
    with pytest.raises(ValueError, match=r"needs both in_specs="):
        kernels.call_jax(f, q, mesh=mesh, in_specs=[None])
    with pytest.raises(ValueError, match=r"dim 0 of size 6 is not divisible by 8 .*in_specs\[0\]"):
        kernels.call_jax(f, torch.ones(6, device="xla"), mesh=mesh, in_specs=[(("data", "model"),)],
                         out_specs=(("data", "model"),))
    with pytest.raises(ValueError, match=r"flash_attention: partition_spec .* dim 0 of size 2 is not divisible "
                                         r"by 4 .*q of shape \[2, 4, 16, 8\]"):
        kernels.flash_attention(q[:2], k[:2], v[:2], partition_spec=("data", None, None, None), mesh=mesh)
    assert metrics.counters().get("compile", 0) == 0
    xs.set_global_mesh(mesh)  # torch_xla's default mesh for partition_spec without mesh=
    try:
        out = kernels.flash_attention(q, k, v, partition_spec=("data", None, None, None))
        assert "SPMDFullToShardShape" in txc.debug.stablehlo([out])
    finally:
        xs.set_global_mesh(None)


@on_devices(8)
def test_flash_attention_per_shard_inside_scan_layers():
    """A layer stack whose attention runs per shard (data parallel, segment
    ids) inside the scan body: the manual region is in the while body, and
    output and every gradient match the unrolled CPU loop."""
    from torch_xla_core.scan import scan_layers
    from util import assert_scan_layers_match_loop
    mesh = _mesh()
    torch.manual_seed(0)
    x = torch.randn(8, 2, 16, 8)
    seg = torch.randint(0, 3, (8, 16)).sort(1).values

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, h):  # h [B, H, S, D]
            if h.device.type == "xla":
                s = seg.to(h.device)
                o = kernels.flash_attention(self.q(h), self.k(h), h, causal=True, q_segment_ids=s,
                                            kv_segment_ids=s, partition_spec=("data", None, None, None), mesh=mesh)
                return h + o
            return h + reference.flash_attention(self.q(h), self.k(h), h, causal=True, q_segment_ids=seg,
                                                 kv_segment_ids=seg)

    layers = torch.nn.ModuleList([Layer() for _ in range(3)])
    # f32 weight gradients differ from the CPU loop by up to 3e-4 (the unsharded kernel as much: both
    # are 3.3e-4 from float64)
    assert_scan_layers_match_loop(layers, x, "xla", atol=1e-4, grad_atol=1e-3)
    text = txc.debug.stablehlo([scan_layers(layers, x.to("xla"))])
    body = text[text.index("stablehlo.while"):]
    # in the loop body: q's full layout (batch over "data") annotated before the kernel's call
    assert 'call_target_name = "Sharding"' in body and '{devices=[4,1,1,1,2]<=[8] last_tile_dim_replicate}' in body
    to_shard, to_full = _manual_region(text)
    assert ("8x2x16x8xf32", "2x2x16x8xf32") in to_shard and ("2x2x16x8xf32", "8x2x16x8xf32") in to_full


@on_devices(8)
def test_tpu_flash_kernel_lowers_inside_the_manual_region():
    """The TPU path (jax's Pallas flash kernel, a Mosaic custom call XLA
    cannot partition), lowered for TPU on the CPU: the tpu_custom_call sits
    in the per-shard body, on shard shapes (batch 8 -> 2), forward and
    backward."""
    import jax
    import jax.numpy as jnp

    from torch_xla_core._execution import spmd as _spmd
    from torch_xla_core.kernels import per_shard
    from torch_xla_core.kernels.attention import _flash_entry
    sd = jax.ShapeDtypeStruct
    shapes = (sd((8, 4, 256, 128), jnp.float32), sd((8, 2, 256, 128), jnp.float32),
              sd((8, 2, 256, 128), jnp.float32), sd((8, 256), jnp.int32), sd((8, 256), jnp.int32))
    qs = ("data", None, None, None)
    ps = per_shard.PerShard(_flash_entry, (True,) * 5, _mesh(), [qs] * 3 + [("data", None)] * 2, qs, False,
                            check_vma=False)

    def fwd(q, k, v, a, b):
        return ps(q, k, v, a, b, has_ab=False, has_seg=True, causal=True, sm_scale=0.5, impl="pallas")

    def bwd(q, k, v, a, b):
        return jax.grad(lambda x, y, z: fwd(x, y, z, a, b).sum(), argnums=(0, 1, 2))(q, k, v)

    for fn, calls in ((fwd, 1), (bwd, 3)):
        with _spmd.gspmd_lowering():
            text = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
        body = text[text.index("func.func private @shmap_body"):]
        assert body.count("tpu_custom_call") >= calls and "tensor<2x4x256x128xf32>" in body
        to_shard, _ = _manual_region(text)
        assert ("8x4x256x128xf32", "2x4x256x128xf32") in to_shard


@on_devices(8)
def test_a_function_that_shards_by_itself_in_an_unpartitioned_graph_is_refused():
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from torch_xla_core._execution import spmd as _spmd
    mesh = _mesh()

    def f(x):  # shards inside jax, with no mesh our graph knows of
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh._jax, PartitionSpec("data")))

    y = kernels.call_jax(f, torch.ones(8, device="xla"))
    metrics.clear()
    with pytest.raises(_spmd.UnpartitionedAnnotation, match="give call_jax mesh=/in_specs=/out_specs="):
        y.cpu()
    assert metrics.counters().get("compile", 0) == 0
    x = torch.ones(8, device="xla")
    xs.mark_sharding(x, mesh, ("data",))  # a sharded input: the graph is partitioned, the constraint honoured
    z = kernels.call_jax(f, x)
    torch.testing.assert_close(z.cpu(), torch.full((8,), 2.0))
    assert xs.get_sharding(z).partition_spec == ("data",)

// Placement: the core op "place"(x; kind) moves x's value to memory kind
// `kind` ("pinned_host" or "device"). The kind is attribute 0, so it is part
// of the node's hash: place-to-host and place-to-device never share a
// compiled graph. Lowered as XLA expects it (the form jax emits for
// device_put(x, memory_kind) inside jit):
//   stablehlo.custom_call @annotate_device_placement(%x) {has_side_effect = true,
//       mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}}
// XLA's host-offload passes turn these into host<->device copies; XLA:CPU
// drops them (its host and device memory are the same). A graph output that
// is a value placed on the host keeps that memory kind (the result's
// mhlo.memory_kind, lower/emitter.cpp), so it stays on the host until used.
#include "ir/memory.h"
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {

TXC_OP("place", 1,
    [](Node& n) {
      if (parse_memory_kind(n.attr_str(0)) < 0)
        op_error(n, "unknown memory kind '" + n.attr_str(0) + "'; use 'pinned_host' or 'device'");
      n.dtype = n.operands[0]->dtype;
      n.dims = n.operands[0]->dims;
    },
    [](LowerCtx& cx, const Node& n) {
      static const uint16_t place = op_id("place");
      int kind = parse_memory_kind(n.attr_str(0));
      std::string v = cx.in(n, 0), type = LowerCtx::type(n);
      const Node& from = *n.operands[0];
      if (kind == kDevice && from.op == place && memory_kind_of(from) == kPinnedHost) {
        // A round trip within one graph (an activation saved to the host and
        // brought back for the backward): XLA's host offloader makes the two
        // annotations a copy to host memory and a copy back, and XLA:GPU's
        // algebraic simplifier then folds copy(copy(x)) into x, memory spaces
        // and all (seen in jaxlib 0.11's pass dumps; jax's own device_put round
        // trip inside jit loses its offload the same way). An optimization
        // barrier between the copies keeps them: the offloader lets a host
        // value pass through one, the simplifier cannot fold across it.
        v = cx.op("stablehlo.optimization_barrier", {v}, {type}, type);
      }
      return annotate_placement(cx, v, type, kind);
    });

}  // namespace txc

namespace txc {

// SPMD: the core op "sharding"(x; hlo, device_ids, mesh_shape, axis_names)
// asks XLA's SPMD partitioner to lay x out as `hlo` (HloSharding text over
// the mesh's devices, torch_xla_core/_execution/sharding.py); x's value is unchanged.
// The attributes are part of the hash. Lowered as jax lowers
// with_sharding_constraint without Shardy:
//   stablehlo.custom_call @Sharding(%x) {mhlo.sharding = "{devices=[4,1,2]<=[8] ...}"}
// The mesh attributes are read by the executor (GraphCut::annotations) for
// the device assignment.
TXC_OP("sharding", 1,
    [](Node& n) {
      if (n.attrs.size() != 4) op_error(n, "expected (hlo sharding, device ids, mesh shape, axis names)");
      n.dtype = n.operands[0]->dtype;
      n.dims = n.operands[0]->dims;
    },
    [](LowerCtx& cx, const Node& n) {
      std::string r = cx.fresh(), ty = LowerCtx::type(n);
      cx.body_.append(size_t(cx.indent_), ' ');
      cx.body_ += r + " = \"stablehlo.custom_call\"(" + cx.in(n, 0) +
                  ") <{call_target_name = \"Sharding\", api_version = 1 : i32}> {mhlo.sharding = \"" +
                  n.attr_str(0) + "\"} : (" + ty + ") -> " + ty + "\n";
      return r;
    });

}  // namespace txc

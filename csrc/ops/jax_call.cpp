// Inlined JAX functions (torch_xla_core/kernels/call_jax.py): a StableHLO
// module lowered by jax, held by the node as text, called from our graph.
//
//   jax_call(args...; funcs, entry, n_in, (in dtype, in dims)..., n_out,
//            (out dtype, out dims)...)
//                          one call of the jax function (several results).
//                          `funcs` is the text of the jax module's func.func
//                          ops, already renamed by Python so every symbol
//                          carries the module's content hash (two different
//                          modules never share a name; equal ones share
//                          one copy); `entry` is the public one. The text is
//                          an attribute, so it is part of the node's hash.
//   jax_result(call; k)    result k of a call.
//
// Lowering: the functions go once into the module (LowerCtx::add_funcs,
// written after @main), the node becomes one func.call; XLA inlines it. This
// works inside scan bodies too (the call sits in the while region).
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

struct Spec {
  DType dtype;
  Dims dims;
};

// Attribute layout: [funcs, entry, n_in, (dtype, dims)*n_in, n_out, (dtype, dims)*n_out].
std::vector<Spec> specs(const Node& n, size_t at, size_t* next) {
  int64_t k = n.attr_int(at);
  std::vector<Spec> s;
  for (int64_t i = 0; i < k; ++i) s.push_back({DType(n.attr_int(at + 1 + 2 * i)), n.attr_dims(at + 2 + 2 * i)});
  *next = at + 1 + 2 * size_t(k);
  return s;
}

std::vector<Spec> out_specs(const Node& n) {
  size_t next = 0;
  specs(n, 2, &next);
  return specs(n, next, &next);
}

std::string spec_str(DType t, const Dims& d) { return std::string(dtype_name(t)) + dims_str(d); }

void infer_call(Node& n) {
  size_t next = 0;
  std::vector<Spec> in = specs(n, 2, &next);
  if (in.size() != n.operands.size())
    op_error(n, "the lowered jax function takes " + std::to_string(in.size()) + " arrays, the call passes " +
                    std::to_string(n.operands.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const Node& a = *n.operands[i];
    if (a.dtype != in[i].dtype || a.dims != in[i].dims)
      op_error(n, "argument " + std::to_string(i) + " is " + spec_str(a.dtype, a.dims) +
                      ", the lowered jax function takes " + spec_str(in[i].dtype, in[i].dims));
  }
  specs(n, next, &next);
  n.dtype = DType::I64;
  n.dims = {};
}

std::string lower_call(LowerCtx& cx, const Node& n) {
  const std::string& entry = n.attr_str(1);
  cx.add_funcs(entry, n.attr_str(0));
  std::vector<std::string> args, arg_types, result_types;
  for (size_t i = 0; i < n.operands.size(); ++i) {
    args.push_back(cx.in(n, i));
    arg_types.push_back(LowerCtx::type(*n.operands[i]));
  }
  for (const Spec& s : out_specs(n)) result_types.push_back(LowerCtx::type(s.dtype, s.dims));
  return cx.op_multi("func.call", args, arg_types, result_types, "callee = @" + entry);
}

TXC_OP("jax_call", -1, infer_call, lower_call);

TXC_OP("jax_result", 1,
       [](Node& n) {
         const Node& c = *n.operands[0];
         if (op_def(c.op).name != "jax_call") op_error(n, "the operand is not a jax_call");
         std::vector<Spec> out = out_specs(c);
         int64_t k = n.attr_int(0);
         if (k < 0 || k >= int64_t(out.size())) op_error(n, "result " + std::to_string(k) + " out of range");
         n.dtype = out[size_t(k)].dtype;
         n.dims = out[size_t(k)].dims;
       },
       [](LowerCtx& cx, const Node& n) { return cx.in(n, 0) + "#" + std::to_string(n.attr_int(0)); });

}  // namespace
}  // namespace txc

// Matrix products: dot(a, b[, c]; lhs_batch, rhs_batch, lhs_contract,
// rhs_contract[, result dtype]) is stablehlo.dot_general, plus c
// broadcast-added when given (addmm/linear in one node); result dims are
// batch, then lhs free, then rhs free. The result has a's dtype unless
// attribute 4 names another (bf16 operands, a float32 product: baddbmm's
// handler scales and adds it in float32, rounding once, as torch's CPU
// kernels do). With an addend, half-precision products are added in float32
// and rounded once, too (addmm, linear with a bias). dot_general (ops/dot.h)
// is the one emitter of stablehlo.dot_general, which attention also uses.
#include "lower/emitter.h"
#include "ops/dot.h"
#include "ops/registry.h"

namespace txc {

std::string dot_general(LowerCtx& cx, DType t, const std::string& a, const Dims& ad, const std::string& b,
                        const Dims& bd, const DotDims& dd, DType result, const Dims& out) {
  auto list = [](const Dims& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  };
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  if (!dd.lhs_batch.empty())
    dn += "lhs_batching_dimensions = " + list(dd.lhs_batch) + ", rhs_batching_dimensions = " + list(dd.rhs_batch) +
          ", ";
  dn += "lhs_contracting_dimensions = " + list(dd.lhs_contract) + ", rhs_contracting_dimensions = " +
        list(dd.rhs_contract) + ">" + precision_config(t);
  return cx.op("stablehlo.dot_general", {a, b}, {LowerCtx::type(t, ad), LowerCtx::type(t, bd)},
               LowerCtx::type(result, out), dn);
}

namespace {

bool has(const Dims& d, int64_t v) {
  for (auto x : d) if (x == v) return true;
  return false;
}

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

TXC_OP("dot", -1,
       [](Node& n) {
         if (n.operands.size() != 2 && n.operands.size() != 3) op_error(n, "expected 2 or 3 operands");
         const Node &a = *n.operands[0], &b = *n.operands[1];
         const Dims &lb = n.attr_dims(0), &rb = n.attr_dims(1), &lc = n.attr_dims(2), &rc = n.attr_dims(3);
         if (lb.size() != rb.size() || lc.size() != rc.size()) op_error(n, "mismatched dimension lists");
         for (size_t i = 0; i < lb.size(); ++i)
           if (a.dims.at(lb[i]) != b.dims.at(rb[i]))
             op_error(n, "batch sizes differ: " + dims_str(a.dims) + " and " + dims_str(b.dims));
         for (size_t i = 0; i < lc.size(); ++i)
           if (a.dims.at(lc[i]) != b.dims.at(rc[i]))
             op_error(n, "shapes " + dims_str(a.dims) + " and " + dims_str(b.dims) +
                             " cannot be multiplied (contracted sizes " + std::to_string(a.dims[lc[i]]) + " and " +
                             std::to_string(b.dims[rc[i]]) + " differ)");
         if (a.dtype != b.dtype)
           op_error(n, std::string("expected both operands to have the same dtype, but got ") + dtype_name(a.dtype) +
                           " and " + dtype_name(b.dtype));
         // torch has no Bool kernel for matrix products ("addmm_impl_cpu_" not implemented for 'Bool'),
         // and XLA:CPU aborts the process compiling a bool dot with an addend
         if (is_bool(a.dtype))
           op_error(n, "matrix products of bool tensors are not supported (torch has no Bool kernel for them "
                       "either); cast the operands to an integer or floating dtype first");
         n.dtype = n.attrs.size() > 4 && n.attr_int(4) >= 0 ? DType(n.attr_int(4)) : a.dtype;
         n.dims.clear();
         for (auto d : lb) n.dims.push_back(a.dims[d]);
         for (int i = 0; i < a.rank(); ++i) if (!has(lb, i) && !has(lc, i)) n.dims.push_back(a.dims[i]);
         for (int i = 0; i < b.rank(); ++i) if (!has(rb, i) && !has(rc, i)) n.dims.push_back(b.dims[i]);
         if (n.operands.size() == 3) {
           const Node& c = *n.operands[2];
           if (c.dtype != n.dtype)
             op_error(n, std::string("expected the addend to have dtype ") + dtype_name(n.dtype) + ", got " +
                             dtype_name(c.dtype));
           if (broadcast_dims(n, c.dims, n.dims) != n.dims)
             op_error(n, "the addend of shape " + dims_str(c.dims) + " does not broadcast to the product's shape " +
                             dims_str(n.dims));
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &a = *n.operands[0], &b = *n.operands[1];
         // the product's dtype: float32 for a half-precision product plus an addend (one rounding, after the add)
         DType t = n.operands.size() == 3 && is_half(n.dtype) ? DType::F32 : n.dtype;
         std::string r = dot_general(cx, a.dtype, cx.in(n, 0), a.dims, cx.in(n, 1), b.dims,
                                     {n.attr_dims(0), n.attr_dims(1), n.attr_dims(2), n.attr_dims(3)}, t, n.dims);
         if (n.operands.size() == 3) r = cx.binary("stablehlo.add", r, cx.coerce(n, 2, t, n.dims), t, n.dims);
         return cx.convert(r, t, n.dtype, n.dims);
       });

}  // namespace
}  // namespace txc

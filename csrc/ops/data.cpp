// Leaves of the graph: device data and Python numbers (both parameters of a
// compiled graph, so new values never recompile), constants filled with one
// value, iota, dtype conversion and bitcasts.
#include <algorithm>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {

static void no_infer(Node&) {}

// Device data: built by make_data (ir/node.h) with its shape and payload; lowered as a parameter.
TXC_OP("data", 0, no_infer, nullptr);
// A Python number: dtype chosen by promotion at its use; a parameter.
TXC_OP("scalar", 0, no_infer, nullptr);

// A value whose graph failed (see is_error): attribute 0 is the error
// message; shape as the value it replaces. Never lowered: no graph uses it.
TXC_OP("error", 0, no_infer, nullptr);

// full(value: float, dtype: int, dims[, imag: float]): a constant tensor
// (imag: the imaginary part of a complex fill value).
TXC_OP("full", 0,
       [](Node& n) {
         n.dtype = DType(n.attr_int(1));
         n.dims = n.attr_dims(2);
       },
       [](LowerCtx& cx, const Node& n) {
         if (n.attrs.size() > 3 && is_complex(n.dtype))
           return cx.complex_constant(n.attr_float(0), n.attr_float(3), n.dtype, n.dims);
         return cx.constant(n.attr_float(0), n.dtype, n.dims);
       });

// iota(dtype, dims, dim): counts along `dim`.
TXC_OP("iota", 0,
       [](Node& n) {
         n.dtype = DType(n.attr_int(0));
         n.dims = n.attr_dims(1);
         norm_dim(n, n.attr_int(2), n.rank());
       },
       [](LowerCtx& cx, const Node& n) {
         return cx.op("stablehlo.iota", {}, {}, LowerCtx::type(n),
                      "iota_dimension = " + std::to_string(n.attr_int(2)) + " : i64");
       });

// convert(x, dtype): elementwise dtype conversion with torch's semantics
// (float -> int truncates toward zero; nonzero -> true).
TXC_OP("convert", 1,
       [](Node& n) {
         n.dtype = DType(n.attr_int(0));
         n.dims = n.operands[0]->dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         return cx.convert(cx.in(n, 0), x.dtype, n.dtype, x.dims);
       });

// bitcast(x; dtype): x's bytes read as dtype (torch's view(dtype)), a view.
// Element sizes may differ (not for 0-d x): a wider x's last dim grows by
// the ratio, a narrower x's shrinks by it (its size must divide). Bools
// take part as one byte of 0/1; complex dtypes are refused by the caller.
static int64_t bitcast_ratio(const Node& n, DType from) {
  int wf = std::max(bit_width(from), 8), wt = std::max(bit_width(n.dtype), 8);
  return wf >= wt ? wf / wt : -(wt / wf);  // >0: from is wider (or equal), <0: narrower
}
TXC_OP("bitcast", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         n.dtype = DType(n.attr_int(0));
         if (is_complex(n.dtype) || is_complex(x.dtype)) op_error(n, "complex dtypes cannot be bitcast");
         n.dims = x.dims;
         int64_t k = bitcast_ratio(n, x.dtype);
         if (k == 1) return;
         if (x.rank() == 0) op_error(n, "a 0-d tensor cannot be bitcast to a dtype of another element size");
         if (k > 1) n.dims.back() *= k;
         else if (x.dims.back() % -k)
           op_error(n, "the last dim (" + std::to_string(x.dims.back()) + ") must be divisible by " +
                           std::to_string(-k) + " to bitcast " + dtype_name(x.dtype) + " to " + dtype_name(n.dtype));
         else n.dims.back() /= -k;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         DType from = is_bool(x.dtype) ? DType::U8 : x.dtype, to = is_bool(n.dtype) ? DType::U8 : n.dtype;
         std::string v = cx.convert(cx.in(n, 0), x.dtype, from, x.dims);
         int64_t k = bitcast_ratio(n, x.dtype);
         Dims mid = k > 1 ? x.dims : n.dims;  // the bitcast_convert's wider side, with a dim of |k| added
         if (k != 1) mid.push_back(k > 1 ? k : -k);
         std::string r;
         if (k == 1) {
           r = from == to ? v
                          : cx.op("stablehlo.bitcast_convert", {v}, {LowerCtx::type(from, x.dims)},
                                  LowerCtx::type(to, x.dims));
         } else if (k > 1) {
           r = cx.op("stablehlo.bitcast_convert", {v}, {LowerCtx::type(from, x.dims)}, LowerCtx::type(to, mid));
           r = cx.reshape(r, to, mid, n.dims);
         } else {
           r = cx.reshape(v, from, x.dims, mid);
           r = cx.op("stablehlo.bitcast_convert", {r}, {LowerCtx::type(from, mid)}, LowerCtx::type(to, n.dims));
         }
         return cx.convert(r, to, n.dtype, n.dims);
       },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make_node(op_id("bitcast"), {value}, {int64_t(parent->dtype)});
       },
       [](const Node& n, Dims& strides, int64_t& offset) {  // in elements of the new dtype
         int64_t k = bitcast_ratio(n, n.operands[0]->dtype);
         if (k == 1) return true;
         for (size_t i = 0; i + 1 < strides.size(); ++i) {
           if (k < 0 && strides[i] % -k) return false;
           strides[i] = k > 0 ? strides[i] * k : strides[i] / -k;
         }
         if (k < 0 && offset % -k) return false;
         offset = k > 0 ? offset * k : offset / -k;
         return true;
       });

}  // namespace txc

// Leaves of the graph: device data and Python numbers (both parameters of a
// compiled graph, so new values never recompile), constants filled with one
// value, iota, and dtype conversion.
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

}  // namespace txc

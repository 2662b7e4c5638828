// An out-of-tree core op for torch_xla_core: scaled_tanh(x) = alpha * tanh(beta * x)
// and its gradient, each ONE core op (shape rule + lowering), written as the
// in-tree ops in torch_xla_core's csrc/ops/*.cpp are. ext/extension.h forwards
// the core functions used here into the installed core and checks, when the
// module is imported, that the core is the flavor (C++ ABI) this was built for.
#include <torch_xla_core/ext/extension.h>

namespace {
using namespace txc;

// bf16/f16 compute in f32, as torch's CPU kernels do.
DType compute_t(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

// Shape rule: every operand a floating tensor of the last operand's shape.
void same_floating(Node& n) {
  const Node& x = *n.operands.back();
  if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating-point tensor, got ") + dtype_name(x.dtype));
  for (const auto& o : n.operands)
    if (o->dims != x.dims) op_error(n, "operand shapes differ: " + dims_str(o->dims) + " vs " + dims_str(x.dims));
  if (n.attrs.size() != 2) op_error(n, "expected attributes (alpha, beta)");
  n.dtype = x.dtype;
  n.dims = x.dims;
}

struct Ew {  // elementwise ops on one type and shape
  LowerCtx& cx;
  DType t;
  const Dims& d;
  std::string ty() const { return LowerCtx::type(t, d); }
  std::string mul(const std::string& a, const std::string& b) {
    return cx.op("stablehlo.multiply", {a, b}, {ty(), ty()}, ty());
  }
  std::string sub(const std::string& a, const std::string& b) {
    return cx.op("stablehlo.subtract", {a, b}, {ty(), ty()}, ty());
  }
  std::string tanh(const std::string& a) { return cx.op("stablehlo.tanh", {a}, {ty()}, ty()); }
  std::string c(double v) { return cx.constant(v, t, d); }
};

// y = alpha * tanh(beta * x); attrs (alpha, beta).
TXC_OP("scaled_tanh", 1, same_floating, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string x = cx.convert(cx.in(n, 0), n.dtype, ct, n.dims);
  std::string y = e.mul(e.c(n.attr_float(0)), e.tanh(e.mul(e.c(n.attr_float(1)), x)));
  return cx.convert(y, ct, n.dtype, n.dims);
});

// dx = g * alpha * beta * (1 - tanh(beta * x)^2); operands (g, x), attrs (alpha, beta).
TXC_OP("scaled_tanh_backward", 2, same_floating, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string g = cx.convert(cx.in(n, 0), n.operands[0]->dtype, ct, n.dims);
  std::string x = cx.convert(cx.in(n, 1), n.dtype, ct, n.dims);
  std::string t = e.tanh(e.mul(e.c(n.attr_float(1)), x));
  std::string d = e.mul(e.c(n.attr_float(0) * n.attr_float(1)), e.sub(e.c(1), e.mul(t, t)));
  return cx.convert(e.mul(g, d), ct, n.dtype, n.dims);
});

}  // namespace

TXC_EXTENSION_MODULE(_C, m) {
  m.doc() = "scaled_tanh: an out-of-tree torch_xla_core core op (see txc_scaled_tanh)";
  // Runs after the core's flavor was checked and the TXC_OPs above were
  // registered; ops registered here (txc::register_op) get their id at once.
}

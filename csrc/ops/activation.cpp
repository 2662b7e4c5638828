// Fused activations and their gradients (one node each, several StableHLO
// ops when lowered): gelu (exact or tanh), silu.
#include <cmath>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

// Elementwise arithmetic on values of one type and shape.
struct Ew {
  LowerCtx& cx;
  DType t;
  Dims d;
  std::string ty() const { return LowerCtx::type(t, d); }
  std::string b(const char* op, const std::string& x, const std::string& y) { return cx.op(op, {x, y}, {ty(), ty()}, ty()); }
  std::string u(const char* op, const std::string& x) { return cx.op(op, {x}, {ty()}, ty()); }
  std::string add(const std::string& x, const std::string& y) { return b("stablehlo.add", x, y); }
  std::string sub(const std::string& x, const std::string& y) { return b("stablehlo.subtract", x, y); }
  std::string mul(const std::string& x, const std::string& y) { return b("stablehlo.multiply", x, y); }
  std::string c(double v) { return cx.constant(v, t, d); }
};

void same_as_last(Node& n) {
  const Node& x = *n.operands.back();
  if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating-point tensor, got ") + dtype_name(x.dtype));
  for (const auto& o : n.operands)
    if (o->dims != x.dims) op_error(n, "operand shapes differ: " + dims_str(o->dims) + " vs " + dims_str(x.dims));
  n.dtype = x.dtype;
  n.dims = x.dims;
}

const double kSqrt1_2 = 0.70710678118654752440;
const double kTanhK = 0.79788456080286535588;  // sqrt(2/pi)
const double kTanhC = 0.044715;

// Computes in f32 at least (bf16/f16 inputs are upcast, as torch does).
DType compute_t(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

TXC_OP("gelu", 1, same_as_last, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string x = cx.convert(cx.in(n, 0), n.dtype, ct, n.dims), inner;
  if (n.attr_str(0) == "tanh") {
    std::string x3 = e.mul(e.mul(x, x), x);
    inner = e.u("stablehlo.tanh", e.mul(e.c(kTanhK), e.add(x, e.mul(e.c(kTanhC), x3))));
  } else {
    inner = e.u("chlo.erf", e.mul(x, e.c(kSqrt1_2)));
  }
  std::string r = e.mul(e.mul(e.c(0.5), x), e.add(e.c(1), inner));
  return cx.convert(r, ct, n.dtype, n.dims);
});

TXC_OP("gelu_backward", 2, same_as_last, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string g = cx.convert(cx.in(n, 0), n.operands[0]->dtype, ct, n.dims);
  std::string x = cx.convert(cx.in(n, 1), n.dtype, ct, n.dims), d;
  if (n.attr_str(0) == "tanh") {
    std::string x2 = e.mul(x, x);
    std::string t = e.u("stablehlo.tanh", e.mul(e.c(kTanhK), e.add(x, e.mul(e.c(kTanhC), e.mul(x2, x)))));
    std::string dinner = e.mul(e.c(kTanhK), e.add(e.c(1), e.mul(e.c(3 * kTanhC), x2)));
    std::string left = e.mul(e.c(0.5), e.add(e.c(1), t));
    std::string right = e.mul(e.mul(e.mul(e.c(0.5), x), e.sub(e.c(1), e.mul(t, t))), dinner);
    d = e.add(left, right);
  } else {
    std::string cdf = e.mul(e.c(0.5), e.add(e.c(1), e.u("chlo.erf", e.mul(x, e.c(kSqrt1_2)))));
    std::string pdf = e.mul(e.u("stablehlo.exponential", e.mul(e.c(-0.5), e.mul(x, x))), e.c(0.39894228040143267794));
    d = e.add(cdf, e.mul(x, pdf));
  }
  return cx.convert(e.mul(g, d), ct, n.dtype, n.dims);
});

TXC_OP("silu", 1, same_as_last, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string x = cx.convert(cx.in(n, 0), n.dtype, ct, n.dims);
  return cx.convert(e.mul(x, e.u("stablehlo.logistic", x)), ct, n.dtype, n.dims);
});

TXC_OP("silu_backward", 2, same_as_last, [](LowerCtx& cx, const Node& n) {
  DType ct = compute_t(n.dtype);
  Ew e{cx, ct, n.dims};
  std::string g = cx.convert(cx.in(n, 0), n.operands[0]->dtype, ct, n.dims);
  std::string x = cx.convert(cx.in(n, 1), n.dtype, ct, n.dims);
  std::string s = e.u("stablehlo.logistic", x);
  std::string d = e.mul(s, e.add(e.c(1), e.mul(x, e.sub(e.c(1), s))));
  return cx.convert(e.mul(g, d), ct, n.dtype, n.dims);
});

}  // namespace
}  // namespace txc

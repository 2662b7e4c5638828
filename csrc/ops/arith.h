// Shorthand for lowering the fused nn ops (ops/nn.cpp, ops/norm.cpp,
// ops/attention.cpp, ops/pool.cpp): the dtype half-precision inputs compute
// in, axis lists, and Arith, StableHLO arithmetic on values of one dtype.
#pragma once
#include <cmath>
#include <string>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace arith {

// f16/bf16 compute in f32 (as torch's CPU kernels accumulate); other dtypes as they are.
inline DType float_compute_dtype(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

// f(v, t) on operand 0 of n as v in its compute dtype t, the result (dims
// n.dims) converted to n.dtype: the frame of a lowering that only computes.
template <class F>
std::string in_compute_dtype(LowerCtx& cx, const Node& n, F f) {
  const Node& x = *n.operands[0];
  DType t = float_compute_dtype(x.dtype);
  return cx.convert(f(cx.convert(cx.in(n, 0), x.dtype, t, x.dims), t), t, n.dtype, n.dims);
}

// [a, b)
inline Dims range(int64_t a, int64_t b) {
  Dims d;
  for (int64_t i = a; i < b; ++i) d.push_back(i);
  return d;
}

inline bool contains(const Dims& d, int64_t v) {
  for (auto x : d) if (x == v) return true;
  return false;
}

// d without the dims at `axes`.
inline Dims drop(const Dims& d, const Dims& axes) {
  Dims r;
  for (int64_t i = 0; i < int64_t(d.size()); ++i) if (!contains(axes, i)) r.push_back(d[i]);
  return r;
}

// d with the dims at `axes` set to 1.
inline Dims keep1(const Dims& d, const Dims& axes) {
  Dims r = d;
  for (auto a : axes) r[a] = 1;
  return r;
}

inline void need_float(const Node& n, const Node& x, const char* what) {
  if (!is_floating(x.dtype))
    op_error(n, std::string("expected a floating-point ") + what + ", got " + dtype_name(x.dtype));
}

// Arithmetic on values of dtype t, any shape.
struct Arith {
  LowerCtx& cx;
  DType t;
  std::string b(const char* op, const std::string& x, const std::string& y, const Dims& d) {
    return cx.binary(op, x, y, t, d);
  }
  std::string u(const char* op, const std::string& x, const Dims& d) { return cx.unary(op, x, t, d); }
  std::string add(const std::string& x, const std::string& y, const Dims& d) { return b("stablehlo.add", x, y, d); }
  std::string sub(const std::string& x, const std::string& y, const Dims& d) { return b("stablehlo.subtract", x, y, d); }
  std::string mul(const std::string& x, const std::string& y, const Dims& d) { return b("stablehlo.multiply", x, y, d); }
  std::string div(const std::string& x, const std::string& y, const Dims& d) { return b("stablehlo.divide", x, y, d); }
  std::string c(double v, const Dims& d) { return cx.constant(v, t, d); }
  std::string sum(const std::string& x, const Dims& d, const Dims& axes) {
    return cx.reduce(x, t, d, axes, "stablehlo.add", 0);
  }
  std::string max(const std::string& x, const Dims& d, const Dims& axes) {
    return cx.reduce(x, t, d, axes, "stablehlo.maximum", -INFINITY);
  }
  // r (d without `axes`) broadcast back to d.
  std::string back(const std::string& r, const Dims& d, const Dims& axes) {
    Dims map;
    for (int64_t i = 0; i < int64_t(d.size()); ++i) if (!contains(axes, i)) map.push_back(i);
    return cx.broadcast_in_dim(r, t, drop(d, axes), d, map);
  }
  // Compares values of dtype ct (not necessarily t).
  std::string cmp(const std::string& x, const std::string& y, const Dims& d, const char* dir, DType ct) {
    return cx.compare(x, y, ct, d, dir);
  }
  std::string eq(const std::string& x, const std::string& y, const Dims& d) { return cmp(x, y, d, "EQ", t); }
  std::string sel(const std::string& p, const std::string& x, const std::string& y, const Dims& d) {
    return cx.select(p, x, y, t, d);
  }
  // Operand i of n in this dtype, broadcast (trailing alignment) to d.
  std::string in(const Node& n, size_t i, const Dims& d) { return cx.coerce(n, i, t, d); }
};

}  // namespace arith
}  // namespace txc

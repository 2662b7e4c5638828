// Normalization layers, forward and backward: layer norm, RMS norm (over the
// trailing dims; optional affine weight/bias announced by has_* attributes)
// and batch norm (channel dim 1, statistics over every other dim: statistics,
// normalization, running-stat updates and gradients). Ops with several torch
// outputs (layer norm's out/mean/rstd, ...) are one node per output, chosen by
// a `which` attribute. Half-precision inputs compute in f32.
#include <cmath>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"

namespace txc {
namespace {

using namespace arith;

// ---- layer norm / RMS norm -------------------------------------------------
// Normalized axes: [axis, rank). Statistics have the input's shape with those
// axes set to 1.
void check_affine(const Node& n, const Node& x, int64_t axis, size_t first, int count, const char* kind) {
  Dims tail(x.dims.begin() + axis, x.dims.end());
  for (int i = 0; i < count; ++i) {
    const Node& w = *n.operands.at(first + i);
    if (w.dims != tail)
      op_error(n, std::string("expected ") + kind + " of shape " + dims_str(tail) + " (normalized_shape), got " +
                      dims_str(w.dims));
  }
}

int64_t norm_axis(const Node& n, const Node& x) {
  int64_t axis = n.attr_int(0);
  if (axis < 0 || axis > x.rank()) op_error(n, "normalized_shape does not fit input of shape " + dims_str(x.dims));
  return axis;
}

// Shape rule of layer_norm_backward and rms_norm_backward: operands grad, x,
// `stats` per-row statistics (named `stat_names` in errors), then the weight
// when attribute 2 says so; attribute 1 picks grad_input (0) or a parameter's
// grad, attribute 3 is the output dtype.
void infer_norm_backward(Node& n, int stats, const char* stat_names) {
  const Node &g = *n.operands[0], &x = *n.operands[1];
  int64_t axis = norm_axis(n, x);
  if (g.dims != x.dims) op_error(n, "grad and input shapes differ: " + dims_str(g.dims) + " vs " + dims_str(x.dims));
  Dims sd = keep1(x.dims, range(axis, x.rank()));
  for (int i = 0; i < stats; ++i)
    if (n.operands[size_t(2 + i)]->dims != sd) op_error(n, std::string(stat_names) + " must have shape " + dims_str(sd));
  if (int(n.operands.size()) != 2 + stats + n.attr_int(2)) op_error(n, "wrong number of operands");
  check_affine(n, x, axis, size_t(2 + stats), int(n.attr_int(2)), "weight");
  n.dtype = DType(n.attr_int(3));
  n.dims = n.attr_int(1) == 0 ? x.dims : Dims(x.dims.begin() + axis, x.dims.end());
}

// layer_norm(x, [w], [b]; axis, eps, which, has_w, has_b) which: 0 out, 1 mean, 2 rstd
TXC_OP("layer_norm", -1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         need_float(n, x, "input");
         int64_t axis = norm_axis(n, x);
         int nw = int(n.attr_int(3) + n.attr_int(4));
         if (int(n.operands.size()) != 1 + nw) op_error(n, "wrong number of operands");
         check_affine(n, x, axis, 1, nw, "weight and bias");
         n.dtype = x.dtype;
         n.dims = n.attr_int(2) == 0 ? x.dims : keep1(x.dims, range(axis, x.rank()));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Dims d = x.dims, ax = range(n.attr_int(0), x.rank());
         double cnt = 1;
         for (auto a : ax) cnt *= double(d[a]);
         DType ct = float_compute_dtype(x.dtype);
         Arith k{cx, ct};
         Dims rd = drop(d, ax);
         std::string v = k.in(n, 0, d);
         std::string mean = k.div(k.sum(v, d, ax), k.c(cnt, rd), rd);
         std::string xc = k.sub(v, k.back(mean, d, ax), d);
         std::string var = k.div(k.sum(k.mul(xc, xc, d), d, ax), k.c(cnt, rd), rd);
         std::string rstd = k.u("stablehlo.rsqrt", k.add(var, k.c(n.attr_float(1), rd), rd), rd);
         int64_t which = n.attr_int(2);
         if (which == 1) return cx.convert(cx.reshape(mean, ct, rd, n.dims), ct, n.dtype, n.dims);
         if (which == 2) return cx.convert(cx.reshape(rstd, ct, rd, n.dims), ct, n.dtype, n.dims);
         std::string r = k.mul(xc, k.back(rstd, d, ax), d);
         size_t i = 1;
         if (n.attr_int(3)) r = k.mul(r, k.in(n, i++, d), d);
         if (n.attr_int(4)) r = k.add(r, k.in(n, i++, d), d);
         return cx.convert(r, ct, n.dtype, d);
       });

// What layer_norm's and rms_norm's backward lowerings start from: grad
// (operand 0) and x (operand 1) in the compute dtype, the normalized axes
// (axis..rank: ax), the ones before them (bx), and the result's conversion.
struct NormGrad {
  const Node& n;
  Dims d, ax, bx, rd;
  DType ct;
  Arith k;
  std::string g;
  NormGrad(LowerCtx& cx, const Node& node)
      : n(node), d(node.operands[1]->dims), ax(range(node.attr_int(0), int64_t(d.size()))),
        bx(range(0, node.attr_int(0))), rd(drop(d, ax)), ct(float_compute_dtype(node.operands[1]->dtype)),
        k{cx, ct}, g(k.in(node, 0, d)) {}
  // The mean of v over the normalized axes, broadcast back over d.
  std::string mean_back(const std::string& v) {
    double cnt = 1;
    for (auto a : ax) cnt *= double(d[a]);
    return k.back(k.div(k.sum(v, d, ax), k.c(cnt, rd), rd), d, ax);
  }
  // A result in the compute dtype, converted to the node's (its dims: n.dims).
  std::string out(const std::string& r) { return k.cx.convert(r, ct, n.dtype, n.dims); }
  // grad_weight: sum over the batch axes of grad * xhat.
  std::string weight_grad(const std::string& xhat) { return out(k.sum(k.mul(g, xhat, d), d, bx)); }
  // The gradient reaching the normalized value: grad * weight (operand w, when has_w).
  std::string through_weight(size_t w) { return n.attr_int(2) ? k.mul(g, k.in(n, w, d), d) : g; }
};

// layer_norm_backward(grad, x, mean, rstd, [w]; axis, which, has_w, out_dtype)
// which: 0 grad_input, 1 grad_weight, 2 grad_bias
TXC_OP("layer_norm_backward", -1,
       [](Node& n) { infer_norm_backward(n, 2, "mean/rstd"); },
       [](LowerCtx& cx, const Node& n) {
         NormGrad s(cx, n);
         Arith& k = s.k;
         const Dims& d = s.d;
         if (n.attr_int(1) == 2) return s.out(k.sum(s.g, d, s.bx));  // grad_bias
         std::string rstd = k.in(n, 3, d), xhat = k.mul(k.sub(k.in(n, 1, d), k.in(n, 2, d), d), rstd, d);
         if (n.attr_int(1) == 1) return s.weight_grad(xhat);
         std::string dx = s.through_weight(4), a = s.mean_back(dx), b = s.mean_back(k.mul(dx, xhat, d));
         return s.out(k.mul(rstd, k.sub(k.sub(dx, a, d), k.mul(xhat, b, d), d), d));
       });

// rms_norm(x, [w]; axis, eps, which, has_w) which: 0 out, 1 rstd (f32 for half inputs)
TXC_OP("rms_norm", -1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         need_float(n, x, "input");
         int64_t axis = norm_axis(n, x);
         if (int(n.operands.size()) != 1 + n.attr_int(3)) op_error(n, "wrong number of operands");
         check_affine(n, x, axis, 1, int(n.attr_int(3)), "weight");
         bool out = n.attr_int(2) == 0;
         n.dtype = out ? x.dtype : float_compute_dtype(x.dtype);
         n.dims = out ? x.dims : keep1(x.dims, range(axis, x.rank()));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Dims d = x.dims, ax = range(n.attr_int(0), x.rank()), rd = drop(d, ax);
         double cnt = 1;
         for (auto a : ax) cnt *= double(d[a]);
         DType ct = float_compute_dtype(x.dtype);
         Arith k{cx, ct};
         std::string v = k.in(n, 0, d);
         std::string ms = k.div(k.sum(k.mul(v, v, d), d, ax), k.c(cnt, rd), rd);
         std::string rstd = k.u("stablehlo.rsqrt", k.add(ms, k.c(n.attr_float(1), rd), rd), rd);
         if (n.attr_int(2) == 1) return cx.reshape(rstd, ct, rd, n.dims);
         std::string r = k.mul(v, k.back(rstd, d, ax), d);
         if (n.attr_int(3)) r = k.mul(r, k.in(n, 1, d), d);
         return cx.convert(r, ct, n.dtype, d);
       });

// rms_norm_backward(grad, x, rstd, [w]; axis, which, has_w, out_dtype) which: 0 grad_input, 1 grad_weight
TXC_OP("rms_norm_backward", -1,
       [](Node& n) { infer_norm_backward(n, 1, "rstd"); },
       [](LowerCtx& cx, const Node& n) {
         NormGrad s(cx, n);
         std::string rstd = s.k.in(n, 2, s.d), xhat = s.k.mul(s.k.in(n, 1, s.d), rstd, s.d);
         if (n.attr_int(1) == 1) return s.weight_grad(xhat);
         std::string dx = s.through_weight(3);
         Arith& k = s.k;
         const Dims& d = s.d;
         return s.out(k.mul(rstd, k.sub(dx, k.mul(xhat, s.mean_back(k.mul(dx, xhat, d)), d), d), d));
       });

// ---- batch norm (channel dim 1; statistics over every other dim) ----

Dims bn_axes(int rank) {
  Dims a;
  for (int i = 0; i < rank; ++i) if (i != 1) a.push_back(i);
  return a;
}
int64_t bn_count(const Dims& d) {
  int64_t c = 1;
  for (size_t i = 0; i < d.size(); ++i) if (i != 1) c *= d[i];
  return c;
}

void bn_check_input(const Node& n, const Node& x) {
  if (x.rank() < 2) op_error(n, "expected an input with at least 2 dims (N, C, ...), got " + dims_str(x.dims));
  if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
}

// Per-channel vector operand i as f(t), broadcast to x dims along dim 1.
std::string bn_chan(LowerCtx& cx, const Node& n, size_t i, DType t, const Dims& xd) {
  const Node& o = *n.operands[i];
  std::string v = cx.convert(cx.in(n, i), o.dtype, t, o.dims);
  return cx.broadcast_in_dim(v, t, o.dims, xd, {1});
}

// batch_norm_stats(x; which (0 mean, 1 invstd, 2 unbiased var), eps, out dtype)
TXC_OP("batch_norm_stats", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         bn_check_input(n, x);
         if (n.attr_int(0) == 2 && bn_count(x.dims) < 2)
           op_error(n, "Expected more than 1 value per channel when training, got input size " + dims_str(x.dims));
         n.dtype = DType(n.attr_int(2));
         n.dims = {x.dims[1]};
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         DType t = float_compute_dtype(x.dtype);
         if (n.dtype == DType::F64) t = DType::F64;
         Dims c = n.dims, axes = bn_axes(x.rank());
         double N = double(bn_count(x.dims));
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
         std::string ct = LowerCtx::type(t, c), xt = LowerCtx::type(t, x.dims);
         std::string s = cx.reduce(v, t, x.dims, axes, "stablehlo.add", 0);
         std::string mean = cx.binary("stablehlo.divide", s, cx.constant(N, t, c), t, c);
         std::string r = mean;
         if (n.attr_int(0) != 0) {
           std::string d = cx.binary("stablehlo.subtract", v, cx.broadcast_in_dim(mean, t, c, x.dims, {1}), t, x.dims);
           std::string ss = cx.reduce(cx.binary("stablehlo.multiply", d, d, t, x.dims), t, x.dims, axes, "stablehlo.add", 0);
           if (n.attr_int(0) == 2) {
             r = cx.binary("stablehlo.divide", ss, cx.constant(N - 1, t, c), t, c);
           } else {
             std::string var = cx.binary("stablehlo.divide", ss, cx.constant(N, t, c), t, c);
             std::string ve = cx.binary("stablehlo.add", var, cx.constant(n.attr_float(1), t, c), t, c);
             r = cx.unary("stablehlo.rsqrt", ve, t, c);
           }
         }
         return cx.convert(r, t, n.dtype, c);
       });

// batch_norm_invstd(var; eps): 1 / sqrt(var + eps)
TXC_OP("batch_norm_invstd", 1,
       [](Node& n) {
         n.dtype = n.operands[0]->dtype;
         n.dims = n.operands[0]->dims;
       },
       [](LowerCtx& cx, const Node& n) {
         std::string ct = LowerCtx::type(n);
         std::string ve = cx.binary("stablehlo.add", cx.in(n, 0), cx.constant(n.attr_float(0), n.dtype, n.dims), n.dtype, n.dims);
         return cx.unary("stablehlo.rsqrt", ve, n.dtype, n.dims);
       });

void bn_check_chan(const Node& n, size_t i, int64_t C, const char* what) {
  const Node& o = *n.operands[i];
  if (o.rank() != 1 || o.dims[0] != C)
    op_error(n, std::string("expected ") + what + " to have shape [" + std::to_string(C) + "], got " + dims_str(o.dims));
}

// batch_norm_apply(x, mean, s[, w][, b]; s_is_var, eps, has_w, has_b):
// (x - mean) * invstd * w + b, with invstd = s or rsqrt(s + eps).
TXC_OP("batch_norm_apply", -1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         bn_check_input(n, x);
         size_t want = 3 + size_t(n.attr_int(2) != 0) + size_t(n.attr_int(3) != 0);
         if (n.operands.size() != want) op_error(n, "wrong number of operands");
         for (size_t i = 1; i < n.operands.size(); ++i)
           bn_check_chan(n, i, x.dims[1], i == 1 ? "mean" : i == 2 ? "variance" : (i == 3 && n.attr_int(2)) ? "weight" : "bias");
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         DType t = float_compute_dtype(x.dtype);
         for (auto& o : n.operands) if (o->dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         std::string xt = LowerCtx::type(t, d);
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, d);
         std::string s;
         if (n.attr_int(0)) {
           const Node& var = *n.operands[2];
           std::string ct = LowerCtx::type(t, var.dims);
           std::string vv = cx.convert(cx.in(n, 2), var.dtype, t, var.dims);
           std::string ve = cx.binary("stablehlo.add", vv, cx.constant(n.attr_float(1), t, var.dims), t, var.dims);
           s = cx.broadcast_in_dim(cx.unary("stablehlo.rsqrt", ve, t, var.dims), t, var.dims, d, {1});
         } else {
           s = bn_chan(cx, n, 2, t, d);
         }
         std::string r = cx.binary("stablehlo.subtract", v, bn_chan(cx, n, 1, t, d), t, d);
         r = cx.binary("stablehlo.multiply", r, s, t, d);
         size_t i = 3;
         if (n.attr_int(2)) r = cx.binary("stablehlo.multiply", r, bn_chan(cx, n, i++, t, d), t, d);
         if (n.attr_int(3)) r = cx.binary("stablehlo.add", r, bn_chan(cx, n, i++, t, d), t, d);
         return cx.convert(r, t, x.dtype, d);
       });

// batch_norm_update(running, stat; momentum): running * (1 - m) + stat * m
TXC_OP("batch_norm_update", 2,
       [](Node& n) {
         const Node &r = *n.operands[0], &s = *n.operands[1];
         if (r.dims != s.dims)
           op_error(n, "running stat of shape " + dims_str(r.dims) + " does not match " + dims_str(s.dims));
         n.dtype = r.dtype;
         n.dims = r.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         DType t = n.dtype;
         const Dims& d = n.dims;
         std::string ty = LowerCtx::type(t, d);
         double m = n.attr_float(0);
         std::string s = cx.convert(cx.in(n, 1), n.operands[1]->dtype, t, d);
         std::string a = cx.binary("stablehlo.multiply", cx.in(n, 0), cx.constant(1 - m, t, d), t, d);
         std::string b = cx.binary("stablehlo.multiply", s, cx.constant(m, t, d), t, d);
         return cx.binary("stablehlo.add", a, b, t, d);
       });

// batch_norm_backward_input(g, x, mean, invstd[, w]; train, has_w)
//   train: w * invstd * (g - mean(g) - xhat * mean(g * xhat)), xhat = (x - mean) * invstd
//   eval:  g * invstd * w
TXC_OP("batch_norm_backward_input", -1,
       [](Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         bn_check_input(n, x);
         if (g.dims != x.dims) op_error(n, "grad_out " + dims_str(g.dims) + " and input " + dims_str(x.dims) + " differ in shape");
         if (n.operands.size() != 4 + size_t(n.attr_int(1) != 0)) op_error(n, "wrong number of operands");
         for (size_t i = 2; i < n.operands.size(); ++i) bn_check_chan(n, i, x.dims[1], "per-channel operands");
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         DType t = float_compute_dtype(x.dtype);
         for (auto& o : n.operands) if (o->dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         Dims c = {d[1]}, axes = bn_axes(x.rank());
         std::string xt = LowerCtx::type(t, d), ct = LowerCtx::type(t, c);
         double N = double(bn_count(d));
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, d);
         std::string inv = bn_chan(cx, n, 3, t, d);
         std::string scale = inv;
         if (n.attr_int(1)) scale = cx.binary("stablehlo.multiply", inv, bn_chan(cx, n, 4, t, d), t, d);
         std::string r;
         if (n.attr_int(0)) {
           std::string xv = cx.convert(cx.in(n, 1), x.dtype, t, d);
           std::string xhat = cx.binary("stablehlo.subtract", xv, bn_chan(cx, n, 2, t, d), t, d);
           xhat = cx.binary("stablehlo.multiply", xhat, inv, t, d);
           auto mean_b = [&](const std::string& v) {
             std::string s = cx.reduce(v, t, d, axes, "stablehlo.add", 0);
             s = cx.binary("stablehlo.divide", s, cx.constant(N, t, c), t, c);
             return cx.broadcast_in_dim(s, t, c, d, {1});
           };
           std::string mg = mean_b(gv);
           std::string mgx = mean_b(cx.binary("stablehlo.multiply", gv, xhat, t, d));
           r = cx.binary("stablehlo.subtract", gv, mg, t, d);
           r = cx.binary("stablehlo.subtract", r, cx.binary("stablehlo.multiply", xhat, mgx, t, d), t, d);
           r = cx.binary("stablehlo.multiply", r, scale, t, d);
         } else {
           r = cx.binary("stablehlo.multiply", gv, scale, t, d);
         }
         return cx.convert(r, t, x.dtype, d);
       });

// batch_norm_backward_weight(g, x, mean, invstd; out dtype): sum(g * (x - mean)) * invstd
TXC_OP("batch_norm_backward_weight", 4,
       [](Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         bn_check_input(n, x);
         if (g.dims != x.dims) op_error(n, "grad_out " + dims_str(g.dims) + " and input " + dims_str(x.dims) + " differ in shape");
         for (size_t i = 2; i < 4; ++i) bn_check_chan(n, i, x.dims[1], "per-channel operands");
         n.dtype = DType(n.attr_int(0));
         n.dims = {x.dims[1]};
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         DType t = float_compute_dtype(x.dtype);
         if (n.dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         Dims c = n.dims;
         std::string xt = LowerCtx::type(t, d), ct = LowerCtx::type(t, c);
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, d);
         std::string xv = cx.convert(cx.in(n, 1), x.dtype, t, d);
         std::string xc = cx.binary("stablehlo.subtract", xv, bn_chan(cx, n, 2, t, d), t, d);
         std::string s = cx.reduce(cx.binary("stablehlo.multiply", gv, xc, t, d), t, d, bn_axes(x.rank()),
                                   "stablehlo.add", 0);
         const Node& inv = *n.operands[3];
         std::string r = cx.binary("stablehlo.multiply", s, cx.convert(cx.in(n, 3), inv.dtype, t, c), t, c);
         return cx.convert(r, t, n.dtype, c);
       });

}  // namespace
}  // namespace txc

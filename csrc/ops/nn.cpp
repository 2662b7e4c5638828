// Fused neural-network ops, forward and backward (one node each, several
// StableHLO ops when lowered): softmax / log_softmax, layer norm, RMS norm,
// nll loss, scaled dot-product attention, embedding (gather), mse loss,
// binary cross-entropy with logits. Half-precision inputs compute in f32.
// Ops with several torch outputs (layer norm's out/mean/rstd, attention's
// out/logsumexp, ...) are one node per output, chosen by a `which`
// attribute; XLA merges the shared work when it compiles the graph.
// Optional operands (weight, bias, mask) are announced by has_* attributes.
// Reductions: 0 none, 1 mean, 2 sum (torch's Reduction enum).
#include <cmath>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

DType compute_t(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

Dims range(int64_t a, int64_t b) {
  Dims d;
  for (int64_t i = a; i < b; ++i) d.push_back(i);
  return d;
}

bool contains(const Dims& d, int64_t v) {
  for (auto x : d) if (x == v) return true;
  return false;
}

Dims drop(const Dims& d, const Dims& axes) {
  Dims r;
  for (int64_t i = 0; i < int64_t(d.size()); ++i) if (!contains(axes, i)) r.push_back(d[i]);
  return r;
}

Dims keep1(const Dims& d, const Dims& axes) {
  Dims r = d;
  for (auto a : axes) r[a] = 1;
  return r;
}

// Arithmetic on values of one dtype, any shape.
struct K {
  LowerCtx& cx;
  DType t;
  std::string ty(const Dims& d) const { return LowerCtx::type(t, d); }
  std::string b(const char* op, const std::string& x, const std::string& y, const Dims& d) {
    return cx.op(op, {x, y}, {ty(d), ty(d)}, ty(d));
  }
  std::string u(const char* op, const std::string& x, const Dims& d) { return cx.op(op, {x}, {ty(d)}, ty(d)); }
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
  std::string cmp(const std::string& x, const std::string& y, const Dims& d, const char* dir, DType ct) {
    std::string tt = LowerCtx::type(ct, d);
    const char* k = is_floating(ct) ? "FLOAT" : (is_unsigned(ct) || is_bool(ct)) ? "UNSIGNED" : "SIGNED";
    return cx.op("stablehlo.compare", {x, y}, {tt, tt}, LowerCtx::type(DType::Bool, d),
                 std::string("compare_type = #stablehlo<comparison_type ") + k +
                     ">, comparison_direction = #stablehlo<comparison_direction " + dir + ">");
  }
  std::string eq(const std::string& x, const std::string& y, const Dims& d) { return cmp(x, y, d, "EQ", t); }
  std::string sel(const std::string& p, const std::string& x, const std::string& y, const Dims& d) {
    return cx.op("stablehlo.select", {p, x, y}, {LowerCtx::type(DType::Bool, d), ty(d), ty(d)}, ty(d));
  }
  // Operand i of n in this dtype, broadcast (trailing alignment) to d.
  std::string in(const Node& n, size_t i, const Dims& d) { return cx.coerce(n, i, t, d); }
};

std::string dot(LowerCtx& cx, DType t, const std::string& a, const Dims& ad, const std::string& b, const Dims& bd,
                const Dims& lb, const Dims& rb, const Dims& lc, const Dims& rc, const Dims& out) {
  auto list = [](const Dims& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  };
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  if (!lb.empty()) dn += "lhs_batching_dimensions = " + list(lb) + ", rhs_batching_dimensions = " + list(rb) + ", ";
  dn += "lhs_contracting_dimensions = " + list(lc) + ", rhs_contracting_dimensions = " + list(rc) + ">" +
        precision_config(t);
  return cx.op("stablehlo.dot_general", {a, b}, {LowerCtx::type(t, ad), LowerCtx::type(t, bd)},
               LowerCtx::type(t, out), dn);
}

void need_float(const Node& n, const Node& x, const char* what) {
  if (!is_floating(x.dtype))
    op_error(n, std::string("expected a floating-point ") + what + ", got " + dtype_name(x.dtype));
}

// ---- softmax -------------------------------------------------------------
// softmax(x; dim, log, out_dtype, safe): safe rows of all -inf give 0 (_safe_softmax).
TXC_OP("softmax", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         need_float(n, x, "input");
         norm_dim(n, n.attr_int(0), x.rank());
         n.dtype = DType(n.attr_int(2));
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Dims d = x.dims, ax = d.empty() ? Dims{} : Dims{norm_dim(n, n.attr_int(0), x.rank())};
         DType ct = compute_t(promote_types(x.dtype, n.dtype));
         K k{cx, ct};
         std::string v = k.in(n, 0, d);
         std::string m = k.back(k.max(v, d, ax), d, ax);
         std::string s = k.sub(v, m, d);
         std::string e = k.u("stablehlo.exponential", s, d);
         std::string z = k.back(k.sum(e, d, ax), d, ax);
         std::string r = n.attr_int(1) ? k.sub(s, k.u("stablehlo.log", z, d), d) : k.div(e, z, d);
         if (n.attr_int(3)) r = k.sel(k.eq(m, k.c(-INFINITY, d), d), k.c(0, d), r, d);
         return cx.convert(r, ct, n.dtype, d);
       });

// softmax_backward(grad, y; dim, log, out_dtype)
TXC_OP("softmax_backward", 2,
       [](Node& n) {
         const Node &g = *n.operands[0], &y = *n.operands[1];
         if (g.dims != y.dims) op_error(n, "grad and output shapes differ: " + dims_str(g.dims) + " vs " + dims_str(y.dims));
         norm_dim(n, n.attr_int(0), y.rank());
         n.dtype = DType(n.attr_int(2));
         n.dims = y.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         Dims d = n.dims, ax = d.empty() ? Dims{} : Dims{norm_dim(n, n.attr_int(0), n.rank())};
         DType ct = compute_t(promote_types(n.operands[1]->dtype, n.dtype));
         K k{cx, ct};
         std::string g = k.in(n, 0, d), y = k.in(n, 1, d), r;
         if (n.attr_int(1)) {
           r = k.sub(g, k.mul(k.u("stablehlo.exponential", y, d), k.back(k.sum(g, d, ax), d, ax), d), d);
         } else {
           std::string gy = k.back(k.sum(k.mul(g, y, d), d, ax), d, ax);
           r = k.mul(y, k.sub(g, gy, d), d);
         }
         return cx.convert(r, ct, n.dtype, d);
       });

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
         DType ct = compute_t(x.dtype);
         K k{cx, ct};
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

// layer_norm_backward(grad, x, mean, rstd, [w]; axis, which, has_w, out_dtype)
// which: 0 grad_input, 1 grad_weight, 2 grad_bias
TXC_OP("layer_norm_backward", -1,
       [](Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         int64_t axis = norm_axis(n, x);
         if (g.dims != x.dims) op_error(n, "grad and input shapes differ: " + dims_str(g.dims) + " vs " + dims_str(x.dims));
         Dims sd = keep1(x.dims, range(axis, x.rank()));
         if (n.operands[2]->dims != sd || n.operands[3]->dims != sd)
           op_error(n, "mean/rstd must have shape " + dims_str(sd));
         if (int(n.operands.size()) != 4 + n.attr_int(2)) op_error(n, "wrong number of operands");
         check_affine(n, x, axis, 4, int(n.attr_int(2)), "weight");
         n.dtype = DType(n.attr_int(3));
         n.dims = n.attr_int(1) == 0 ? x.dims : Dims(x.dims.begin() + axis, x.dims.end());
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[1];
         int64_t axis = n.attr_int(0);
         Dims d = x.dims, ax = range(axis, x.rank()), bx = range(0, axis), rd = drop(d, ax);
         DType ct = compute_t(x.dtype);
         K k{cx, ct};
         std::string g = k.in(n, 0, d);
         int64_t which = n.attr_int(1);
         if (which == 2) return cx.convert(k.sum(g, d, bx), ct, n.dtype, n.dims);
         std::string xhat = k.mul(k.sub(k.in(n, 1, d), k.in(n, 2, d), d), k.in(n, 3, d), d);
         if (which == 1) return cx.convert(k.sum(k.mul(g, xhat, d), d, bx), ct, n.dtype, n.dims);
         double cnt = 1;
         for (auto a : ax) cnt *= double(d[a]);
         std::string dx = n.attr_int(2) ? k.mul(g, k.in(n, 4, d), d) : g;
         std::string a = k.back(k.div(k.sum(dx, d, ax), k.c(cnt, rd), rd), d, ax);
         std::string b = k.back(k.div(k.sum(k.mul(dx, xhat, d), d, ax), k.c(cnt, rd), rd), d, ax);
         std::string r = k.mul(k.in(n, 3, d), k.sub(k.sub(dx, a, d), k.mul(xhat, b, d), d), d);
         return cx.convert(r, ct, n.dtype, d);
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
         n.dtype = out ? x.dtype : compute_t(x.dtype);
         n.dims = out ? x.dims : keep1(x.dims, range(axis, x.rank()));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Dims d = x.dims, ax = range(n.attr_int(0), x.rank()), rd = drop(d, ax);
         double cnt = 1;
         for (auto a : ax) cnt *= double(d[a]);
         DType ct = compute_t(x.dtype);
         K k{cx, ct};
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
       [](Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1];
         int64_t axis = norm_axis(n, x);
         if (g.dims != x.dims) op_error(n, "grad and input shapes differ: " + dims_str(g.dims) + " vs " + dims_str(x.dims));
         Dims sd = keep1(x.dims, range(axis, x.rank()));
         if (n.operands[2]->dims != sd) op_error(n, "rstd must have shape " + dims_str(sd));
         if (int(n.operands.size()) != 3 + n.attr_int(2)) op_error(n, "wrong number of operands");
         check_affine(n, x, axis, 3, int(n.attr_int(2)), "weight");
         n.dtype = DType(n.attr_int(3));
         n.dims = n.attr_int(1) == 0 ? x.dims : Dims(x.dims.begin() + axis, x.dims.end());
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[1];
         int64_t axis = n.attr_int(0);
         Dims d = x.dims, ax = range(axis, x.rank()), bx = range(0, axis), rd = drop(d, ax);
         DType ct = compute_t(x.dtype);
         K k{cx, ct};
         std::string g = k.in(n, 0, d), rstd = k.in(n, 2, d);
         std::string xhat = k.mul(k.in(n, 1, d), rstd, d);
         if (n.attr_int(1) == 1) return cx.convert(k.sum(k.mul(g, xhat, d), d, bx), ct, n.dtype, n.dims);
         double cnt = 1;
         for (auto a : ax) cnt *= double(d[a]);
         std::string dx = n.attr_int(2) ? k.mul(g, k.in(n, 3, d), d) : g;
         std::string b = k.back(k.div(k.sum(k.mul(dx, xhat, d), d, ax), k.c(cnt, rd), rd), d, ax);
         return cx.convert(k.mul(rstd, k.sub(dx, k.mul(xhat, b, d), d), d), ct, n.dtype, d);
       });

// ---- nll loss ---------------------------------------------------------------
// Input (C) with target (), or (N, C, d1, ...) with target (N, d1, ...).
int64_t class_dim(const Node& x) { return x.rank() >= 2 ? 1 : 0; }

void check_nll(const Node& n, const Node& x, const Node& t, const Node* w) {
  need_float(n, x, "input");
  if (!is_integral(t.dtype)) op_error(n, std::string("expected target of an integer dtype, got ") + dtype_name(t.dtype));
  if (x.rank() < 1) op_error(n, "input tensor should be 1D or more, got a 0-d tensor");
  Dims want = drop(x.dims, {class_dim(x)});
  if (t.dims != want) {
    if (x.rank() >= 2 && !t.dims.empty() && t.dims[0] != x.dims[0])
      op_error(n, "Expected input batch_size (" + std::to_string(x.dims[0]) + ") to match target batch_size (" +
                      std::to_string(t.dims[0]) + ").");
    op_error(n, "expected target of shape " + dims_str(want) + " for input of shape " + dims_str(x.dims) + ", got " +
                    dims_str(t.dims));
  }
  if (w && (w->rank() != 1 || w->dims[0] != x.dims[class_dim(x)]))
    op_error(n, "weight tensor should be defined either for all " + std::to_string(x.dims[class_dim(x)]) +
                    " classes or no classes but got weight tensor of shape: " + dims_str(w->dims));
}

// one-hot of target over the class dim (bool, x's dims), and per-element
// weight (target dims; 0 where target == ignore_index).
struct NllPieces {
  std::string hot, wt;
};
NllPieces nll_pieces(K& k, const Node& n, size_t xi, size_t ti, int64_t wi, int64_t ignore) {
  LowerCtx& cx = k.cx;
  const Node &x = *n.operands[xi], &t = *n.operands[ti];
  Dims d = x.dims, td = t.dims;
  int64_t cd = class_dim(x);
  std::string ti64 = cx.convert(cx.in(n, ti), t.dtype, DType::I64, td);
  Dims map;
  for (int64_t i = 0; i < x.rank(); ++i) if (i != cd) map.push_back(i);
  std::string tb = cx.broadcast_in_dim(ti64, DType::I64, td, d, map);
  std::string io = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, d),
                         "iota_dimension = " + std::to_string(cd) + " : i64");
  NllPieces p;
  p.hot = k.cmp(io, tb, d, "EQ", DType::I64);
  std::string wt;
  if (wi >= 0) {
    std::string w = cx.convert(cx.in(n, wi), n.operands[wi]->dtype, k.t, {d[cd]});
    std::string wb = cx.broadcast_in_dim(w, k.t, {d[cd]}, d, {cd});
    wt = k.sum(k.sel(p.hot, wb, k.c(0, d), d), d, {cd});
  } else {
    wt = k.c(1, td);
  }
  std::string valid = k.cmp(ti64, cx.constant(double(ignore), DType::I64, td), td, "NE", DType::I64);
  p.wt = k.sel(valid, wt, k.c(0, td), td);
  return p;
}

// nll_loss(x, target, [w]; reduction, ignore_index, which, has_w) which: 0 output, 1 total_weight
TXC_OP("nll_loss", -1,
       [](Node& n) {
         const Node &x = *n.operands[0], &t = *n.operands[1];
         if (int(n.operands.size()) != 2 + n.attr_int(3)) op_error(n, "wrong number of operands");
         check_nll(n, x, t, n.attr_int(3) ? n.operands[2].get() : nullptr);
         n.dtype = x.dtype;
         n.dims = (n.attr_int(2) == 0 && n.attr_int(0) == 0) ? t.dims : Dims{};
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &x = *n.operands[0], &t = *n.operands[1];
         Dims d = x.dims, td = t.dims, all = range(0, int64_t(td.size()));
         DType ct = x.dtype;
         K k{cx, ct};
         NllPieces p = nll_pieces(k, n, 0, 1, n.attr_int(3) ? 2 : -1, n.attr_int(1));
         int64_t red = n.attr_int(0);
         if (n.attr_int(2) == 1) return red == 0 ? k.c(0, {}) : k.sum(p.wt, td, all);
         std::string picked = k.sum(k.sel(p.hot, cx.in(n, 0), k.c(0, d), d), d, {class_dim(x)});
         std::string loss = k.mul(k.u("stablehlo.negate", picked, td), p.wt, td);
         if (red == 0) return loss;
         std::string s = k.sum(loss, td, all);
         return red == 2 ? s : k.div(s, k.sum(p.wt, td, all), {});
       });

// nll_loss_backward(grad, x, target, total_weight, [w]; reduction, ignore_index, has_w)
TXC_OP("nll_loss_backward", -1,
       [](Node& n) {
         const Node &g = *n.operands[0], &x = *n.operands[1], &t = *n.operands[2];
         if (int(n.operands.size()) != 4 + n.attr_int(2)) op_error(n, "wrong number of operands");
         check_nll(n, x, t, n.attr_int(2) ? n.operands[4].get() : nullptr);
         if (n.attr_int(0) == 0 ? g.dims != t.dims : g.rank() != 0)
           op_error(n, "grad of shape " + dims_str(g.dims) + " does not fit the loss");
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &x = *n.operands[1], &t = *n.operands[2];
         Dims d = x.dims, td = t.dims;
         int64_t cd = class_dim(x);
         K k{cx, x.dtype};
         NllPieces p = nll_pieces(k, n, 1, 2, n.attr_int(2) ? 4 : -1, n.attr_int(1));
         int64_t red = n.attr_int(0);
         std::string g = k.in(n, 0, red == 0 ? td : Dims{});
         std::string scale = red == 0 ? k.mul(g, p.wt, td) : k.mul(k.cx.broadcast(g, x.dtype, {}, td), p.wt, td);
         if (red == 1) scale = k.div(scale, k.in(n, 3, td), td);
         Dims map;
         for (int64_t i = 0; i < x.rank(); ++i) if (i != cd) map.push_back(i);
         std::string sb = cx.broadcast_in_dim(k.u("stablehlo.negate", scale, td), x.dtype, td, d, map);
         return k.sel(p.hot, sb, k.c(0, d), d);
       });

// ---- scaled dot-product attention -------------------------------------------
// q (B..., Hq, L, E), k (B..., Hk, S, E), v (B..., Hk, S, Ev); Hq = G * Hk
// (grouped-query attention when G > 1). Inside, q is viewed as
// (B..., Hk, G, L, E) so every product is one dot_general over batch (B..., Hk).
// mask: bool (true = attend) or float (added), broadcastable to (B..., Hq, L, S).
struct Attn {
  Dims kb;        // batch dims of k: (B..., Hk)
  int64_t nb, G, L, S, E, Ev;
  Dims q5, s5, o5, lse5;  // kb + [G, L, E] / [G, L, S] / [G, L, Ev] / [G, L]
  Dims full_s;    // q batch dims + [L, S]
};

Attn attn_dims(const Node& n, const Node& q, const Node& k, const Node& v) {
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    op_error(n, "expected query, key and value of the same rank >= 2, got " + dims_str(q.dims) + ", " +
                    dims_str(k.dims) + ", " + dims_str(v.dims));
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    op_error(n, std::string("expected query, key and value to have the same dtype, but got query.dtype: ") +
                    dtype_name(q.dtype) + " key.dtype: " + dtype_name(k.dtype) + " and value.dtype: " +
                    dtype_name(v.dtype) + " instead.");
  need_float(n, q, "query");
  int r = q.rank();
  Attn a;
  a.L = q.dims[r - 2];
  a.E = q.dims[r - 1];
  a.S = k.dims[r - 2];
  a.Ev = v.dims[r - 1];
  if (k.dims[r - 1] != a.E) op_error(n, "query and key embedding sizes differ: " + dims_str(q.dims) + " vs " + dims_str(k.dims));
  if (v.dims[r - 2] != a.S) op_error(n, "key and value sequence lengths differ: " + dims_str(k.dims) + " vs " + dims_str(v.dims));
  a.kb = Dims(k.dims.begin(), k.dims.end() - 2);
  if (Dims(v.dims.begin(), v.dims.end() - 2) != a.kb)
    op_error(n, "key and value batch/head dims differ: " + dims_str(k.dims) + " vs " + dims_str(v.dims));
  a.nb = int64_t(a.kb.size());
  a.G = 1;
  for (int i = 0; i < r - 2; ++i) {
    int64_t qd = q.dims[i], kd = k.dims[i];
    if (i == r - 3 && qd != kd && kd > 0 && qd % kd == 0) {
      a.G = qd / kd;
    } else if (qd != kd) {
      op_error(n, "query " + dims_str(q.dims) + " and key " + dims_str(k.dims) +
                      " batch/head dims differ (grouped-query attention needs query heads to be a multiple of "
                      "key heads)");
    }
  }
  a.q5 = a.kb, a.s5 = a.kb, a.o5 = a.kb, a.lse5 = a.kb;
  a.q5.insert(a.q5.end(), {a.G, a.L, a.E});
  a.s5.insert(a.s5.end(), {a.G, a.L, a.S});
  a.o5.insert(a.o5.end(), {a.G, a.L, a.Ev});
  a.lse5.insert(a.lse5.end(), {a.G, a.L});
  a.full_s = Dims(q.dims.begin(), q.dims.end() - 2);
  a.full_s.insert(a.full_s.end(), {a.L, a.S});
  return a;
}

void check_mask(const Node& n, const Attn& a, const Node& m) {
  const Dims& f = a.full_s;
  bool ok = m.rank() <= int(f.size());
  for (int i = 0; ok && i < m.rank(); ++i) {
    int64_t md = m.dims[m.rank() - 1 - i], fd = f[f.size() - 1 - i];
    ok = md == fd || md == 1;
  }
  if (!ok) op_error(n, "attn_mask of shape " + dims_str(m.dims) + " does not broadcast to " + dims_str(f));
  if (!is_bool(m.dtype) && !is_floating(m.dtype))
    op_error(n, std::string("expected attn_mask of dtype bool or float, got ") + dtype_name(m.dtype));
}

// Masked, scaled scores (a.s5) in compute type ct.
std::string attn_scores(K& k, const Node& n, const Attn& a, const std::string& q5, int64_t mi) {
  LowerCtx& cx = k.cx;
  DType ct = k.t;
  Dims kd = a.kb;
  kd.insert(kd.end(), {a.S, a.E});
  std::string kk = cx.convert(cx.in(n, 1), n.operands[1]->dtype, ct, kd);
  int64_t nb = a.nb;
  std::string s = dot(cx, ct, q5, a.q5, kk, kd, range(0, nb), range(0, nb), {nb + 2}, {nb + 1}, a.s5);
  s = k.mul(s, k.c(n.attr_float(0), a.s5), a.s5);
  if (mi >= 0) {
    const Node& m = *n.operands[mi];
    std::string mv = cx.broadcast(cx.in(n, mi), m.dtype, m.dims, a.full_s);
    mv = cx.reshape(mv, m.dtype, a.full_s, a.s5);
    if (is_bool(m.dtype)) s = k.sel(mv, s, k.c(-INFINITY, a.s5), a.s5);
    else s = k.add(s, cx.convert(mv, m.dtype, ct, a.s5), a.s5);
  }
  if (n.attr_int(1)) {  // causal: key j attends for query i when j <= i (top-left aligned)
    int64_t r = int64_t(a.s5.size());
    std::string i = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, a.s5), "iota_dimension = " + std::to_string(r - 2) + " : i64");
    std::string j = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, a.s5), "iota_dimension = " + std::to_string(r - 1) + " : i64");
    s = k.sel(k.cmp(j, i, a.s5, "LE", DType::I64), s, k.c(-INFINITY, a.s5), a.s5);
  }
  return s;
}

std::string attn_q5(LowerCtx& cx, const Node& n, const Attn& a, DType ct) {
  const Node& q = *n.operands[0];
  return cx.reshape(cx.convert(cx.in(n, 0), q.dtype, ct, q.dims), ct, q.dims, a.q5);
}

std::string attn_v(LowerCtx& cx, const Node& n, DType ct) {
  const Node& v = *n.operands[2];
  return cx.convert(cx.in(n, 2), v.dtype, ct, v.dims);
}

// sdpa(q, k, v, [mask]; scale, causal, which, has_mask) which: 0 out, 1 logsumexp (f32, q dims[:-1])
TXC_OP("sdpa", -1,
       [](Node& n) {
         if (int(n.operands.size()) != 3 + n.attr_int(3)) op_error(n, "wrong number of operands");
         const Node &q = *n.operands[0];
         Attn a = attn_dims(n, q, *n.operands[1], *n.operands[2]);
         if (n.attr_int(3)) check_mask(n, a, *n.operands[3]);
         n.dims = Dims(q.dims.begin(), q.dims.end() - 1);
         if (n.attr_int(2) == 0) {
           n.dtype = q.dtype;
           n.dims.push_back(a.Ev);
         } else {
           n.dtype = compute_t(q.dtype);
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& q = *n.operands[0];
         Attn a = attn_dims(n, q, *n.operands[1], *n.operands[2]);
         DType ct = compute_t(q.dtype);
         K k{cx, ct};
         int64_t nb = a.nb, last = nb + 2;
         std::string s = attn_scores(k, n, a, attn_q5(cx, n, a, ct), n.attr_int(3) ? 3 : -1);
         std::string m = k.max(s, a.s5, {last});
         std::string m0 = k.sel(k.eq(m, k.c(-INFINITY, a.lse5), a.lse5), k.c(0, a.lse5), m, a.lse5);
         std::string e = k.u("stablehlo.exponential", k.sub(s, k.back(m0, a.s5, {last}), a.s5), a.s5);
         std::string l = k.sum(e, a.s5, {last});
         if (n.attr_int(2) == 1) {
           std::string lse = k.add(m0, k.u("stablehlo.log", l, a.lse5), a.lse5);
           return cx.reshape(lse, ct, a.lse5, n.dims);
         }
         Dims vd = a.kb;
         vd.insert(vd.end(), {a.S, a.Ev});
         std::string o = dot(cx, ct, e, a.s5, attn_v(cx, n, ct), vd, range(0, nb), range(0, nb), {last}, {nb}, a.o5);
         std::string l1 = k.sel(k.eq(l, k.c(0, a.lse5), a.lse5), k.c(1, a.lse5), l, a.lse5);
         o = k.div(o, k.back(l1, a.o5, {last}), a.o5);
         return cx.convert(cx.reshape(o, ct, a.o5, n.dims), ct, n.dtype, n.dims);
       });

// sdpa_backward(q, k, v, grad, out, lse, [mask]; scale, causal, which, has_mask)
// which: 0 grad_q, 1 grad_k, 2 grad_v, 3 grad_mask (float masks; summed to the mask's shape)
TXC_OP("sdpa_backward", -1,
       [](Node& n) {
         if (int(n.operands.size()) != 6 + n.attr_int(3)) op_error(n, "wrong number of operands");
         const Node &q = *n.operands[0];
         Attn a = attn_dims(n, q, *n.operands[1], *n.operands[2]);
         Dims od = Dims(q.dims.begin(), q.dims.end() - 1);
         if (n.operands[5]->dims != od) op_error(n, "logsumexp must have shape " + dims_str(od));
         od.push_back(a.Ev);
         if (n.operands[3]->dims != od || n.operands[4]->dims != od)
           op_error(n, "grad_out and out must have shape " + dims_str(od));
         if (n.attr_int(3)) check_mask(n, a, *n.operands[6]);
         int64_t which = n.attr_int(2);
         if (which == 3 && !n.attr_int(3)) op_error(n, "no mask to differentiate");
         const Node& src = *n.operands[which == 3 ? 6 : which];
         n.dtype = src.dtype;
         n.dims = src.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& q = *n.operands[0];
         Attn a = attn_dims(n, q, *n.operands[1], *n.operands[2]);
         DType ct = compute_t(q.dtype);
         K k{cx, ct};
         int64_t nb = a.nb, last = nb + 2, which = n.attr_int(2);
         Dims B = range(0, nb);
         std::string q5 = attn_q5(cx, n, a, ct);
         std::string s = attn_scores(k, n, a, q5, n.attr_int(3) ? 6 : -1);
         std::string lse = cx.reshape(cx.convert(cx.in(n, 5), n.operands[5]->dtype, ct, n.operands[5]->dims), ct,
                                      n.operands[5]->dims, a.lse5);
         lse = k.sel(k.eq(lse, k.c(-INFINITY, a.lse5), a.lse5), k.c(INFINITY, a.lse5), lse, a.lse5);
         std::string p = k.u("stablehlo.exponential", k.sub(s, k.back(lse, a.s5, {last}), a.s5), a.s5);
         const Node& go = *n.operands[3];
         std::string g5 = cx.reshape(cx.convert(cx.in(n, 3), go.dtype, ct, go.dims), ct, go.dims, a.o5);
         Dims vd = a.kb;
         vd.insert(vd.end(), {a.S, a.Ev});
         if (which == 2) {
           std::string dv = dot(cx, ct, p, a.s5, g5, a.o5, B, B, {nb, nb + 1}, {nb, nb + 1}, vd);
           return cx.convert(dv, ct, n.dtype, n.dims);
         }
         std::string dp = dot(cx, ct, g5, a.o5, attn_v(cx, n, ct), vd, B, B, {last}, {nb + 1}, a.s5);
         const Node& out = *n.operands[4];
         std::string o5 = cx.reshape(cx.convert(cx.in(n, 4), out.dtype, ct, out.dims), ct, out.dims, a.o5);
         std::string D = k.sum(k.mul(g5, o5, a.o5), a.o5, {last});
         std::string ds = k.mul(p, k.sub(dp, k.back(D, a.s5, {last}), a.s5), a.s5);  // d(scores incl. mask)
         if (which == 3) {
           const Node& m = *n.operands[6];
           const Dims& f = a.full_s;
           std::string r = cx.reshape(ds, ct, a.s5, f);
           Dims axes;
           size_t off = f.size() - m.dims.size();
           for (size_t i = 0; i < f.size(); ++i)
             if (i < off || (m.dims[i - off] == 1 && f[i] != 1)) axes.push_back(int64_t(i));
           r = k.sum(r, f, axes);
           return cx.convert(cx.reshape(r, ct, drop(f, axes), m.dims), ct, n.dtype, n.dims);
         }
         ds = k.mul(ds, k.c(n.attr_float(0), a.s5), a.s5);
         if (which == 0) {
           Dims kd = a.kb;
           kd.insert(kd.end(), {a.S, a.E});
           std::string kk = cx.convert(cx.in(n, 1), n.operands[1]->dtype, ct, kd);
           std::string dq = dot(cx, ct, ds, a.s5, kk, kd, B, B, {last}, {nb}, a.q5);
           return cx.convert(cx.reshape(dq, ct, a.q5, q.dims), ct, n.dtype, n.dims);
         }
         Dims kd = a.kb;
         kd.insert(kd.end(), {a.S, a.E});
         std::string dk = dot(cx, ct, ds, a.s5, q5, a.q5, B, B, {nb, nb + 1}, {nb, nb + 1}, kd);
         return cx.convert(dk, ct, n.dtype, n.dims);
       });

// ---- embedding --------------------------------------------------------------
// embedding(weight, indices): rows of weight (V, D) -> indices.dims + [D].
TXC_OP("embedding", 2,
       [](Node& n) {
         const Node &w = *n.operands[0], &i = *n.operands[1];
         if (w.rank() != 2) op_error(n, "'weight' must be 2-D, got shape " + dims_str(w.dims));
         if (i.dtype != DType::I64 && i.dtype != DType::I32)
           op_error(n, std::string("Expected tensor for argument #1 'indices' to have one of the following scalar "
                                   "types: Long, Int; but got ") + dtype_name(i.dtype) + " instead");
         n.dtype = w.dtype;
         n.dims = i.dims;
         n.dims.push_back(w.dims[1]);
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &w = *n.operands[0], &i = *n.operands[1];
         int64_t r = i.rank();
         std::string dn = "dimension_numbers = #stablehlo.gather<offset_dims = [" + std::to_string(r) +
                          "], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = " +
                          std::to_string(r) + ">, indices_are_sorted = false, slice_sizes = array<i64: 1, " +
                          std::to_string(w.dims[1]) + ">";
         return cx.op("stablehlo.gather", {cx.in(n, 0), cx.in(n, 1)}, {LowerCtx::type(w), LowerCtx::type(i)},
                      LowerCtx::type(n), dn);
       });

// ---- elementwise losses -----------------------------------------------------
Dims loss_dims(Node& n, const Node& x, const Node& y) {
  need_float(n, x, "input");
  Dims d = broadcast_dims(n, x.dims, y.dims);
  n.dtype = promote_types(x.dtype, y.dtype);
  return d;
}

std::string reduce_loss(K& k, const std::string& l, const Dims& d, int64_t red) {
  if (red == 0) return l;
  std::string s = k.sum(l, d, range(0, int64_t(d.size())));
  if (red == 2) return s;
  double cnt = 1;
  for (auto x : d) cnt *= double(x);
  return k.div(s, k.c(cnt, {}), {});
}

// mse_loss(x, y; reduction)
TXC_OP("mse_loss", 2,
       [](Node& n) {
         Dims d = loss_dims(n, *n.operands[0], *n.operands[1]);
         n.dims = n.attr_int(0) == 0 ? d : Dims{};
       },
       [](LowerCtx& cx, const Node& n) {
         Dims d = broadcast_dims(n, n.operands[0]->dims, n.operands[1]->dims);
         K k{cx, n.dtype};
         std::string e = k.sub(k.in(n, 0, d), k.in(n, 1, d), d);
         return reduce_loss(k, k.mul(e, e, d), d, n.attr_int(0));
       });

// mse_loss_backward(grad, x, y; reduction) -> broadcast(x, y) shape
TXC_OP("mse_loss_backward", 3,
       [](Node& n) {
         n.dims = loss_dims(n, *n.operands[1], *n.operands[2]);
         const Node& g = *n.operands[0];
         if (n.attr_int(0) == 0 ? g.dims != n.dims : g.rank() != 0)
           op_error(n, "grad of shape " + dims_str(g.dims) + " does not fit the loss");
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims& d = n.dims;
         K k{cx, n.dtype};
         double c = 2;
         if (n.attr_int(0) == 1) {
           double cnt = 1;
           for (auto x : d) cnt *= double(x);
           c /= cnt;
         }
         std::string e = k.sub(k.in(n, 1, d), k.in(n, 2, d), d);
         return k.mul(k.mul(e, k.c(c, d), d), k.in(n, 0, d), d);
       });

// bce_logits(x, y, [w], [pos_weight]; reduction, has_w, has_pw)
TXC_OP("bce_logits", -1,
       [](Node& n) {
         if (int(n.operands.size()) != 2 + n.attr_int(1) + n.attr_int(2)) op_error(n, "wrong number of operands");
         const Node &x = *n.operands[0], &y = *n.operands[1];
         if (x.dims != y.dims)
           op_error(n, "Target size (" + dims_str(y.dims) + ") must be the same as input size (" + dims_str(x.dims) + ")");
         Dims d = loss_dims(n, x, y);
         for (size_t i = 2; i < n.operands.size(); ++i) broadcast_dims(n, d, n.operands[i]->dims);
         n.dims = n.attr_int(0) == 0 ? d : Dims{};
       },
       [](LowerCtx& cx, const Node& n) {
         Dims d = n.operands[0]->dims;
         K k{cx, n.dtype};
         std::string x = k.in(n, 0, d), y = k.in(n, 1, d);
         // log(1 + exp(-|x|)) + max(-x, 0) = -log(sigmoid(x)), stable
         std::string nx = k.u("stablehlo.negate", x, d);
         std::string sp = k.add(k.u("stablehlo.log_plus_one", k.u("stablehlo.exponential", k.u("stablehlo.negate", k.u("stablehlo.abs", x, d), d), d), d),
                                k.b("stablehlo.maximum", nx, k.c(0, d), d), d);
         std::string one = k.c(1, d);
         size_t i = 2;
         std::string w = n.attr_int(1) ? k.in(n, i++, d) : "";
         std::string lw = one;
         if (n.attr_int(2)) lw = k.add(k.mul(k.sub(k.in(n, i++, d), one, d), y, d), one, d);
         std::string l = k.add(k.mul(k.sub(one, y, d), x, d), k.mul(lw, sp, d), d);
         if (!w.empty()) l = k.mul(l, w, d);
         return reduce_loss(k, l, d, n.attr_int(0));
       });

}  // namespace
}  // namespace txc

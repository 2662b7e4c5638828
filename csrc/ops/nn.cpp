// Fused neural-network ops, forward and backward (one node each, several
// StableHLO ops when lowered): softmax / log_softmax, nll loss, embedding
// (gather), mse loss, binary cross-entropy with logits. Half-precision inputs
// compute in f32. Ops with several torch outputs are one node per output,
// chosen by a `which` attribute; XLA merges the shared work when it compiles
// the graph. Optional operands (weight, bias) are announced by has_*
// attributes. Reductions: 0 none, 1 mean, 2 sum (torch's Reduction enum).
// Normalization layers: ops/norm.cpp; attention: ops/attention.cpp.
#include <cmath>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"

namespace txc {
namespace {

using namespace arith;

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
         DType ct = float_compute_dtype(promote_types(x.dtype, n.dtype));
         Arith k{cx, ct};
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
         DType ct = float_compute_dtype(promote_types(n.operands[1]->dtype, n.dtype));
         Arith k{cx, ct};
         std::string g = k.in(n, 0, d), y = k.in(n, 1, d), r;
         if (n.attr_int(1)) {
           r = k.sub(g, k.mul(k.u("stablehlo.exponential", y, d), k.back(k.sum(g, d, ax), d, ax), d), d);
         } else {
           std::string gy = k.back(k.sum(k.mul(g, y, d), d, ax), d, ax);
           r = k.mul(y, k.sub(g, gy, d), d);
         }
         return cx.convert(r, ct, n.dtype, d);
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
NllPieces nll_pieces(Arith& k, const Node& n, size_t xi, size_t ti, int64_t wi, int64_t ignore) {
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
         Arith k{cx, ct};
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
         Arith k{cx, x.dtype};
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

std::string reduce_loss(Arith& k, const std::string& l, const Dims& d, int64_t red) {
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
         Arith k{cx, n.dtype};
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
         Arith k{cx, n.dtype};
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
         Arith k{cx, n.dtype};
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

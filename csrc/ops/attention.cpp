// Scaled dot-product attention, forward (output and logsumexp, one node per
// output chosen by a `which` attribute) and backward (one node per gradient),
// with grouped-query heads and causal or explicit (bool or additive) masks,
// as dot_general products (ops/dot.h). Half-precision (bf16/f16) inputs
// compute as the fused kernels do (FlashAttention-2, cuDNN, torch's CPU flash
// kernel, jax's dot_product_attention): every product takes operands in the
// input dtype and returns float32 (preferred element type), the scores stay
// float32 through the scale, mask and softmax, and only what feeds a product
// is rounded to the input dtype: the unnormalised probabilities for p.v
// (normalised after it, in float32), dS for the dQ/dK products. Rounding
// the scores themselves would cost e^(score's ulp) on a weight: 2 at 600.
// The backward's D (dS = P (dP - D)) is rowsum(P dP) of the float32 values,
// not rowsum(dO out) of the rounded output, whose rounding stays in dS where
// the softmax is peaked (dQ/dK of OpInfo's bf16 samples: 15x bf16 tolerance).
#include <cmath>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/dot.h"
#include "ops/registry.h"

namespace txc {
namespace {

using namespace arith;

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

// Masked, scaled scores (a.s5) in compute type ct: q5 (in q's dtype) . k^T,
// one product with a ct result.
std::string attn_scores(Arith& k, const Node& n, const Attn& a, const std::string& q5, int64_t mi) {
  LowerCtx& cx = k.cx;
  DType ct = k.t, io = n.operands[0]->dtype;
  Dims kd = a.kb;
  kd.insert(kd.end(), {a.S, a.E});
  int64_t nb = a.nb;
  Dims B = range(0, nb);
  std::string s = dot_general(cx, io, q5, a.q5, cx.in(n, 1), kd, {B, B, {nb + 2}, {nb + 1}}, ct, a.s5);
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

// q viewed as (B..., Hk, G, L, E), in its own dtype (the products' operand dtype).
std::string attn_q5(LowerCtx& cx, const Node& n, const Attn& a) {
  const Node& q = *n.operands[0];
  return cx.reshape(cx.in(n, 0), q.dtype, q.dims, a.q5);
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
           n.dtype = float_compute_dtype(q.dtype);
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& q = *n.operands[0];
         Attn a = attn_dims(n, q, *n.operands[1], *n.operands[2]);
         DType ct = float_compute_dtype(q.dtype);
         Arith k{cx, ct};
         int64_t nb = a.nb, last = nb + 2;
         DType io = q.dtype;
         std::string s = attn_scores(k, n, a, attn_q5(cx, n, a), n.attr_int(3) ? 3 : -1);
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
         // the unnormalised probabilities (at most 1) in the input dtype . v, a ct result normalised there
         // (a fully masked row: l = 0, e = 0, a zero output)
         std::string l1 = k.sel(k.eq(l, k.c(0, a.lse5), a.lse5), k.c(1, a.lse5), l, a.lse5);
         Dims B = range(0, nb);
         std::string o = dot_general(cx, io, cx.convert(e, ct, io, a.s5), a.s5, cx.in(n, 2), vd,
                                     {B, B, {last}, {nb}}, ct, a.o5);
         o = k.div(o, k.back(l1, a.o5, {last}), a.o5);
         return cx.convert(cx.reshape(o, ct, a.o5, n.dims), ct, io, n.dims);
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
         DType ct = float_compute_dtype(q.dtype);
         Arith k{cx, ct};
         int64_t nb = a.nb, last = nb + 2, which = n.attr_int(2);
         Dims B = range(0, nb);
         DType io = q.dtype;
         std::string q5 = attn_q5(cx, n, a);
         std::string s = attn_scores(k, n, a, q5, n.attr_int(3) ? 6 : -1);
         std::string lse = cx.reshape(cx.convert(cx.in(n, 5), n.operands[5]->dtype, ct, n.operands[5]->dims), ct,
                                      n.operands[5]->dims, a.lse5);
         lse = k.sel(k.eq(lse, k.c(-INFINITY, a.lse5), a.lse5), k.c(INFINITY, a.lse5), lse, a.lse5);
         std::string p = k.u("stablehlo.exponential", k.sub(s, k.back(lse, a.s5, {last}), a.s5), a.s5);
         const Node& go = *n.operands[3];
         std::string gi = cx.reshape(cx.convert(cx.in(n, 3), go.dtype, io, go.dims), io, go.dims, a.o5);
         Dims vd = a.kb;
         vd.insert(vd.end(), {a.S, a.Ev});
         if (which == 2) {
           std::string dv = dot_general(cx, io, cx.convert(p, ct, io, a.s5), a.s5, gi, a.o5,
                                        {B, B, {nb, nb + 1}, {nb, nb + 1}}, ct, vd);
           return cx.convert(dv, ct, n.dtype, n.dims);
         }
         std::string dp = dot_general(cx, io, gi, a.o5, cx.in(n, 2), vd, {B, B, {last}, {nb + 1}}, ct, a.s5);
         // dS = P dP - P D with D = rowsum(P dP), from the float32 values (as torch's softmax backward, the
         // math path): rowsum(dO * out) of the rounded output (operand 4, unused now) carries out's rounding,
         // ~2^-9 |dO||out|, which dS keeps where the softmax is peaked (dP - D cancels there). Written as
         // P dP - P D, XLA:CPU computes it as fast as the old D (P (dP - D) was 24% slower)
         std::string pdp = k.mul(p, dp, a.s5);
         std::string D = k.sum(pdp, a.s5, {last});
         std::string ds = k.sub(pdp, k.mul(p, k.back(D, a.s5, {last}), a.s5), a.s5);  // d(scores incl. mask)
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
         // dS (f32) rounded to the input dtype for the dQ/dK products, as FlashAttention-2 does
         ds = cx.convert(k.mul(ds, k.c(n.attr_float(0), a.s5), a.s5), ct, io, a.s5);
         Dims kd = a.kb;
         kd.insert(kd.end(), {a.S, a.E});
         if (which == 0) {
           std::string dq = dot_general(cx, io, ds, a.s5, cx.in(n, 1), kd, {B, B, {last}, {nb}}, ct, a.q5);
           return cx.convert(cx.reshape(dq, ct, a.q5, q.dims), ct, n.dtype, n.dims);
         }
         std::string dk = dot_general(cx, io, ds, a.s5, q5, a.q5, {B, B, {nb, nb + 1}, {nb, nb + 1}}, ct, kd);
         return cx.convert(dk, ct, n.dtype, n.dims);
       });

}  // namespace
}  // namespace txc

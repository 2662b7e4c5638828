// Convolution: N-d, strided, padded, dilated, grouped and transposed, and
// its input/weight gradients, as stablehlo.convolution. Spatial dims are the
// trailing ones; dim 1 is the channel dim (torch's NC... layout).
//
// Attributes, in torch's terms: (stride, padding, dilation, transposed,
// output_padding, groups), then for the gradient ops the dims of the tensor
// they produce. The gradient rules follow JAX's
// _conv_general_dilated_transpose_lhs/_rhs.
#include <algorithm>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"
#include "ops/window.h"

namespace txc {
namespace {

using namespace window;

Dims iota_spec(int rank) {
  Dims s(rank);
  for (int i = 0; i < rank; ++i) s[i] = i;
  return s;
}
Dims swap01(int rank) {
  Dims s = iota_spec(rank);
  std::swap(s[0], s[1]);
  return s;
}

// ---- the general convolution (JAX's conv_general_dilated) ----
struct ConvGeneral {
  Dims lspec, rspec, ospec;  // [batch|out, feature|in, spatial...] dim indices
  Dims strides, lhs_dil, rhs_dil;
  Pads pads;
  int64_t fgc = 1, bgc = 1;
};

Dims conv_general_dims(const Dims& ld, const Dims& rd, const ConvGeneral& c) {
  size_t ns = c.strides.size();
  Dims out(ld.size());
  out[c.ospec[0]] = ld[c.lspec[0]] / c.bgc;
  out[c.ospec[1]] = rd[c.rspec[0]];
  for (size_t j = 0; j < ns; ++j) {
    int64_t in = dilate(ld[c.lspec[2 + j]], c.lhs_dil[j]) + c.pads[j].first + c.pads[j].second;
    int64_t k = dilate(rd[c.rspec[2 + j]], c.rhs_dil[j]);
    out[c.ospec[2 + j]] = in < k ? 0 : (in - k) / c.strides[j] + 1;
  }
  return out;
}

// A convolution of t operands; its result in out_t (t by default; float32
// for a half-precision convolution whose bias is added before the one
// rounding, as CPU's kernels do). crop: the result may have more rows at
// the high end of a spatial dim than want, which are dropped (a transposed
// convolution's input gradient where output_padding >= stride).
std::string emit_conv(LowerCtx& cx, const std::string& lhs, const Dims& ld, const std::string& rhs, const Dims& rd,
                      DType t, const Dims& want, const ConvGeneral& c, DType out_t = DType::kCount,
                      bool crop = false) {
  if (out_t == DType::kCount) out_t = t;
  Dims od = conv_general_dims(ld, rd, c);
  bool cropped = false;
  if (crop && od != want && od.size() == want.size()) {
    cropped = true;
    for (size_t i = 0; i < od.size(); ++i) cropped &= od[i] >= want[i] && (i >= 2 || od[i] == want[i]);
  }
  if (od != want && !cropped)
    throw std::runtime_error("convolution lowering: computed shape " + dims_str(od) + " but expected " +
                             dims_str(want));
  int rank = int(ld.size());
  auto spec = [rank](const Dims& s, const char* a, const char* b) {
    std::vector<std::string> v(rank);
    v[s[0]] = a;
    v[s[1]] = b;
    for (int j = 2; j < rank; ++j) v[s[j]] = std::to_string(j - 2);
    std::string r = "[";
    for (int i = 0; i < rank; ++i) r += (i ? ", " : "") + v[i];
    return r + "]";
  };
  std::string rev = "array<i1";
  for (size_t j = 0; j < c.strides.size(); ++j) rev += j ? ", false" : ": false";
  rev += ">";
  std::string props = "batch_group_count = " + std::to_string(c.bgc) +
                      " : i64, dimension_numbers = #stablehlo.conv<" + spec(c.lspec, "b", "f") + "x" +
                      spec(c.rspec, "o", "i") + "->" + spec(c.ospec, "b", "f") +
                      ">, feature_group_count = " + std::to_string(c.fgc) +
                      " : i64, lhs_dilation = " + LowerCtx::i64_array(c.lhs_dil) + ", padding = " + pads_attr(c.pads) +
                      precision_config(t) + ", rhs_dilation = " + LowerCtx::i64_array(c.rhs_dil) + ", window_reversal = " + rev +
                      ", window_strides = " + LowerCtx::i64_array(c.strides);
  std::string r = cx.op("stablehlo.convolution", {lhs, rhs}, {LowerCtx::type(t, ld), LowerCtx::type(t, rd)},
                         LowerCtx::type(out_t, od), props);
  if (!cropped) return r;
  Dims zeros(od.size(), 0), unit(od.size(), 1);
  return cx.op("stablehlo.slice", {r}, {LowerCtx::type(out_t, od)}, LowerCtx::type(out_t, want),
               "start_indices = " + LowerCtx::i64_array(zeros) + ", limit_indices = " + LowerCtx::i64_array(want) +
                   ", strides = " + LowerCtx::i64_array(unit));
}

// Torch-style parameters of a (regular, i.e. non-transposed) convolution.
struct ConvP {
  Dims stride, pad, dil, out_pad;
  bool transposed = false;
  int64_t groups = 1;
};

ConvP conv_params(const Node& n) {
  ConvP p;
  p.stride = n.attr_dims(0);
  p.pad = n.attr_dims(1);
  p.dil = n.attr_dims(2);
  p.transposed = n.attr_int(3) != 0;
  p.out_pad = n.attr_dims(4);
  p.groups = n.attr_int(5);
  return p;
}

// Regular forward: x [N, I, in...], w [O, I/G, k...] -> [N, O, out...].
std::string conv_fwd(LowerCtx& cx, const std::string& x, const Dims& xd, const std::string& w, const Dims& wd,
                     DType t, const Dims& od, const ConvP& p, DType out_t = DType::kCount, bool crop = false) {
  ConvGeneral c;
  int rank = int(xd.size());
  c.lspec = c.rspec = c.ospec = iota_spec(rank);
  c.strides = p.stride;
  c.lhs_dil = ones(p.stride.size());
  c.rhs_dil = p.dil;
  for (auto q : p.pad) c.pads.push_back({q, q});
  c.fgc = p.groups;
  return emit_conv(cx, x, xd, w, wd, t, od, c, out_t, crop);
}

// Gradient of a regular convolution w.r.t. its input: g [N, O, out...],
// w [O, I/G, k...] -> [N, I, in...] (in = xd's spatial dims).
std::string conv_vjp_lhs(LowerCtx& cx, const std::string& g, const Dims& gd, const std::string& w, const Dims& wd,
                         DType t, const Dims& xd, const ConvP& p, DType out_t = DType::kCount) {
  int rank = int(gd.size()), ns = rank - 2;
  int64_t G = p.groups;
  std::string rw = w;
  Dims rwd = wd;
  if (G > 1) {  // [O, I/G, k] -> [G, O/G, I/G, k] -> [O/G, G, I/G, k] -> [O/G, I, k]
    Dims a = {G, wd[0] / G};
    for (int i = 1; i < rank; ++i) a.push_back(wd[i]);
    std::string r1 = cx.reshape(w, t, wd, a);
    Dims perm = iota_spec(rank + 1);
    std::swap(perm[0], perm[1]);
    Dims b = a;
    std::swap(b[0], b[1]);
    std::string r2 = cx.op("stablehlo.transpose", {r1}, {LowerCtx::type(t, a)}, LowerCtx::type(t, b),
                           "permutation = " + LowerCtx::i64_array(perm));
    rwd = {wd[0] / G, wd[1] * G};
    for (int i = 2; i < rank; ++i) rwd.push_back(wd[i]);
    rw = cx.reshape(r2, t, b, rwd);
  }
  Dims sp;
  for (int i = 2; i < rank; ++i) sp.push_back(i);
  std::string rev = cx.op("stablehlo.reverse", {rw}, {LowerCtx::type(t, rwd)}, LowerCtx::type(t, rwd),
                          "dimensions = " + LowerCtx::i64_array(sp));
  ConvGeneral c;
  c.lspec = c.ospec = iota_spec(rank);
  c.rspec = swap01(rank);
  c.strides = ones(ns);
  c.lhs_dil = p.stride;
  c.rhs_dil = p.dil;
  c.fgc = G;
  for (int j = 0; j < ns; ++j) {
    int64_t kd = dilate(wd[2 + j], p.dil[j]);
    int64_t before = kd - p.pad[j] - 1;
    int64_t after = xd[2 + j] + kd - 1 - dilate(gd[2 + j], p.stride[j]) - before;
    c.pads.push_back({before, after});
  }
  return emit_conv(cx, g, gd, rev, rwd, t, xd, c, out_t);
}

// Gradient of a regular convolution w.r.t. its weight: x [N, I, in...],
// g [N, O, out...] -> [O, I/G, k...] (wd).
std::string conv_vjp_rhs(LowerCtx& cx, const std::string& x, const Dims& xd, const std::string& g, const Dims& gd,
                         DType t, const Dims& wd, const ConvP& p) {
  int rank = int(xd.size()), ns = rank - 2;
  ConvGeneral c;
  c.lspec = c.rspec = c.ospec = swap01(rank);
  c.strides = p.dil;
  c.lhs_dil = ones(ns);
  c.rhs_dil = p.stride;
  c.bgc = p.groups;
  for (int j = 0; j < ns; ++j) {
    int64_t lo = p.pad[j];
    int64_t hi = (dilate(gd[2 + j], p.stride[j]) - xd[2 + j]) + (dilate(wd[2 + j], p.dil[j]) - lo - 1);
    c.pads.push_back({lo, hi});
  }
  return emit_conv(cx, x, xd, g, gd, t, wd, c);
}

void check_conv_attrs(const Node& n, const ConvP& p, size_t ns) {
  auto chk = [&](const Dims& d, const char* what) {
    if (d.size() != ns)
      op_error(n, std::string("expected ") + what + " to be a list of " + std::to_string(ns) + " ints, got " +
                      std::to_string(d.size()));
  };
  chk(p.stride, "stride");
  chk(p.pad, "padding");
  chk(p.dil, "dilation");
  for (auto s : p.stride)
    if (s <= 0) op_error(n, "non-positive stride is not supported");
  for (auto s : p.pad)
    if (s < 0) op_error(n, "negative padding is not supported");
  for (auto s : p.dil)
    if (s <= 0) op_error(n, "dilation should be greater than zero");
  if (p.groups <= 0) op_error(n, "non-positive groups is not supported");
  if (p.transposed) {
    chk(p.out_pad, "output_padding");
    for (size_t j = 0; j < ns; ++j)
      if (p.out_pad[j] < 0 || (p.out_pad[j] >= p.stride[j] && p.out_pad[j] >= p.dil[j]))
        op_error(n, "output padding must be smaller than either stride or dilation, but got output_padding=" +
                        list_str(p.out_pad, ", ") + ", stride=" + list_str(p.stride, ", ") +
                        ", dilation=" + list_str(p.dil, ", "));
  }
}

// convolution(x, w[, bias]; stride, padding, dilation, transposed, output_padding, groups)
TXC_OP("convolution", -1,
       [](Node& n) {
         if (n.operands.size() < 2 || n.operands.size() > 3) op_error(n, "expected input, weight and optional bias");
         const Node &x = *n.operands[0], &w = *n.operands[1];
         ConvP p = conv_params(n);
         if (w.rank() < 3)
           op_error(n, "weight should have at least three dimensions, got " + std::to_string(w.rank()));
         size_t ns = size_t(w.rank() - 2);
         if (x.rank() != w.rank())
           op_error(n, "Expected " + std::to_string(w.rank()) + "-dimensional input for " + std::to_string(w.rank()) +
                           "-dimensional weight " + dims_str(w.dims) + ", but got " + std::to_string(x.rank()) +
                           "-dimensional input of size " + dims_str(x.dims) + " instead");
         check_conv_attrs(n, p, ns);
         if (x.dtype != w.dtype)
           op_error(n, std::string("Input type (") + dtype_name(x.dtype) + ") and weight type (" +
                           dtype_name(w.dtype) + ") should be the same");
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
         int64_t G = p.groups;
         n.dtype = x.dtype;
         n.dims = {x.dims[0]};
         int64_t out_c;
         if (!p.transposed) {
           if (w.dims[0] % G != 0)
             op_error(n, "Given groups=" + std::to_string(G) + ", expected weight to be divisible by " +
                             std::to_string(G) + " at dimension 0, but got weight of size " + dims_str(w.dims) +
                             " instead");
           if (x.dims[1] != w.dims[1] * G)
             op_error(n, "Given groups=" + std::to_string(G) + ", weight of size " + dims_str(w.dims) +
                             ", expected input" + dims_str(x.dims) + " to have " + std::to_string(w.dims[1] * G) +
                             " channels, but got " + std::to_string(x.dims[1]) + " channels instead");
           out_c = w.dims[0];
           Dims padded, keff;
           bool small = false;
           for (size_t j = 0; j < ns; ++j) {
             padded.push_back(x.dims[2 + j] + 2 * p.pad[j]);
             keff.push_back(dilate(w.dims[2 + j], p.dil[j]));
             small |= padded.back() < keff.back();
           }
           if (small)
             op_error(n, "Calculated padded input size per channel: (" + list_str(padded) + "). Kernel size: (" +
                             list_str(keff) + "). Kernel size can't be greater than actual input size");
           n.dims.push_back(out_c);
           for (size_t j = 0; j < ns; ++j) n.dims.push_back((padded[j] - keff[j]) / p.stride[j] + 1);
         } else {
           if (x.dims[1] != w.dims[0])
             op_error(n, "Given transposed=1, weight of size " + dims_str(w.dims) + ", expected input" +
                             dims_str(x.dims) + " to have " + std::to_string(w.dims[0]) + " channels, but got " +
                             std::to_string(x.dims[1]) + " channels instead");
           if (w.dims[0] % G != 0)
             op_error(n, "Given groups=" + std::to_string(G) + ", expected weight to be divisible by " +
                             std::to_string(G) + " at dimension 0, but got weight of size " + dims_str(w.dims) +
                             " instead");
           out_c = w.dims[1] * G;
           n.dims.push_back(out_c);
           for (size_t j = 0; j < ns; ++j) {
             int64_t o = (x.dims[2 + j] - 1) * p.stride[j] - 2 * p.pad[j] + dilate(w.dims[2 + j], p.dil[j]) +
                         p.out_pad[j];
             if (o <= 0) op_error(n, "output size is too small: computed " + std::to_string(o));
             n.dims.push_back(o);
           }
         }
         if (n.operands.size() == 3) {
           const Node& b = *n.operands[2];
           if (b.rank() != 1 || b.dims[0] != out_c)
             op_error(n, "expected bias of shape [" + std::to_string(out_c) + "], got " + dims_str(b.dims));
           if (b.dtype != x.dtype)
             op_error(n, std::string("Input type (") + dtype_name(x.dtype) + ") and bias type (" +
                             dtype_name(b.dtype) + ") should be the same");
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node &x = *n.operands[0], &w = *n.operands[1];
         ConvP p = conv_params(n);
         // with a bias, a half-precision result is rounded once, after the add
         bool bias = n.operands.size() == 3;
         DType acc = bias ? arith::float_compute_dtype(n.dtype) : n.dtype;
         std::string r = p.transposed
                             ? conv_vjp_lhs(cx, cx.in(n, 0), x.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p, acc)
                             : conv_fwd(cx, cx.in(n, 0), x.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p, acc);
         if (bias) {
           std::string b = cx.broadcast_in_dim(cx.coerce(n, 2, acc, n.operands[2]->dims), acc,
                                               n.operands[2]->dims, n.dims, {1});
           r = cx.binary("stablehlo.add", r, b, acc, n.dims);
           if (acc != n.dtype) r = cx.convert(r, acc, n.dtype, n.dims);
         }
         return r;
       });

void conv_grad_infer(Node& n) {
  const Node &a = *n.operands[0], &b = *n.operands[1];
  if (a.dtype != b.dtype || a.rank() != b.rank() || a.rank() < 3)
    op_error(n, "expected operands of one floating dtype and equal rank >= 3, got " + dims_str(a.dims) + " " +
                    dtype_name(a.dtype) + " and " + dims_str(b.dims) + " " + dtype_name(b.dtype));
  n.dtype = a.dtype;
  n.dims = n.attr_dims(6);
}

// convolution_backward_input(grad, w; conv attrs..., input dims)
TXC_OP("convolution_backward_input", 2, conv_grad_infer, [](LowerCtx& cx, const Node& n) {
  const Node &g = *n.operands[0], &w = *n.operands[1];
  ConvP p = conv_params(n);
  // transposed: output_padding >= stride (allowed where it is < dilation)
  // leaves rows of g no input row reaches; the regular convolution over g
  // computes them, and they are dropped
  return p.transposed ? conv_fwd(cx, cx.in(n, 0), g.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p, DType::kCount, true)
                      : conv_vjp_lhs(cx, cx.in(n, 0), g.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p);
});

// convolution_backward_weight(x, grad; conv attrs..., weight dims)
TXC_OP("convolution_backward_weight", 2, conv_grad_infer, [](LowerCtx& cx, const Node& n) {
  const Node &x = *n.operands[0], &g = *n.operands[1];
  ConvP p = conv_params(n);
  // A transposed convolution is the input-gradient of a regular one whose
  // input is the transposed one's output (g) and whose output is x.
  return p.transposed ? conv_vjp_rhs(cx, cx.in(n, 1), g.dims, cx.in(n, 0), x.dims, n.dtype, n.dims, p)
                      : conv_vjp_rhs(cx, cx.in(n, 0), x.dims, cx.in(n, 1), g.dims, n.dtype, n.dims, p);
});

}  // namespace
}  // namespace txc

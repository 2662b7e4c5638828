// CNN ops: convolution (N-d, strided, padded, dilated, grouped, transposed)
// and its input/weight gradients as stablehlo.convolution; pooling (max with
// torch's flat indices, average, adaptive average) as reduce_window, scatter
// and constant averaging matrices; batch norm statistics, normalization,
// running-stat updates and gradients. Spatial dims are the trailing ones;
// dim 1 is the channel dim (torch's NC... layout).
//
// Convolution attributes, in torch's terms: (stride, padding, dilation,
// transposed, output_padding, groups), then for the gradient ops the dims of
// the tensor they produce. The gradient rules follow JAX's
// _conv_general_dilated_transpose_lhs/_rhs.
#include <algorithm>
#include <cmath>
#include <limits>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

using Pads = std::vector<std::pair<int64_t, int64_t>>;

int64_t dilate(int64_t s, int64_t d) { return s == 0 ? 0 : 1 + d * (s - 1); }

std::string list_str(const Dims& d, const char* sep = " x ") {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? sep : "") + std::to_string(d[i]);
  return s;
}

std::string pads_attr(const Pads& p) {
  if (p.empty()) return "dense<> : tensor<0x2xi64>";
  std::string s = "dense<[";
  for (size_t i = 0; i < p.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(p[i].first) + ", " + std::to_string(p[i].second) + "]";
  return s + "]> : tensor<" + std::to_string(p.size()) + "x2xi64>";
}

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

std::string emit_conv(LowerCtx& cx, const std::string& lhs, const Dims& ld, const std::string& rhs, const Dims& rd,
                      DType t, const Dims& want, const ConvGeneral& c) {
  Dims od = conv_general_dims(ld, rd, c);
  if (od != want)
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
  return cx.op("stablehlo.convolution", {lhs, rhs}, {LowerCtx::type(t, ld), LowerCtx::type(t, rd)},
               LowerCtx::type(t, od), props);
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

Dims ones(size_t n) { return Dims(n, 1); }

// Regular forward: x [N, I, in...], w [O, I/G, k...] -> [N, O, out...].
std::string conv_fwd(LowerCtx& cx, const std::string& x, const Dims& xd, const std::string& w, const Dims& wd,
                     DType t, const Dims& od, const ConvP& p) {
  ConvGeneral c;
  int rank = int(xd.size());
  c.lspec = c.rspec = c.ospec = iota_spec(rank);
  c.strides = p.stride;
  c.lhs_dil = ones(p.stride.size());
  c.rhs_dil = p.dil;
  for (auto q : p.pad) c.pads.push_back({q, q});
  c.fgc = p.groups;
  return emit_conv(cx, x, xd, w, wd, t, od, c);
}

// Gradient of a regular convolution w.r.t. its input: g [N, O, out...],
// w [O, I/G, k...] -> [N, I, in...] (in = xd's spatial dims).
std::string conv_vjp_lhs(LowerCtx& cx, const std::string& g, const Dims& gd, const std::string& w, const Dims& wd,
                         DType t, const Dims& xd, const ConvP& p) {
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
  return emit_conv(cx, g, gd, rev, rwd, t, xd, c);
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
         std::string r = p.transposed ? conv_vjp_lhs(cx, cx.in(n, 0), x.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p)
                                      : conv_fwd(cx, cx.in(n, 0), x.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p);
         if (n.operands.size() == 3) {
           std::string ty = LowerCtx::type(n);
           std::string b = cx.broadcast_in_dim(cx.in(n, 2), n.dtype, n.operands[2]->dims, n.dims, {1});
           r = cx.op("stablehlo.add", {r, b}, {ty, ty}, ty);
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
  return p.transposed ? conv_fwd(cx, cx.in(n, 0), g.dims, cx.in(n, 1), w.dims, n.dtype, n.dims, p)
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

// ---- pooling ----

// torch's pooling_output_shape.
int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, bool ceil) {
  int64_t num = in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil && (o - 1) * s >= in + pad) --o;
  return o;
}

struct PoolP {
  Dims k, s, pad, dil;
  bool ceil = false;
};

// Checks and output dims for pooling over the trailing k.size() dims of x.
Dims pool_dims(const Node& n, const Dims& x, const PoolP& p) {
  size_t ns = p.k.size();
  if (p.s.size() != ns || p.pad.size() != ns || p.dil.size() != ns)
    op_error(n, "kernel_size, stride, padding and dilation must have " + std::to_string(ns) + " elements");
  if (x.size() != ns + 1 && x.size() != ns + 2)
    op_error(n, "Expected " + std::to_string(ns + 1) + "D or " + std::to_string(ns + 2) +
                    "D input tensor, but got a tensor of shape " + dims_str(x));
  for (size_t j = 0; j < ns; ++j) {
    if (p.k[j] <= 0) op_error(n, "kernel size should be greater than zero, but got " + list_str(p.k, ", "));
    if (p.s[j] <= 0) op_error(n, "stride should be greater than zero, but got " + list_str(p.s, ", "));
    if (p.dil[j] <= 0) op_error(n, "dilation should be greater than zero, but got " + list_str(p.dil, ", "));
    if (p.pad[j] < 0 || p.pad[j] > dilate(p.k[j], p.dil[j]) / 2)
      op_error(n, "pad should be at most half of effective kernel size, but got pad=" + std::to_string(p.pad[j]) +
                      ", kernel_size=" + std::to_string(p.k[j]) + " and dilation=" + std::to_string(p.dil[j]));
  }
  for (size_t i = 0; i < x.size() - ns; ++i)
    if (x[i] == 0 && !(i == 0 && x.size() == ns + 2))
      op_error(n, "Expected input's non-batch dimensions to have positive length, but got " + dims_str(x));
  Dims out(x.begin(), x.end() - ns);
  Dims in(x.end() - ns, x.end());
  bool bad = false;
  for (size_t j = 0; j < ns; ++j) {
    out.push_back(pool_out(in[j], p.k[j], p.pad[j], p.s[j], p.dil[j], p.ceil));
    bad |= out.back() < 1;
  }
  if (bad) {
    Dims o(out.end() - ns, out.end());
    op_error(n, "Given input size: (" + list_str(Dims(x.begin() + (x.size() - ns - 1), x.end()), "x") +
                    "). Calculated output size: (" + std::to_string(x[x.size() - ns - 1]) + "x" + list_str(o, "x") +
                    "). Output size is too small");
  }
  return out;
}

// Window config over all dims of x (non-spatial dims: window 1).
struct Window {
  Dims win, str, dil;
  Pads pads;
};
Window pool_window(const Dims& x, const Dims& out, const PoolP& p) {
  size_t ns = p.k.size(), lead = x.size() - ns;
  Window w;
  for (size_t i = 0; i < lead; ++i) {
    w.win.push_back(1);
    w.str.push_back(1);
    w.dil.push_back(1);
    w.pads.push_back({0, 0});
  }
  for (size_t j = 0; j < ns; ++j) {
    w.win.push_back(p.k[j]);
    w.str.push_back(p.s[j]);
    w.dil.push_back(p.dil[j]);
    int64_t hi = (out[lead + j] - 1) * p.s[j] + dilate(p.k[j], p.dil[j]) - x[lead + j] - p.pad[j];
    w.pads.push_back({p.pad[j], std::max<int64_t>(hi, 0)});
  }
  return w;
}

std::string window_props(const Window& w) {
  return "base_dilations = " + LowerCtx::i64_array(ones(w.win.size())) + ", padding = " + pads_attr(w.pads) +
         ", window_dilations = " + LowerCtx::i64_array(w.dil) + ", window_dimensions = " +
         LowerCtx::i64_array(w.win) + ", window_strides = " + LowerCtx::i64_array(w.str);
}

std::string scalar_region(LowerCtx& cx, DType t, const std::string& body_op) {
  std::string a = cx.fresh(), b = cx.fresh(), s = cx.fresh(), st = LowerCtx::type(t, {});
  return "({\n      ^bb0(" + a + ": " + st + ", " + b + ": " + st + "):\n        " + s + " = \"" + body_op + "\"(" +
         a + ", " + b + ") : (" + st + ", " + st + ") -> " + st + "\n        \"stablehlo.return\"(" + s + ") : (" +
         st + ") -> ()\n    })";
}

std::string reduce_window(LowerCtx& cx, const std::string& v, DType t, const Dims& in, const Dims& out,
                          const Window& w, const std::string& body_op, double init) {
  std::string region = scalar_region(cx, t, body_op);
  return cx.op("stablehlo.reduce_window", {v, cx.constant(init, t)}, {LowerCtx::type(t, in), LowerCtx::type(t, {})},
               LowerCtx::type(t, out), window_props(w), region);
}

double lowest_of(DType t) {
  if (is_floating(t)) return -INFINITY;
  if (t == DType::Bool || t == DType::U8) return 0;
  return -std::ldexp(1.0, bit_width(t) - 1);
}

PoolP max_pool_params(const Node& n) {
  PoolP p;
  p.k = n.attr_dims(0);
  p.s = n.attr_dims(1);
  p.pad = n.attr_dims(2);
  p.dil = n.attr_dims(3);
  p.ceil = n.attr_int(4) != 0;
  return p;
}

// max_pool(x; kernel, stride, padding, dilation, ceil_mode): the values.
TXC_OP("max_pool", 1,
       [](Node& n) {
         n.dtype = n.operands[0]->dtype;
         n.dims = pool_dims(n, n.operands[0]->dims, max_pool_params(n));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Window w = pool_window(x.dims, n.dims, max_pool_params(n));
         return reduce_window(cx, cx.in(n, 0), x.dtype, x.dims, n.dims, w, "stablehlo.maximum", lowest_of(x.dtype));
       });

// Region of a (value, index) max-reduction: NaN wins, ties pick the smaller index.
std::string argmax_region(LowerCtx& cx, DType t) {
  std::string it = LowerCtx::type(DType::I64, {});
  std::string st = LowerCtx::type(t, {});
  std::string a = cx.fresh(), ai = cx.fresh(), b = cx.fresh(), bi = cx.fresh();
  std::string cmpt = is_floating(t) ? "FLOAT" : (is_unsigned(t) || is_bool(t)) ? "UNSIGNED" : "SIGNED";
  std::string body;
  auto cmp = [&](const std::string& l, const std::string& r, const char* dir, const std::string& ct,
                 const std::string& ty) {
    std::string o = cx.fresh();
    body += "        " + o + " = \"stablehlo.compare\"(" + l + ", " + r +
            ") <{compare_type = #stablehlo<comparison_type " + ct +
            ">, comparison_direction = #stablehlo<comparison_direction " + dir + ">}> : (" + ty + ", " + ty +
            ") -> tensor<i1>\n";
    return o;
  };
  auto bin = [&](const char* op, const std::string& l, const std::string& r) {
    std::string o = cx.fresh();
    body += "        " + o + " = \"stablehlo." + op + "\"(" + l + ", " + r + ") : (tensor<i1>, tensor<i1>) -> tensor<i1>\n";
    return o;
  };
  // take b when: b > a, or b is NaN and a is not, or (equal or both NaN) and bi < ai.
  std::string gt = cmp(b, a, "GT", cmpt, st);
  std::string eq = cmp(b, a, "EQ", cmpt, st);
  std::string an = cmp(a, a, "NE", cmpt, st);
  std::string bn = cmp(b, b, "NE", cmpt, st);
  std::string lt = cmp(bi, ai, "LT", "SIGNED", it);
  std::string t_true = cx.fresh();
  body += "        " + t_true + " = \"stablehlo.constant\"() <{value = dense<true> : tensor<i1>}> : () -> tensor<i1>\n";
  std::string nan_a = cx.fresh();
  body += "        " + nan_a + " = \"stablehlo.xor\"(" + an + ", " + t_true + ") : (tensor<i1>, tensor<i1>) -> tensor<i1>\n";
  std::string bnan_only = bin("and", bn, nan_a);
  std::string both_nan = bin("and", an, bn);
  std::string same = bin("or", eq, both_nan);
  std::string tie = bin("and", same, lt);
  std::string take = bin("or", bin("or", gt, bnan_only), tie);
  std::string rv = cx.fresh(), ri = cx.fresh();
  body += "        " + rv + " = \"stablehlo.select\"(" + take + ", " + b + ", " + a + ") : (tensor<i1>, " + st +
          ", " + st + ") -> " + st + "\n";
  body += "        " + ri + " = \"stablehlo.select\"(" + take + ", " + bi + ", " + ai + ") : (tensor<i1>, " + it +
          ", " + it + ") -> " + it + "\n";
  body += "        \"stablehlo.return\"(" + rv + ", " + ri + ") : (" + st + ", " + it + ") -> ()\n";
  std::string region = "({\n      ^bb0(" + a + ": " + st + ", " + ai + ": " + it + ", " + b + ": " + st + ", " +
                       bi + ": " + it + "):\n" + body + "    })";
  return region;
}

// int64 tensor of x's dims holding each element's flat index within its
// plane of the trailing ns dims.
std::string plane_index(LowerCtx& cx, const Dims& xd, size_t ns) {
  size_t lead = xd.size() - ns;
  Dims plane(xd.begin() + lead, xd.end());
  int64_t np = 1;
  for (auto d : plane) np *= d;
  std::string flat = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, {np}), "iota_dimension = 0 : i64");
  std::string pl = cx.reshape(flat, DType::I64, {np}, plane);
  Dims map;
  for (size_t j = 0; j < ns; ++j) map.push_back(int64_t(lead + j));
  return cx.broadcast_in_dim(pl, DType::I64, plane, xd, map);
}

// max_pool_indices(x; same attrs): int64 index of each window's maximum,
// flattened within its input plane (torch's convention). Ties pick the first.
TXC_OP("max_pool_indices", 1,
       [](Node& n) {
         n.dtype = DType::I64;
         n.dims = pool_dims(n, n.operands[0]->dims, max_pool_params(n));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         PoolP p = max_pool_params(n);
         Window w = pool_window(x.dims, n.dims, p);
         DType t = x.dtype;
         std::string idx = plane_index(cx, x.dims, p.k.size());
         std::string st = LowerCtx::type(t, {}), it = LowerCtx::type(DType::I64, {});
         std::string region = argmax_region(cx, t);
         std::string r = cx.op_multi(
             "stablehlo.reduce_window",
             {cx.in(n, 0), idx, cx.constant(lowest_of(t), t), cx.constant(double(int64_t(1) << 62), DType::I64)},
             {LowerCtx::type(x), LowerCtx::type(DType::I64, x.dims), st, it},
             {LowerCtx::type(t, n.dims), LowerCtx::type(DType::I64, n.dims)}, window_props(w), region);
         return r + "#1";
       });

// max_pool_backward(grad, indices; input dims): scatter-adds grad into a zero
// tensor of the input's shape at the flat per-plane indices.
TXC_OP("max_pool_backward", 2,
       [](Node& n) {
         const Node &g = *n.operands[0], &i = *n.operands[1];
         if (g.dims != i.dims) op_error(n, "grad " + dims_str(g.dims) + " and indices " + dims_str(i.dims) + " differ in shape");
         if (i.dtype != DType::I64) op_error(n, "expected int64 indices");
         n.dtype = g.dtype;
         n.dims = n.attr_dims(0);
         int64_t ns = n.attr_int(1);
         if (n.rank() != g.rank() || n.rank() < ns) op_error(n, "input and grad ranks differ");
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& g = *n.operands[0];
         int64_t ns = n.attr_int(1), lead = n.rank() - ns;
         int64_t L = 1, P = 1, Q = 1;
         for (int64_t i = 0; i < lead; ++i) L *= n.dims[i];
         for (int64_t i = lead; i < n.rank(); ++i) P *= n.dims[i], Q *= g.dims[i];
         DType t = n.dtype;
         std::string gv = cx.reshape(cx.in(n, 0), t, g.dims, {L, Q});
         std::string iv = cx.reshape(cx.in(n, 1), DType::I64, g.dims, {L, Q, 1});
         std::string rows = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, {L, Q, 1}), "iota_dimension = 0 : i64");
         std::string ix = cx.op("stablehlo.concatenate", {rows, iv},
                                {LowerCtx::type(DType::I64, {L, Q, 1}), LowerCtx::type(DType::I64, {L, Q, 1})},
                                LowerCtx::type(DType::I64, {L, Q, 2}), "dimension = 2 : i64");
         std::string z = cx.constant(0, t, {L, P});
         std::string r = cx.op("stablehlo.scatter", {z, ix, gv},
                               {LowerCtx::type(t, {L, P}), LowerCtx::type(DType::I64, {L, Q, 2}), LowerCtx::type(t, {L, Q})},
                               LowerCtx::type(t, {L, P}),
                               "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<"
                               "inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], "
                               "index_vector_dim = 2>, unique_indices = false",
                               scalar_region(cx, t, "stablehlo.add"));
         return cx.reshape(r, t, {L, P}, n.dims);
       });

PoolP avg_pool_params(const Node& n) {
  PoolP p;
  p.k = n.attr_dims(0);
  p.s = n.attr_dims(1);
  p.pad = n.attr_dims(2);
  p.dil = ones(p.k.size());
  p.ceil = n.attr_int(3) != 0;
  return p;
}

// Dense 1-D/2-D constant text.
std::string dense_const(LowerCtx& cx, const std::vector<double>& v, DType t, const Dims& d) {
  std::string s = "dense<";
  if (d.size() == 1) {
    s += "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + LowerCtx::literal(v[i], t);
    s += "]";
  } else {
    s += "[";
    for (int64_t r = 0; r < d[0]; ++r) {
      s += r ? ", [" : "[";
      for (int64_t c = 0; c < d[1]; ++c) s += (c ? ", " : "") + LowerCtx::literal(v[r * d[1] + c], t);
      s += "]";
    }
    s += "]";
  }
  s += "> : " + LowerCtx::type(t, d);
  return cx.op("stablehlo.constant", {}, {}, LowerCtx::type(t, d), "value = " + s);
}

// The divisor of each avg-pool output position, as a tensor of out dims.
std::string avg_divisor(LowerCtx& cx, const Node& n, const Dims& in, const Dims& out, DType t) {
  PoolP p = avg_pool_params(n);
  bool include_pad = n.attr_int(4) != 0;
  int64_t over = n.attr_int(5);
  if (over != 0) return cx.constant(double(over), t, out);
  size_t ns = p.k.size(), lead = in.size() - ns;
  std::string r;
  for (size_t j = 0; j < ns; ++j) {
    int64_t I = in[lead + j], O = out[lead + j];
    std::vector<double> c(O);
    for (int64_t o = 0; o < O; ++o) {
      int64_t start = o * p.s[j] - p.pad[j];
      int64_t end = std::min(start + p.k[j], I + p.pad[j]);
      int64_t size = end - start;
      start = std::max<int64_t>(start, 0);
      end = std::min(end, I);
      c[o] = double(include_pad ? size : end - start);
    }
    std::string cv = dense_const(cx, c, t, {O});
    std::string b = cx.broadcast_in_dim(cv, t, {O}, out, {int64_t(lead + j)});
    std::string ty = LowerCtx::type(t, out);
    r = r.empty() ? b : cx.op("stablehlo.multiply", {r, b}, {ty, ty}, ty);
  }
  return r;
}

DType acc_type(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

// avg_pool(x; kernel, stride, padding, ceil_mode, count_include_pad, divisor_override (0: none))
TXC_OP("avg_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
         n.dtype = x.dtype;
         n.dims = pool_dims(n, x.dims, avg_pool_params(n));
         if (n.attr_int(5) < 0) op_error(n, "divisor must be not zero");
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         DType t = acc_type(x.dtype);
         Window w = pool_window(x.dims, n.dims, avg_pool_params(n));
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
         std::string s = reduce_window(cx, v, t, x.dims, n.dims, w, "stablehlo.add", 0);
         std::string ty = LowerCtx::type(t, n.dims);
         std::string r = cx.op("stablehlo.divide", {s, avg_divisor(cx, n, x.dims, n.dims, t)}, {ty, ty}, ty);
         return cx.convert(r, t, x.dtype, n.dims);
       });

// avg_pool_backward(grad; avg_pool attrs..., input dims)
TXC_OP("avg_pool_backward", 1,
       [](Node& n) {
         const Node& g = *n.operands[0];
         n.dtype = g.dtype;
         n.dims = n.attr_dims(6);
         Dims want = pool_dims(n, n.dims, avg_pool_params(n));
         if (want != g.dims)
           op_error(n, "grad_output has shape " + dims_str(g.dims) + " but the pooling output has shape " + dims_str(want));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& g = *n.operands[0];
         DType t = acc_type(g.dtype);
         PoolP p = avg_pool_params(n);
         Window w = pool_window(n.dims, g.dims, p);
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, g.dims);
         std::string gty = LowerCtx::type(t, g.dims);
         gv = cx.op("stablehlo.divide", {gv, avg_divisor(cx, n, n.dims, g.dims, t)}, {gty, gty}, gty);
         // Transpose of reduce_window-sum: dilate and pad the cotangent, then sum windows with stride 1.
         Dims lo, hi, interior, padded;
         Window w2;
         for (size_t i = 0; i < g.dims.size(); ++i) {
           int64_t k = w.win[i], s = w.str[i];
           int64_t before = k - w.pads[i].first - 1;
           int64_t after = n.dims[i] + k - 1 - dilate(g.dims[i], s) - before;
           lo.push_back(before);
           hi.push_back(after);
           interior.push_back(s - 1);
           padded.push_back(dilate(g.dims[i], s) + before + after);
           w2.win.push_back(k);
           w2.str.push_back(1);
           w2.dil.push_back(1);
           w2.pads.push_back({0, 0});
         }
         std::string pv = cx.op("stablehlo.pad", {gv, cx.constant(0, t)}, {gty, LowerCtx::type(t, {})},
                                LowerCtx::type(t, padded),
                                "edge_padding_high = " + LowerCtx::i64_array(hi) + ", edge_padding_low = " +
                                    LowerCtx::i64_array(lo) + ", interior_padding = " + LowerCtx::i64_array(interior));
         std::string r = reduce_window(cx, pv, t, padded, n.dims, w2, "stablehlo.add", 0);
         return cx.convert(r, t, g.dtype, n.dims);
       });

// Averaging matrix [out, in] of adaptive pooling along one dim.
std::vector<double> adaptive_matrix(int64_t in, int64_t out) {
  std::vector<double> m(size_t(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
    for (int64_t i = start; i < end; ++i) m[size_t(o * in + i)] = 1.0 / double(end - start);
  }
  return m;
}

// Applies per-spatial-dim matrices: contracts dim `lead` of v with dim `cdim`
// of each matrix in turn (the new dim lands last, so the order is kept).
std::string adaptive_apply(LowerCtx& cx, std::string v, Dims vd, DType t, size_t ns, const Dims& in_sp,
                           const Dims& out_sp, bool transpose) {
  size_t lead = vd.size() - ns;
  for (size_t j = 0; j < ns; ++j) {
    int64_t I = in_sp[j], O = out_sp[j];
    std::string m = dense_const(cx, adaptive_matrix(I, O), t, {O, I});
    Dims nd;
    for (size_t i = 0; i < vd.size(); ++i) if (i != lead) nd.push_back(vd[i]);
    nd.push_back(transpose ? I : O);
    v = cx.op("stablehlo.dot_general", {v, m}, {LowerCtx::type(t, vd), LowerCtx::type(t, {O, I})}, LowerCtx::type(t, nd),
              "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [" + std::to_string(lead) +
                  "], rhs_contracting_dimensions = [" + (transpose ? "0" : "1") +
                  "]>" + precision_config(t));
    vd = nd;
  }
  return v;
}

// Input checks shared by the adaptive pools: (N,) C, spatial... with no empty non-batch dim.
void check_adaptive_input(const Node& n, const Node& x, size_t ns) {
  if (x.dims.size() != ns + 1 && x.dims.size() != ns + 2)
    op_error(n, "Expected " + std::to_string(ns + 1) + "D or " + std::to_string(ns + 2) +
                    "D tensor for input, but got a tensor of shape " + dims_str(x.dims));
  for (size_t i = 1; i < x.dims.size(); ++i)
    if (x.dims[i] == 0)
      op_error(n, "Expected input to have non-zero size for non-batch dimensions, but input has sizes " +
                      dims_str(x.dims) + " with dimension " + std::to_string(i) + " being empty");
}

// adaptive_avg_pool(x; output_size)
TXC_OP("adaptive_avg_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Dims& os = n.attr_dims(0);
         size_t ns = os.size();
         check_adaptive_input(n, x, ns);
         for (auto o : os)
           if (o < 0) op_error(n, "output_size must be non-negative, got " + dims_str(os));
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
         n.dtype = x.dtype;
         n.dims = Dims(x.dims.begin(), x.dims.end() - ns);
         n.dims.insert(n.dims.end(), os.begin(), os.end());
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         size_t ns = n.attr_dims(0).size();
         DType t = acc_type(x.dtype);
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
         v = adaptive_apply(cx, v, x.dims, t, ns, Dims(x.dims.end() - ns, x.dims.end()), n.attr_dims(0), false);
         return cx.convert(v, t, x.dtype, n.dims);
       });

// adaptive_avg_pool_backward(grad; input dims)
TXC_OP("adaptive_avg_pool_backward", 1,
       [](Node& n) {
         const Node& g = *n.operands[0];
         n.dtype = g.dtype;
         n.dims = n.attr_dims(0);
         if (n.rank() != g.rank()) op_error(n, "grad and input ranks differ");
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& g = *n.operands[0];
         size_t ns = size_t(n.attr_int(1));
         DType t = acc_type(g.dtype);
         std::string v = cx.convert(cx.in(n, 0), g.dtype, t, g.dims);
         v = adaptive_apply(cx, v, g.dims, t, ns, Dims(n.dims.end() - ns, n.dims.end()),
                            Dims(g.dims.end() - ns, g.dims.end()), true);
         return cx.convert(v, t, g.dtype, n.dims);
       });

// adaptive_max_pool(x; output_size, want_indices): values (or int64 flat
// plane indices) of the max over torch's adaptive windows [floor(o*I/O),
// ceil((o+1)*I/O)). Each spatial dim is gathered into O windows of the
// longest window's length K (short windows repeat their last element, which
// leaves max and first-index unchanged), then K is reduced.
TXC_OP("adaptive_max_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Dims& os = n.attr_dims(0);
         size_t ns = os.size();
         check_adaptive_input(n, x, ns);
         for (auto o : os)
           if (o <= 0) op_error(n, "output_size must be positive, got " + dims_str(os));
         n.dtype = n.attr_int(1) ? DType::I64 : x.dtype;
         n.dims = Dims(x.dims.begin(), x.dims.end() - ns);
         n.dims.insert(n.dims.end(), os.begin(), os.end());
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Dims& os = n.attr_dims(0);
         size_t ns = os.size(), lead = x.dims.size() - ns;
         DType t = x.dtype;
         std::string v = cx.in(n, 0), idx = plane_index(cx, x.dims, ns);
         Dims d = x.dims, split(x.dims.begin(), x.dims.begin() + lead), red;
         for (size_t j = 0; j < ns; ++j) {
           int64_t a = int64_t(lead + j), I = d[a], O = os[j], K = 0;
           for (int64_t o = 0; o < O; ++o) K = std::max(K, ((o + 1) * I + O - 1) / O - (o * I) / O);
           std::vector<double> gi;
           for (int64_t o = 0; o < O; ++o) {
             int64_t s0 = (o * I) / O, e0 = ((o + 1) * I + O - 1) / O;
             for (int64_t k = 0; k < K; ++k) gi.push_back(double(std::min(s0 + k, e0 - 1)));
           }
           std::string ix = cx.reshape(dense_const(cx, gi, DType::I64, {O * K}), DType::I64, {O * K}, {O * K, 1});
           Dims nd = d, sizes = d;
           nd[a] = O * K;
           sizes[a] = 1;
           std::string off = "[";
           for (int64_t i = 0, c = 0; i < int64_t(d.size()); ++i)
             if (i != a) off += (c++ ? ", " : "") + std::to_string(i);
           off += "]";
           std::string props = "dimension_numbers = #stablehlo.gather<offset_dims = " + off +
                               ", collapsed_slice_dims = [" + std::to_string(a) + "], start_index_map = [" +
                               std::to_string(a) + "], index_vector_dim = 1>, indices_are_sorted = true, slice_sizes = " +
                               LowerCtx::i64_array(sizes);
           std::string ixt = LowerCtx::type(DType::I64, {O * K, 1});
           v = cx.op("stablehlo.gather", {v, ix}, {LowerCtx::type(t, d), ixt}, LowerCtx::type(t, nd), props);
           idx = cx.op("stablehlo.gather", {idx, ix}, {LowerCtx::type(DType::I64, d), ixt}, LowerCtx::type(DType::I64, nd),
                       props);
           d = nd;
           split.push_back(O);
           split.push_back(K);
           red.push_back(int64_t(lead + 2 * j + 1));
         }
         v = cx.reshape(v, t, d, split);
         idx = cx.reshape(idx, DType::I64, d, split);
         std::string st = LowerCtx::type(t, {}), it = LowerCtx::type(DType::I64, {});
         std::string r = cx.op_multi(
             "stablehlo.reduce",
             {v, idx, cx.constant(lowest_of(t), t), cx.constant(double(int64_t(1) << 62), DType::I64)},
             {LowerCtx::type(t, split), LowerCtx::type(DType::I64, split), st, it},
             {LowerCtx::type(t, n.dims), LowerCtx::type(DType::I64, n.dims)},
             "dimensions = " + LowerCtx::i64_array(red), argmax_region(cx, t));
         return r + (n.attr_int(1) ? "#1" : "#0");
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
         DType t = acc_type(x.dtype);
         if (n.dtype == DType::F64) t = DType::F64;
         Dims c = n.dims, axes = bn_axes(x.rank());
         double N = double(bn_count(x.dims));
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
         std::string ct = LowerCtx::type(t, c), xt = LowerCtx::type(t, x.dims);
         std::string s = cx.reduce(v, t, x.dims, axes, "stablehlo.add", 0);
         std::string mean = cx.op("stablehlo.divide", {s, cx.constant(N, t, c)}, {ct, ct}, ct);
         std::string r = mean;
         if (n.attr_int(0) != 0) {
           std::string d = cx.op("stablehlo.subtract", {v, cx.broadcast_in_dim(mean, t, c, x.dims, {1})}, {xt, xt}, xt);
           std::string ss = cx.reduce(cx.op("stablehlo.multiply", {d, d}, {xt, xt}, xt), t, x.dims, axes, "stablehlo.add", 0);
           if (n.attr_int(0) == 2) {
             r = cx.op("stablehlo.divide", {ss, cx.constant(N - 1, t, c)}, {ct, ct}, ct);
           } else {
             std::string var = cx.op("stablehlo.divide", {ss, cx.constant(N, t, c)}, {ct, ct}, ct);
             std::string ve = cx.op("stablehlo.add", {var, cx.constant(n.attr_float(1), t, c)}, {ct, ct}, ct);
             r = cx.op("stablehlo.rsqrt", {ve}, {ct}, ct);
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
         std::string ve = cx.op("stablehlo.add", {cx.in(n, 0), cx.constant(n.attr_float(0), n.dtype, n.dims)}, {ct, ct}, ct);
         return cx.op("stablehlo.rsqrt", {ve}, {ct}, ct);
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
         DType t = acc_type(x.dtype);
         for (auto& o : n.operands) if (o->dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         std::string xt = LowerCtx::type(t, d);
         std::string v = cx.convert(cx.in(n, 0), x.dtype, t, d);
         std::string s;
         if (n.attr_int(0)) {
           const Node& var = *n.operands[2];
           std::string ct = LowerCtx::type(t, var.dims);
           std::string vv = cx.convert(cx.in(n, 2), var.dtype, t, var.dims);
           std::string ve = cx.op("stablehlo.add", {vv, cx.constant(n.attr_float(1), t, var.dims)}, {ct, ct}, ct);
           s = cx.broadcast_in_dim(cx.op("stablehlo.rsqrt", {ve}, {ct}, ct), t, var.dims, d, {1});
         } else {
           s = bn_chan(cx, n, 2, t, d);
         }
         std::string r = cx.op("stablehlo.subtract", {v, bn_chan(cx, n, 1, t, d)}, {xt, xt}, xt);
         r = cx.op("stablehlo.multiply", {r, s}, {xt, xt}, xt);
         size_t i = 3;
         if (n.attr_int(2)) r = cx.op("stablehlo.multiply", {r, bn_chan(cx, n, i++, t, d)}, {xt, xt}, xt);
         if (n.attr_int(3)) r = cx.op("stablehlo.add", {r, bn_chan(cx, n, i++, t, d)}, {xt, xt}, xt);
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
         std::string a = cx.op("stablehlo.multiply", {cx.in(n, 0), cx.constant(1 - m, t, d)}, {ty, ty}, ty);
         std::string b = cx.op("stablehlo.multiply", {s, cx.constant(m, t, d)}, {ty, ty}, ty);
         return cx.op("stablehlo.add", {a, b}, {ty, ty}, ty);
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
         DType t = acc_type(x.dtype);
         for (auto& o : n.operands) if (o->dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         Dims c = {d[1]}, axes = bn_axes(x.rank());
         std::string xt = LowerCtx::type(t, d), ct = LowerCtx::type(t, c);
         double N = double(bn_count(d));
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, d);
         std::string inv = bn_chan(cx, n, 3, t, d);
         std::string scale = inv;
         if (n.attr_int(1)) scale = cx.op("stablehlo.multiply", {inv, bn_chan(cx, n, 4, t, d)}, {xt, xt}, xt);
         std::string r;
         if (n.attr_int(0)) {
           std::string xv = cx.convert(cx.in(n, 1), x.dtype, t, d);
           std::string xhat = cx.op("stablehlo.subtract", {xv, bn_chan(cx, n, 2, t, d)}, {xt, xt}, xt);
           xhat = cx.op("stablehlo.multiply", {xhat, inv}, {xt, xt}, xt);
           auto mean_b = [&](const std::string& v) {
             std::string s = cx.reduce(v, t, d, axes, "stablehlo.add", 0);
             s = cx.op("stablehlo.divide", {s, cx.constant(N, t, c)}, {ct, ct}, ct);
             return cx.broadcast_in_dim(s, t, c, d, {1});
           };
           std::string mg = mean_b(gv);
           std::string mgx = mean_b(cx.op("stablehlo.multiply", {gv, xhat}, {xt, xt}, xt));
           r = cx.op("stablehlo.subtract", {gv, mg}, {xt, xt}, xt);
           r = cx.op("stablehlo.subtract", {r, cx.op("stablehlo.multiply", {xhat, mgx}, {xt, xt}, xt)}, {xt, xt}, xt);
           r = cx.op("stablehlo.multiply", {r, scale}, {xt, xt}, xt);
         } else {
           r = cx.op("stablehlo.multiply", {gv, scale}, {xt, xt}, xt);
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
         DType t = acc_type(x.dtype);
         if (n.dtype == DType::F64) t = DType::F64;
         const Dims& d = x.dims;
         Dims c = n.dims;
         std::string xt = LowerCtx::type(t, d), ct = LowerCtx::type(t, c);
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, d);
         std::string xv = cx.convert(cx.in(n, 1), x.dtype, t, d);
         std::string xc = cx.op("stablehlo.subtract", {xv, bn_chan(cx, n, 2, t, d)}, {xt, xt}, xt);
         std::string s = cx.reduce(cx.op("stablehlo.multiply", {gv, xc}, {xt, xt}, xt), t, d, bn_axes(x.rank()),
                                   "stablehlo.add", 0);
         const Node& inv = *n.operands[3];
         std::string r = cx.op("stablehlo.multiply", {s, cx.convert(cx.in(n, 3), inv.dtype, t, c)}, {ct, ct}, ct);
         return cx.convert(r, t, n.dtype, c);
       });

}  // namespace
}  // namespace txc

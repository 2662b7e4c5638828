// Pooling: max (values, torch's flat indices, backward), average and
// adaptive average/max, forward and backward, as reduce_window, scatter and
// constant averaging matrices. Spatial dims are the trailing ones.
#include <algorithm>
#include <cmath>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"
#include "ops/window.h"

namespace txc {
namespace {

using arith::float_compute_dtype;
using arith::in_compute_dtype;
using namespace window;

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

std::string reduce_window(LowerCtx& cx, const std::string& v, DType t, const Dims& in, const Dims& out,
                          const Window& w, const std::string& body_op, double init) {
  std::string region = cx.combiner(t, body_op);
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
  return cx.scalar_region({t, DType::I64, t, DType::I64}, {t, DType::I64}, [&](const std::vector<std::string>& args) {
    const std::string &a = args[0], &ai = args[1], &b = args[2], &bi = args[3];
    auto logic = [&](const char* op, const std::string& l, const std::string& r) {
      return cx.binary(op, l, r, DType::Bool, {});
    };
    // take b when: b > a, or b is NaN and a is not, or (equal or both NaN) and bi < ai.
    std::string gt = cx.compare(b, a, t, {}, "GT");
    std::string eq = cx.compare(b, a, t, {}, "EQ");
    std::string a_nan = cx.compare(a, a, t, {}, "NE");
    std::string b_nan = cx.compare(b, b, t, {}, "NE");
    std::string index_first = cx.compare(bi, ai, DType::I64, {}, "LT");
    std::string a_num = logic("stablehlo.xor", a_nan, cx.constant(1, DType::Bool));
    std::string b_nan_only = logic("stablehlo.and", b_nan, a_num);
    std::string same = logic("stablehlo.or", eq, logic("stablehlo.and", a_nan, b_nan));
    std::string tie = logic("stablehlo.and", same, index_first);
    std::string take = logic("stablehlo.or", logic("stablehlo.or", gt, b_nan_only), tie);
    return std::vector<std::string>{cx.select(take, b, a, t, {}), cx.select(take, bi, ai, DType::I64, {})};
  });
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
                               cx.combiner(t, "stablehlo.add"));
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
    r = r.empty() ? b : cx.binary("stablehlo.multiply", r, b, t, out);
  }
  return r;
}

// avg_pool(x; kernel, stride, padding, ceil_mode, count_include_pad, divisor_override (0: none))
TXC_OP("avg_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
         n.dtype = x.dtype;
         n.dims = pool_dims(n, x.dims, avg_pool_params(n));  // a negative divisor_override divides, as on CPU
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims& xd = n.operands[0]->dims;
         return in_compute_dtype(cx, n, [&](const std::string& v, DType t) {
           Window w = pool_window(xd, n.dims, avg_pool_params(n));
           std::string s = reduce_window(cx, v, t, xd, n.dims, w, "stablehlo.add", 0);
           return cx.binary("stablehlo.divide", s, avg_divisor(cx, n, xd, n.dims, t), t, n.dims);
         });
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
         DType t = float_compute_dtype(g.dtype);
         PoolP p = avg_pool_params(n);
         Window w = pool_window(n.dims, g.dims, p);
         std::string gv = cx.convert(cx.in(n, 0), g.dtype, t, g.dims);
         std::string gty = LowerCtx::type(t, g.dims);
         gv = cx.binary("stablehlo.divide", gv, avg_divisor(cx, n, n.dims, g.dims, t), t, g.dims);
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

// The output dims of an adaptive pool with output_size os (attribute 0):
// x's leading dims, then os. Checks the input, (N,) C, spatial dims, none
// empty, and the output sizes: non-negative (avg) or positive (max).
Dims adaptive_out_dims(const Node& n, const Node& x, bool zero_ok) {
  const Dims& os = n.attr_dims(0);
  size_t ns = os.size();
  for (auto o : os)
    if (zero_ok ? o < 0 : o <= 0)
      op_error(n, std::string("output_size must be ") + (zero_ok ? "non-negative" : "positive") + ", got " + dims_str(os));
  if (x.dims.size() != ns + 1 && x.dims.size() != ns + 2)
    op_error(n, "Expected " + std::to_string(ns + 1) + "D or " + std::to_string(ns + 2) +
                    "D tensor for input, but got a tensor of shape " + dims_str(x.dims));
  for (size_t i = 1; i < x.dims.size(); ++i)
    if (x.dims[i] == 0)
      op_error(n, "Expected input to have non-zero size for non-batch dimensions, but input has sizes " +
                      dims_str(x.dims) + " with dimension " + std::to_string(i) + " being empty");
  Dims out(x.dims.begin(), x.dims.end() - ns);
  out.insert(out.end(), os.begin(), os.end());
  return out;
}

// adaptive_avg_pool(x; output_size)
TXC_OP("adaptive_avg_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         n.dims = adaptive_out_dims(n, x, true);
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating point input, got ") + dtype_name(x.dtype));
         n.dtype = x.dtype;
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims& xd = n.operands[0]->dims;
         size_t ns = n.attr_dims(0).size();
         return in_compute_dtype(cx, n, [&](const std::string& v, DType t) {
           return adaptive_apply(cx, v, xd, t, ns, Dims(xd.end() - ns, xd.end()), n.attr_dims(0), false);
         });
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
         const Dims& gd = n.operands[0]->dims;
         size_t ns = size_t(n.attr_int(1));
         return in_compute_dtype(cx, n, [&](const std::string& v, DType t) {
           return adaptive_apply(cx, v, gd, t, ns, Dims(n.dims.end() - ns, n.dims.end()), Dims(gd.end() - ns, gd.end()),
                                 true);
         });
       });

// adaptive_max_pool(x; output_size, want_indices): values (or int64 flat
// plane indices) of the max over torch's adaptive windows [floor(o*I/O),
// ceil((o+1)*I/O)). Each spatial dim is gathered into O windows of the
// longest window's length K (short windows repeat their last element, which
// leaves max and first-index unchanged), then K is reduced.
TXC_OP("adaptive_max_pool", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         n.dims = adaptive_out_dims(n, x, false);
         n.dtype = n.attr_int(1) ? DType::I64 : x.dtype;
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

}  // namespace
}  // namespace txc

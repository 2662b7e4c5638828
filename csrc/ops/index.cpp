// Indexing ops: advanced indexing (index, index_put), torch.gather and the
// scatter family, masked writes (mask_put: x[mask] = v and masked_scatter
// without a host sync), embedding's backward, cumulative sums/products,
// sort, triangular masks (tril/triu) and diagonals.
//
// Index values: negative indices wrap like torch. Out-of-range indices are
// NOT checked (that would need the device values on the host): gathers clamp
// them into range and scatters drop their updates, as XLA defines it (and as
// torch_xla does).
#include <cmath>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"

namespace txc {
std::string floor_divide(LowerCtx& cx, const std::string& a, const std::string& b, DType t, const Dims& d);  // ops/elementwise.cpp

namespace {

std::string iota(LowerCtx& cx, const Dims& d, int64_t dim) {
  return cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, d),
               "iota_dimension = " + std::to_string(dim) + " : i64");
}

// Index operand i of n as int64 broadcast to `to`, negatives wrapped by `size`.
std::string index_operand(LowerCtx& cx, const Node& n, size_t i, const Dims& to, int64_t size) {
  const Node& o = *n.operands[i];
  std::string v = cx.convert(cx.in(n, i), o.dtype, DType::I64, o.dims);
  if (!is_unsigned(o.dtype)) {
    std::string neg = cx.compare(v, cx.constant(0, DType::I64, o.dims), DType::I64, o.dims, "LT");
    std::string up = cx.binary("stablehlo.add", v, cx.constant(double(size), DType::I64, o.dims), DType::I64, o.dims);
    v = cx.select(neg, up, v, DType::I64, o.dims);
  }
  return cx.broadcast(v, DType::I64, o.dims, to);
}

// Stacks int64 tensors of dims B into one index tensor of dims B + [k].
std::string index_vector(LowerCtx& cx, const std::vector<std::string>& comps, const Dims& B) {
  Dims b1 = B;
  b1.push_back(1);
  std::vector<std::string> parts, types;
  for (const auto& c : comps) {
    parts.push_back(cx.reshape(c, DType::I64, B, b1));
    types.push_back(LowerCtx::type(DType::I64, b1));
  }
  if (parts.size() == 1) return parts[0];
  Dims bk = B;
  bk.push_back(int64_t(comps.size()));
  return cx.op("stablehlo.concatenate", parts, types, LowerCtx::type(DType::I64, bk),
               "dimension = " + std::to_string(B.size()) + " : i64");
}

std::string dims_list(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string gather_props(const Dims& offset, const Dims& collapsed, const Dims& start_map, int64_t ivd,
                         const Dims& slice_sizes) {
  return "dimension_numbers = #stablehlo.gather<offset_dims = " + dims_list(offset) +
         ", collapsed_slice_dims = " + dims_list(collapsed) + ", start_index_map = " + dims_list(start_map) +
         ", index_vector_dim = " + std::to_string(ivd) +
         ">, indices_are_sorted = false, slice_sizes = " + LowerCtx::i64_array(slice_sizes);
}

std::string scatter_props(const Dims& window, const Dims& inserted, const Dims& to_operand, int64_t ivd) {
  return "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " +
         dims_list(window) + ", inserted_window_dims = " + dims_list(inserted) +
         ", scatter_dims_to_operand_dims = " + dims_list(to_operand) + ", index_vector_dim = " +
         std::to_string(ivd) + ">, unique_indices = false";
}

std::string scatter(LowerCtx& cx, const std::string& base, const std::string& idx, const std::string& upd, DType t,
                    const Dims& base_dims, const Dims& idx_dims, const Dims& upd_dims, const std::string& props,
                    const std::string& body_op) {
  return cx.op("stablehlo.scatter", {base, idx, upd},
               {LowerCtx::type(t, base_dims), LowerCtx::type(DType::I64, idx_dims), LowerCtx::type(t, upd_dims)},
               LowerCtx::type(t, base_dims), props, cx.combiner(t, body_op));
}

void check_index_dtype(const Node& n, const Node& i) {
  if (!is_integral(i.dtype))
    op_error(n, std::string("tensors used as indices must be long, int, byte or bool tensors, got ") +
                    dtype_name(i.dtype));
}

// ---- advanced indexing -------------------------------------------------
// index(x, i_0 .. i_k-1; dims): x[..., i_0, ..., i_k-1, ...] with index i_j
// on dim dims[j] (increasing). Indices broadcast together to B. When the
// indexed dims are adjacent, B replaces them in place; otherwise B comes first.
struct IndexPlan {
  Dims B, out, rest_pos;  // broadcast index dims, result dims, positions of non-indexed dims in out
};

IndexPlan index_plan(const Node& n, const Node& x, size_t first, const Dims& dims) {
  IndexPlan p;
  if (dims.empty()) op_error(n, "no index tensors");
  if (dims.size() != n.operands.size() - first) op_error(n, "one dim per index tensor expected");
  for (size_t j = 0; j < dims.size(); ++j) {
    const Node& i = *n.operands[first + j];
    check_index_dtype(n, i);
    if (dims[j] < 0 || dims[j] >= x.rank() || (j && dims[j] <= dims[j - 1]))
      op_error(n, "invalid indexed dims " + dims_str(dims) + " for a tensor of rank " + std::to_string(x.rank()));
    p.B = j ? broadcast_dims(n, p.B, i.dims) : i.dims;
  }
  int64_t bn = 1;
  for (auto d : p.B) bn *= d;
  for (auto d : dims)
    if (x.dims[d] == 0 && bn > 0)
      op_error(n, "index is out of bounds for dimension " + std::to_string(d) + " with size 0");
  bool adjacent = dims.back() - dims.front() == int64_t(dims.size()) - 1;
  if (!adjacent) p.out = p.B;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (adjacent && d == dims.front()) p.out.insert(p.out.end(), p.B.begin(), p.B.end());
    bool indexed = false;
    for (auto e : dims) indexed |= e == d;
    if (indexed) continue;
    p.rest_pos.push_back(int64_t(p.out.size()));
    p.out.push_back(x.dims[d]);
  }
  return p;
}

// The lowering side of index / index_put (x = operand 0, indexed dims =
// attribute 0, index tensors from operand `first`): the plan, and the
// indices stacked as one gather/scatter operand of dims (B..., k).
struct IndexLowering {
  const Node& x;      // the indexed tensor (operand 0)
  const Dims& dims;   // the indexed dims (attribute 0)
  IndexPlan p;
  std::string idx;
  Dims idx_dims;
};
IndexLowering lower_indices(LowerCtx& cx, const Node& n, size_t first) {
  const Node& x = *n.operands[0];
  const Dims& dims = n.attr_dims(0);
  IndexLowering r{x, dims, index_plan(n, x, first, dims), "", {}};
  std::vector<std::string> comps;
  for (size_t j = 0; j < dims.size(); ++j) comps.push_back(index_operand(cx, n, first + j, r.p.B, x.dims[dims[j]]));
  r.idx = index_vector(cx, comps, r.p.B);
  r.idx_dims = r.p.B;
  r.idx_dims.push_back(int64_t(dims.size()));
  return r;
}

TXC_OP("index", -1,
       [](Node& n) {
         const Node& x = *n.operands.at(0);
         IndexPlan p = index_plan(n, x, 1, n.attr_dims(0));
         n.dtype = x.dtype;
         n.dims = p.out;
       },
       [](LowerCtx& cx, const Node& n) {
         IndexLowering l = lower_indices(cx, n, 1);
         Dims slice = l.x.dims;
         for (auto d : l.dims) slice[d] = 1;
         return cx.op("stablehlo.gather", {cx.in(n, 0), l.idx}, {LowerCtx::type(l.x), LowerCtx::type(DType::I64, l.idx_dims)},
                      LowerCtx::type(n), gather_props(l.p.rest_pos, l.dims, l.dims, int64_t(l.p.B.size()), slice));
       });

// index_put(x, values, i_0 .. i_k-1; dims, accumulate): x with x[indices] =
// values (or += with accumulate). values broadcast to the indexing result.
TXC_OP("index_put", -1,
       [](Node& n) {
         const Node& x = *n.operands.at(0);
         const Node& v = *n.operands.at(1);
         IndexPlan p = index_plan(n, x, 2, n.attr_dims(0));
         bool fits = v.rank() <= int(p.out.size());
         for (int i = 0; fits && i < v.rank(); ++i) {
           int64_t a = v.dims[v.rank() - 1 - i], b = p.out[p.out.size() - 1 - i];
           fits = a == b || a == 1;
         }
         if (!fits)
           op_error(n, "shape mismatch: value tensor of shape " + dims_str(v.dims) +
                           " cannot be broadcast to indexing result of shape " + dims_str(p.out));
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         IndexLowering l = lower_indices(cx, n, 2);
         DType t = l.x.dtype;
         std::string upd = cx.coerce(n, 1, t, l.p.out);
         const char* body = n.attr_int(1) ? (is_bool(t) ? "stablehlo.or" : "stablehlo.add") : "";
         return scatter(cx, cx.in(n, 0), l.idx, upd, t, l.x.dims, l.idx_dims, l.p.out,
                        scatter_props(l.p.rest_pos, l.dims, l.dims, int64_t(l.p.B.size())), body);
       });

// ---- torch.gather / scatter ---------------------------------------------
// The full coordinates of every element of `idx` (dims D) into x: iota on all
// dims but `dim`, where the (wrapped) index values go.
std::string dim_indices(LowerCtx& cx, const Node& n, size_t i, int64_t dim, const Node& x) {
  const Dims& D = n.operands[i]->dims;
  std::vector<std::string> comps;
  for (int64_t d = 0; d < int64_t(D.size()); ++d)
    comps.push_back(d == dim ? index_operand(cx, n, i, D, x.dims[dim]) : iota(cx, D, d));
  return index_vector(cx, comps, D);
}

Dims all_dims(int64_t r) {
  Dims d(r);
  for (int64_t i = 0; i < r; ++i) d[i] = i;
  return d;
}

void check_dim_index(const Node& n, const Node& x, const Node& idx, int64_t dim, const char* what) {
  check_index_dtype(n, idx);
  if (x.rank() == 0) op_error(n, "expects a tensor of rank >= 1 (reshape 0-d tensors first)");
  if (dim < 0 || dim >= x.rank()) op_error(n, "dimension " + std::to_string(dim) + " out of range");
  if (idx.rank() != x.rank())
    op_error(n, "Index tensor must have the same number of dimensions as " + std::string(what) + " tensor");
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim && idx.dims[d] > x.dims[d])
      op_error(n, "Size does not match at dimension " + std::to_string(d) + " expected index " +
                      dims_str(idx.dims) + " to be no larger than " + what + " " + dims_str(x.dims) +
                      " apart from dimension " + std::to_string(dim));
}

// gather(x, idx; dim): out[p] = x[p with p[dim] = idx[p]].
TXC_OP("gather", 2,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& idx = *n.operands[1];
         check_dim_index(n, x, idx, n.attr_int(0), "input");
         int64_t numel = 1;
         for (auto d : idx.dims) numel *= d;
         if (x.dims[n.attr_int(0)] == 0 && numel > 0) op_error(n, "index out of range in self (size 0)");
         n.dtype = x.dtype;
         n.dims = idx.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Node& idx = *n.operands[1];
         int64_t r = x.rank();
         std::string iv = dim_indices(cx, n, 1, n.attr_int(0), x);
         Dims iv_dims = idx.dims;
         iv_dims.push_back(r);
         return cx.op("stablehlo.gather", {cx.in(n, 0), iv}, {LowerCtx::type(x), LowerCtx::type(DType::I64, iv_dims)},
                      LowerCtx::type(n), gather_props({}, all_dims(r), all_dims(r), r, Dims(r, 1)));
       });


// scatter(x, idx, src; dim, reduce, include_self): x with src[p] written to
// (reduced into) x[p with p[dim] = idx[p]] for every p in idx. reduce is one
// of none, sum, prod, amax, amin, mean; src is 0-d or at least idx's size.
TXC_OP("scatter", 3,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& idx = *n.operands[1];
         const Node& src = *n.operands[2];
         int64_t dim = n.attr_int(0);
         check_dim_index(n, x, idx, dim, "self");
         if (src.rank() != 0) {
           if (src.rank() != x.rank())
             op_error(n, "Index tensor must have the same number of dimensions as src tensor");
           for (int64_t d = 0; d < x.rank(); ++d)
             if (idx.dims[d] > src.dims[d])
               op_error(n, "Size does not match at dimension " + std::to_string(d) + " expected index " +
                               dims_str(idx.dims) + " to be no larger than src " + dims_str(src.dims));
         }
         const std::string& r = n.attr_str(1);
         if (r != "none" && r != "sum" && r != "prod" && r != "amax" && r != "amin" && r != "mean")
           op_error(n, "reduce argument must be one of sum, prod, mean, amax, amin, got '" + r + "'");
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Node& idx = *n.operands[1];
         const Node& src = *n.operands[2];
         int64_t dim = n.attr_int(0), r = x.rank();
         const std::string& red = n.attr_str(1);
         bool include_self = n.attr_int(2) != 0;
         DType t = x.dtype;
         std::string iv = dim_indices(cx, n, 1, dim, x);
         Dims iv_dims = idx.dims;
         iv_dims.push_back(r);
         // updates: src cut to idx's dims
         std::string upd = cx.convert(cx.in(n, 2), src.dtype, t, src.dims);
         if (src.rank() == 0) {
           upd = cx.broadcast(upd, t, {}, idx.dims);
         } else if (src.dims != idx.dims) {
           upd = cx.op("stablehlo.slice", {upd}, {LowerCtx::type(t, src.dims)}, LowerCtx::type(t, idx.dims),
                       "limit_indices = " + LowerCtx::i64_array(idx.dims) +
                           ", start_indices = " + LowerCtx::i64_array(Dims(r, 0)) +
                           ", strides = " + LowerCtx::i64_array(Dims(r, 1)));
         }
         std::string props = scatter_props({}, all_dims(r), all_dims(r), r);
         auto sc = [&](const std::string& base, const std::string& u, DType ut, const char* body) {
           return scatter(cx, base, iv, u, ut, x.dims, iv_dims, idx.dims, props, body);
         };
         if (red == "none") return sc(cx.in(n, 0), upd, t, "");
         bool b = is_bool(t);
         const char* body = red == "prod" ? (b ? "stablehlo.and" : "stablehlo.multiply")
                            : red == "amax" ? (b ? "stablehlo.or" : "stablehlo.maximum")
                            : red == "amin" ? (b ? "stablehlo.and" : "stablehlo.minimum")
                                            : (b ? "stablehlo.or" : "stablehlo.add");
         double ident = red == "prod" ? 1 : red == "amax" ? lowest_value(t) : red == "amin" ? highest_value(t) : 0;
         std::string base = cx.in(n, 0), touched;
         if (!include_self || red == "mean") {
           std::string cnt = sc(cx.constant(0, DType::I64, x.dims), cx.constant(1, DType::I64, idx.dims), DType::I64,
                                "stablehlo.add");
           touched = cx.compare(cnt, cx.constant(0, DType::I64, x.dims), DType::I64, x.dims, "GT");
           if (!include_self) base = cx.select(touched, cx.constant(ident, t, x.dims), base, t, x.dims);
           std::string out = sc(base, upd, t, body);
           if (red != "mean") return out;
           if (include_self) cnt = cx.binary("stablehlo.add", cnt, cx.constant(1, DType::I64, x.dims), DType::I64, x.dims);
           std::string c = cx.convert(cnt, DType::I64, t, x.dims);
           std::string one = cx.constant(1, t, x.dims);
           c = cx.select(touched, c, one, t, x.dims);
           // integers round down, as torch's div_(count, "floor")
           return is_floating(t) || is_complex(t) ? cx.binary("stablehlo.divide", out, c, t, x.dims)
                                                   : floor_divide(cx, out, c, t, x.dims);
         }
         return sc(base, upd, t, body);
       });

// ---- masked writes ----------------------------------------------------
// mask_put(x, mask, values; start, accumulate): mask (bool, m dims) covers
// x's dims [start, start + m); values has dims x[:start] + [K] + x[start+m:]
// and holds, in order, the values for the K selected positions (K == 1:
// one value for all). The i-th true element of the mask takes values[i]
// (found with a running count of the mask): x[mask] = values without
// knowing K on the host. masked_scatter is the case start = 0, m = rank.
std::string cumulative(LowerCtx& cx, const std::string& v, DType t, const Dims& d, int64_t dim, const char* body,
                       double init) {
  int64_t r = int64_t(d.size());
  Dims win(r, 1), one(r, 1);
  win[dim] = d[dim];
  std::string padding = "dense<[";
  for (int64_t i = 0; i < r; ++i)
    padding += std::string(i ? ", " : "") + "[" + std::to_string(i == dim ? d[dim] - 1 : 0) + ", 0]";
  padding += "]> : tensor<" + std::to_string(r) + "x2xi64>";
  std::string c = cx.constant(init, t);
  return cx.op("stablehlo.reduce_window", {v, c}, {LowerCtx::type(t, d), LowerCtx::type(t, {})}, LowerCtx::type(t, d),
               "base_dilations = " + LowerCtx::i64_array(one) + ", padding = " + padding +
                   ", window_dilations = " + LowerCtx::i64_array(one) +
                   ", window_dimensions = " + LowerCtx::i64_array(win) +
                   ", window_strides = " + LowerCtx::i64_array(one),
               cx.combiner(t, body));
}

TXC_OP("mask_put", 3,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& m = *n.operands[1];
         const Node& v = *n.operands[2];
         int64_t start = n.attr_int(0);
         if (!is_bool(m.dtype)) op_error(n, std::string("mask must be a bool tensor, got ") + dtype_name(m.dtype));
         if (start < 0 || start + m.rank() > x.rank() || m.rank() == 0)
           op_error(n, "a mask of shape " + dims_str(m.dims) + " at dim " + std::to_string(start) +
                           " does not fit a tensor of shape " + dims_str(x.dims));
         for (int i = 0; i < m.rank(); ++i)
           if (m.dims[i] != x.dims[start + i])
             op_error(n, "The shape of the mask " + dims_str(m.dims) + " at index " + std::to_string(i) +
                             " does not match the shape of the indexed tensor " + dims_str(x.dims) + " at index " +
                             std::to_string(start + i));
         if (v.rank() != x.rank() - m.rank() + 1) op_error(n, "values have the wrong rank " + dims_str(v.dims));
         for (int64_t i = 0; i < v.rank(); ++i) {
           int64_t want = i < start ? x.dims[i] : i == start ? v.dims[i] : x.dims[i + m.rank() - 1];
           if (v.dims[i] != want || (i == start && v.dims[i] == 0))
             op_error(n, "values of shape " + dims_str(v.dims) + " do not fit the masked positions");
         }
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Node& m = *n.operands[1];
         const Node& v = *n.operands[2];
         int64_t start = n.attr_int(0), K = v.dims[start];
         DType t = x.dtype;
         int64_t M = m.numel();
         std::string g;  // values spread over the mask positions, dims x.dims
         std::string vals = cx.convert(cx.in(n, 2), v.dtype, t, v.dims);
         if (K == 1) {
           Dims vd = v.dims;
           vd.erase(vd.begin() + start);
           Dims map;
           for (int64_t i = 0; i < int64_t(vd.size()); ++i) map.push_back(i < start ? i : i + m.rank());
           g = cx.broadcast_in_dim(cx.reshape(vals, t, v.dims, vd), t, vd, x.dims, map);
         } else {
           std::string mf = cx.reshape(cx.convert(cx.in(n, 1), DType::Bool, DType::I64, m.dims), DType::I64, m.dims, {M});
           std::string pos = cumulative(cx, mf, DType::I64, {M}, 0, "stablehlo.add", 0);
           pos = cx.binary("stablehlo.subtract", pos, cx.constant(1, DType::I64, {M}), DType::I64, {M});
           pos = cx.op("stablehlo.clamp", {cx.constant(0, DType::I64), pos, cx.constant(double(K - 1), DType::I64)},
                       {"tensor<i64>", LowerCtx::type(DType::I64, {M}), "tensor<i64>"}, LowerCtx::type(DType::I64, {M}));
           pos = cx.reshape(pos, DType::I64, {M}, {M, 1});
           Dims gd = v.dims, offset, slice = v.dims;
           gd[start] = M;
           slice[start] = 1;
           for (int64_t i = 0; i < v.rank(); ++i)
             if (i != start) offset.push_back(i);
           g = cx.op("stablehlo.gather", {vals, pos}, {LowerCtx::type(t, v.dims), LowerCtx::type(DType::I64, {M, 1})},
                     LowerCtx::type(t, gd), gather_props(offset, {start}, {start}, 1, slice));
           g = cx.reshape(g, t, gd, x.dims);
         }
         if (n.attr_int(1))
           g = cx.binary(is_bool(t) ? "stablehlo.or" : "stablehlo.add", cx.in(n, 0), g, t, x.dims);
         Dims map;
         for (int64_t i = 0; i < m.rank(); ++i) map.push_back(start + i);
         std::string mb = cx.broadcast_in_dim(cx.in(n, 1), DType::Bool, m.dims, x.dims, map);
         return cx.select(mb, g, cx.in(n, 0), t, x.dims);
       });

// ---- embedding backward -------------------------------------------------
// embedding_backward(grad, indices; num_weights, padding_idx): the [num_weights,
// D] table with grad rows summed at their indices; rows of padding_idx get
// nothing (padding_idx < 0: none).
TXC_OP("embedding_backward", 2,
       [](Node& n) {
         const Node& g = *n.operands[0];
         const Node& i = *n.operands[1];
         check_index_dtype(n, i);
         if (g.rank() != i.rank() + 1) op_error(n, "grad must have one more dim than indices");
         for (int d = 0; d < i.rank(); ++d)
           if (g.dims[d] != i.dims[d]) op_error(n, "grad " + dims_str(g.dims) + " does not fit indices " + dims_str(i.dims));
         n.dtype = g.dtype;
         n.dims = {n.attr_int(0), g.dims.back()};
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& g = *n.operands[0];
         const Node& i = *n.operands[1];
         int64_t N = i.numel(), D = g.dims.back(), pad = n.attr_int(1);
         DType t = g.dtype;
         std::string iv = cx.reshape(cx.convert(cx.in(n, 1), i.dtype, DType::I64, i.dims), DType::I64, i.dims, {N});
         std::string gv = cx.reshape(cx.in(n, 0), t, g.dims, {N, D});
         if (pad >= 0) {
           std::string keep = cx.compare(iv, cx.constant(double(pad), DType::I64, {N}), DType::I64, {N}, "NE");
           keep = cx.broadcast_in_dim(keep, DType::Bool, {N}, {N, D}, {0});
           gv = cx.select(keep, gv, cx.constant(0, t, {N, D}), t, {N, D});
         }
         iv = cx.reshape(iv, DType::I64, {N}, {N, 1});
         return scatter(cx, cx.constant(0, t, n.dims), iv, gv, t, n.dims, {N, 1}, {N, D},
                        scatter_props({1}, {0}, {0}, 1), "stablehlo.add");
       });

// ---- cumulative ops ---------------------------------------------------------
// cumsum/cumprod/cummax/cummin(x; dim, dtype): dtype -1 means torch's default
// (integers and bools accumulate in int64). A reduce_window over a window the
// size of dim (XLA rewrites it into an efficient scan).
OpDef cumulative_op(const char* name, const char* body, double init) {
  return OpDef{
      name, 1,
      [](Node& n) {
        const Node& x = *n.operands[0];
        int64_t dim = n.attr_int(0), want = n.attr_int(1);
        if (x.rank() == 0 ? dim != 0 : (dim < 0 || dim >= x.rank())) op_error(n, "dimension out of range");
        n.dims = x.dims;
        n.dtype = want >= 0 ? DType(want) : (is_integral(x.dtype) || is_bool(x.dtype)) ? DType::I64 : x.dtype;
      },
      [body, init](LowerCtx& cx, const Node& n) {
        const Node& x = *n.operands[0];
        // half-precision sums and products accumulate in float32, each
        // output rounded once (torch's acc_type); max/min are exact
        DType t = std::isinf(init) ? n.dtype : arith::float_compute_dtype(n.dtype);
        std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
        if (x.rank() == 0 || x.numel() == 0) return cx.convert(v, t, n.dtype, x.dims);
        double i = std::isinf(init) ? (init < 0 ? lowest_value(t) : highest_value(t)) : init;
        return cx.convert(cumulative(cx, v, t, x.dims, n.attr_int(0), body, i), t, n.dtype, x.dims);
      }};
}
TXC_OP(cumulative_op("cumsum", "stablehlo.add", 0));
TXC_OP(cumulative_op("cumprod", "stablehlo.multiply", 1));
TXC_OP(cumulative_op("cummax", "stablehlo.maximum", -INFINITY));  // pass dtype = x's; init clamps to the dtype below
TXC_OP(cumulative_op("cummin", "stablehlo.minimum", INFINITY));

// ---- sort ---------------------------------------------------------------
// sort(x; dim, descending, which): a stable sort along dim; which = 0 gives
// the values, 1 the int64 indices. NaN sorts above +inf and -0.0 equals 0.0,
// as in torch. The two halves are two nodes lowering the same sort; XLA's
// CSE merges them.
TXC_OP("sort", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         int64_t dim = n.attr_int(0);
         if (x.rank() == 0 || dim < 0 || dim >= x.rank()) op_error(n, "dimension out of range");
         n.dims = x.dims;
         n.dtype = n.attr_int(2) ? DType::I64 : x.dtype;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         int64_t dim = n.attr_int(0);
         bool desc = n.attr_int(1) != 0;
         DType t = x.dtype;
         // Compares the keys (a, b); the carried indices (the last two arguments) ride along.
         std::string region = cx.scalar_region(
             {t, t, DType::I64, DType::I64}, {DType::Bool}, [&](const std::vector<std::string>& args) {
               std::string ka = args[0], kb = args[1];
               const char* as = nullptr;
               if (is_floating(t)) {  // canonicalize -0.0 -> 0.0 and NaNs -> one NaN, then a total order
                 auto canon = [&](const std::string& v) {
                   std::string zero = cx.constant(0, t), nan = cx.constant(NAN, t);
                   std::string v1 = cx.select(cx.compare(v, zero, t, {}, "EQ"), zero, v, t, {});
                   return cx.select(cx.compare(v, v, t, {}, "NE"), nan, v1, t, {});
                 };
                 ka = canon(ka);
                 kb = canon(kb);
                 as = "TOTALORDER";
               }
               return std::vector<std::string>{cx.compare(ka, kb, t, {}, desc ? "GT" : "LT", as)};
             });
         std::string idx = iota(cx, x.dims, dim);
         std::string r = cx.op_multi("stablehlo.sort", {cx.in(n, 0), idx},
                                     {LowerCtx::type(x), LowerCtx::type(DType::I64, x.dims)},
                                     {LowerCtx::type(x), LowerCtx::type(DType::I64, x.dims)},
                                     "dimension = " + std::to_string(dim) + " : i64, is_stable = true", region);
         return r + (n.attr_int(2) ? "#1" : "#0");
       });

// ---- triangular masks and diagonals ------------------------------------------
// tri(x; diagonal, upper): tril (upper = 0) or triu (upper = 1) over the last two dims.
TXC_OP("tri", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         if (x.rank() < 2)
           op_error(n, std::string(n.attr_int(1) ? "triu" : "tril") + ": input tensor must have at least 2 dimensions");
         n.dims = x.dims;
         n.dtype = x.dtype;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         int64_t r = x.rank(), k = n.attr_int(0);
         Dims d2 = {x.dims[r - 2], x.dims[r - 1]};
         std::string row = iota(cx, d2, 0), col = iota(cx, d2, 1);
         std::string diff = cx.binary("stablehlo.subtract", col, row, DType::I64, d2);
         std::string keep = cx.compare(diff, cx.constant(double(k), DType::I64, d2), DType::I64, d2,
                                n.attr_int(1) ? "GE" : "LE");
         keep = cx.broadcast_in_dim(keep, DType::Bool, d2, x.dims, {r - 2, r - 1});
         return cx.select(keep, cx.in(n, 0), cx.constant(0, x.dtype, x.dims), x.dtype, x.dims);
       });

// diagonal(x; offset, dim1, dim2): the diagonal moved to the last dim (a view).
Dims diag_dims(const Node& n, const Node& x) {
  int64_t off = n.attr_int(0), d1 = n.attr_int(1), d2 = n.attr_int(2);
  if (d1 < 0 || d2 < 0 || d1 >= x.rank() || d2 >= x.rank() || d1 == d2)
    op_error(n, "diagonal dimensions " + std::to_string(d1) + " and " + std::to_string(d2) + " are invalid");
  int64_t len = off >= 0 ? std::min(x.dims[d1], x.dims[d2] - off) : std::min(x.dims[d1] + off, x.dims[d2]);
  Dims out;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != d1 && i != d2) out.push_back(x.dims[i]);
  out.push_back(std::max<int64_t>(len, 0));
  return out;
}
std::string diag_index(LowerCtx& cx, int64_t off, int64_t L) {  // [L, 2]: (row, col) of the diagonal
  std::string i = iota(cx, {L}, 0);
  std::string r = cx.binary("stablehlo.add", i, cx.constant(double(off < 0 ? -off : 0), DType::I64, {L}), DType::I64, {L});
  std::string c = cx.binary("stablehlo.add", i, cx.constant(double(off > 0 ? off : 0), DType::I64, {L}), DType::I64, {L});
  return index_vector(cx, {r, c}, {L});
}
Dims lead_dims(int64_t r) { return all_dims(r - 2); }

NodePtr make_op(const char* name, std::vector<NodePtr> xs, Attrs a) {
  return make_node(op_id(name), std::move(xs), std::move(a));
}

TXC_OP("diagonal", 1,
       [](Node& n) {
         n.dims = diag_dims(n, *n.operands[0]);
         n.dtype = n.operands[0]->dtype;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         int64_t off = n.attr_int(0), d1 = n.attr_int(1), d2 = n.attr_int(2), L = n.dims.back();
         Dims slice = x.dims;
         slice[d1] = slice[d2] = 1;
         // the batch dim (L) goes after the offset dims: [rest..., L]
         return cx.op("stablehlo.gather", {cx.in(n, 0), diag_index(cx, off, L)},
                      {LowerCtx::type(x), LowerCtx::type(DType::I64, {L, 2})}, LowerCtx::type(n),
                      gather_props(lead_dims(x.rank()), {std::min(d1, d2), std::max(d1, d2)}, {d1, d2}, 1, slice));
       },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make_op("diagonal_scatter", {parent, value}, view.attrs);
       },
       [](const Node& n, Dims& strides, int64_t& offset) {  // torch's diagonal view
         int64_t off = n.attr_int(0), d1 = n.attr_int(1), d2 = n.attr_int(2);
         int64_t s1 = strides[d1], s2 = strides[d2];
         if (n.dims.back() > 0) offset += off >= 0 ? off * s2 : -off * s1;
         strides.erase(strides.begin() + std::max(d1, d2));
         strides.erase(strides.begin() + std::min(d1, d2));
         strides.push_back(s1 + s2);
         return true;
       });

// diagonal_scatter(x, src; offset, dim1, dim2): x with its diagonal replaced by src.
TXC_OP("diagonal_scatter", 2,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& src = *n.operands[1];
         Dims d = diag_dims(n, x);
         if (d != src.dims)
           op_error(n, "source of shape " + dims_str(src.dims) + " does not fit the diagonal of shape " + dims_str(d));
         n.dims = x.dims;
         n.dtype = x.dtype;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Node& src = *n.operands[1];
         int64_t off = n.attr_int(0), d1 = n.attr_int(1), d2 = n.attr_int(2), L = src.dims.back();
         std::string upd = cx.convert(cx.in(n, 1), src.dtype, x.dtype, src.dims);
         return scatter(cx, cx.in(n, 0), diag_index(cx, off, L), upd, x.dtype, x.dims, {L, 2}, src.dims,
                        scatter_props(lead_dims(x.rank()), {std::min(d1, d2), std::max(d1, d2)}, {d1, d2}, 1), "");
       });

}  // namespace
}  // namespace txc

// Shape ops. View ops (reshape, permute, expand, slice, select, alias,
// as_strided) carry a scatter rule so that in-place writes through a view
// reach the storage, and a strides rule giving the strides and storage offset
// torch's view would have; the rest (slice_scatter, as_strided_scatter,
// concat, pad, flip) produce new values.
#include <numeric>
#include <unordered_map>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

NodePtr make(const char* op, std::vector<NodePtr> xs, Attrs a) {
  static std::unordered_map<std::string, uint16_t> ids;
  auto it = ids.find(op);
  if (it == ids.end()) it = ids.emplace(op, op_id(op)).first;
  return make_node(it->second, std::move(xs), std::move(a));
}

std::string unary_op(LowerCtx& cx, const Node& n, const char* hlo, const std::string& props) {
  const Node& x = *n.operands[0];
  return cx.op(hlo, {cx.in(n, 0)}, {LowerCtx::type(x)}, LowerCtx::type(n), props);
}

// torch's strides for viewing (sizes, strides) as `want` (its computeStride):
// false when some dimension of `want` spans two non-contiguous chunks.
bool reshape_strides(const Dims& sizes, const Dims& strides, const Dims& want, Dims& out) {
  out.assign(want.size(), 1);
  if (sizes.empty()) return true;  // a 0-d tensor: any shape of one element
  int64_t numel = 1;
  for (auto d : sizes) numel *= d;
  if (numel == 0) {
    if (sizes == want) {
      out = strides;
      return true;
    }
    for (size_t i = want.size(); i-- > 0;)
      out[i] = i + 1 == want.size() ? 1 : std::max<int64_t>(want[i + 1], 1) * out[i + 1];
    return true;
  }
  // Walk chunks of dims that are contiguous among themselves, right to left,
  // and give the new dims covering each chunk strides inside it.
  int64_t v = int64_t(want.size()) - 1, base = strides.back(), tn = 1, vn = 1;
  for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
    tn *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tn * base)) {
      while (v >= 0 && (vn < tn || want[v] == 1)) {
        out[v] = vn * base;
        vn *= want[v];
        --v;
      }
      if (vn != tn) return false;
      if (d > 0) {
        base = strides[d - 1];
        tn = vn = 1;
      }
    }
  }
  return v == -1;
}

// reshape(x; dims[, kept | inserted]): squeeze passes the input dims it
// keeps, unsqueeze the dim it inserts, so that the strides are those of
// torch's squeeze/unsqueeze (reshape's may differ on size-1 dims).
bool reshape_rule(const Node& n, Dims& strides, int64_t&) {
  if (n.attrs.size() > 1 && std::holds_alternative<int64_t>(n.attrs[1])) {  // unsqueeze
    int64_t d = n.attr_int(1);
    const Dims& in = n.operands[0]->dims;
    int64_t st = d >= int64_t(in.size()) ? 1 : in[d] * strides[d];
    strides.insert(strides.begin() + d, st);
    return true;
  }
  if (n.attrs.size() > 1) {  // squeeze
    const Dims& kept = n.attr_dims(1);
    Dims out(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) out[i] = strides[kept[i]];
    strides = std::move(out);
    return true;
  }
  Dims out;
  if (!reshape_strides(n.operands[0]->dims, strides, n.dims, out)) return false;
  strides = std::move(out);
  return true;
}
TXC_OP("reshape", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         n.dtype = x.dtype;
         // One -1 is inferred (written back, before hashing, so the node is canonical).
         Dims& want = std::get<Dims>(n.attrs.at(0));
         int infer = -1;
         int64_t known = 1;
         for (size_t i = 0; i < want.size(); ++i) {
           if (want[i] == -1 && infer < 0) infer = int(i);
           else if (want[i] == -1) op_error(n, "only one dimension can be inferred");
           else if (want[i] < 0) op_error(n, "invalid shape dimension " + std::to_string(want[i]));
           else known *= want[i];
         }
         if (infer >= 0) {
           if (known == 0 && x.numel() == 0)  // torch's wording (infer_size)
             op_error(n, "cannot reshape tensor of 0 elements into shape " + dims_str(want) +
                             " because the unspecified dimension size -1 can be any value and is ambiguous");
           if (known == 0 || x.numel() % known)
             op_error(n, "shape " + dims_str(want) + " is invalid for input of size " + std::to_string(x.numel()));
           want[infer] = x.numel() / known;
         }
         n.dims = want;
         int64_t numel = 1;
         for (auto d : n.dims) numel *= d;
         if (numel != x.numel())
           op_error(n, "shape " + dims_str(n.dims) + " is invalid for input of size " + std::to_string(x.numel()) +
                           " (shape " + dims_str(x.dims) + ")");
       },
       [](LowerCtx& cx, const Node& n) { return cx.reshape(cx.in(n, 0), n.dtype, n.operands[0]->dims, n.dims); },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make("reshape", {value}, {parent->dims});
       },
       reshape_rule);

// permute(x; perm)
Dims inverse_perm(const Dims& p) {
  Dims inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = int64_t(i);
  return inv;
}
TXC_OP("permute", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Dims& p = n.attr_dims(0);
         if (int(p.size()) != x.rank())
           op_error(n, "permutation " + dims_str(p) + " does not match a tensor of rank " + std::to_string(x.rank()));
         std::vector<bool> seen(p.size());
         n.dtype = x.dtype;
         n.dims.resize(p.size());
         for (size_t i = 0; i < p.size(); ++i) {
           if (p[i] < 0 || p[i] >= x.rank() || seen[p[i]]) op_error(n, "invalid permutation " + dims_str(p));
           seen[p[i]] = true;
           n.dims[i] = x.dims[p[i]];
         }
       },
       [](LowerCtx& cx, const Node& n) {
         return unary_op(cx, n, "stablehlo.transpose", "permutation = " + LowerCtx::i64_array(n.attr_dims(0)));
       },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make("permute", {value}, {inverse_perm(view.attr_dims(0))});
       },
       [](const Node& n, Dims& strides, int64_t&) {
         const Dims& p = n.attr_dims(0);
         Dims out(p.size());
         for (size_t i = 0; i < p.size(); ++i) out[i] = strides[p[i]];
         strides = std::move(out);
         return true;
       });

// expand(x; dims): numpy-style broadcast to dims (no write-back: one element
// would be written many times).
TXC_OP("expand", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Dims& d = n.attr_dims(0);
         if (d.size() < x.dims.size())
           op_error(n, "cannot expand shape " + dims_str(x.dims) + " to " + dims_str(d));
         size_t off = d.size() - x.dims.size();
         for (size_t i = 0; i < x.dims.size(); ++i)
           if (x.dims[i] != 1 && x.dims[i] != d[off + i])
             op_error(n, "cannot expand shape " + dims_str(x.dims) + " to " + dims_str(d));
         n.dtype = x.dtype;
         n.dims = d;
       },
       [](LowerCtx& cx, const Node& n) { return cx.broadcast(cx.in(n, 0), n.dtype, n.operands[0]->dims, n.dims); },
       nullptr,
       [](const Node& n, Dims& strides, int64_t&) {  // torch's inferExpandGeometry
         const Dims& in = n.operands[0]->dims;
         int64_t off = int64_t(n.dims.size() - in.size());
         Dims out(n.dims.size());
         for (int64_t i = int64_t(n.dims.size()) - 1; i >= 0; --i) {
           int64_t d = i - off;
           int64_t size = d >= 0 ? in[d] : 1;
           int64_t st = d >= 0 ? strides[d] : i + 1 < int64_t(n.dims.size()) ? n.dims[i + 1] * out[i + 1] : 1;
           out[i] = size != n.dims[i] ? 0 : st;
         }
         strides = std::move(out);
         return true;
       });

// alias(x): the same value (detach, alias, .data).
TXC_OP("alias", 1,
       [](Node& n) {
         n.dtype = n.operands[0]->dtype;
         n.dims = n.operands[0]->dims;
       },
       [](LowerCtx& cx, const Node& n) { return cx.in(n, 0); },
       [](const Node&, NodePtr, NodePtr value) { return value; },
       [](const Node&, Dims&, int64_t&) { return true; });

// slice(x; dim, start, end, step) with start/end already clamped by the caller.
void slice_infer(Node& n) {
  const Node& x = *n.operands[0];
  int64_t dim = n.attr_int(0), start = n.attr_int(1), end = n.attr_int(2), step = n.attr_int(3);
  if (dim < 0 || dim >= x.rank()) op_error(n, "dimension " + std::to_string(dim) + " out of range");
  if (step <= 0) op_error(n, "slice step must be positive");
  if (start < 0 || end > x.dims[dim] || start > end)
    op_error(n, "slice [" + std::to_string(start) + ":" + std::to_string(end) + "] out of range for size " +
                    std::to_string(x.dims[dim]));
  n.dtype = x.dtype;
  n.dims = x.dims;
  n.dims[dim] = (end - start + step - 1) / step;
}
std::string slice_lower(LowerCtx& cx, const Node& n, const Node& x, const std::string& v) {
  int64_t dim = n.attr_int(0), start = n.attr_int(1), step = n.attr_int(3);
  Dims lo(x.rank(), 0), hi = x.dims, st(x.rank(), 1);
  lo[dim] = start;
  hi[dim] = start + (n.dims[dim] == 0 ? 0 : (n.dims[dim] - 1) * step + 1);
  st[dim] = step;
  Dims out = x.dims;
  out[dim] = n.dims[dim];
  return cx.op("stablehlo.slice", {v}, {LowerCtx::type(x)}, LowerCtx::type(x.dtype, out),
               "limit_indices = " + LowerCtx::i64_array(hi) + ", start_indices = " + LowerCtx::i64_array(lo) +
                   ", strides = " + LowerCtx::i64_array(st));
}
TXC_OP("slice", 1, slice_infer,
       [](LowerCtx& cx, const Node& n) { return slice_lower(cx, n, *n.operands[0], cx.in(n, 0)); },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make("slice_scatter", {parent, value}, view.attrs);
       },
       [](const Node& n, Dims& strides, int64_t& offset) {
         int64_t dim = n.attr_int(0);
         offset += n.attr_int(1) * strides[dim];
         strides[dim] *= n.attr_int(3);
         return true;
       });

// select(x; dim, index): index already wrapped and checked by the caller.
TXC_OP("select", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         int64_t dim = n.attr_int(0), idx = n.attr_int(1);
         if (dim < 0 || dim >= x.rank()) op_error(n, "dimension " + std::to_string(dim) + " out of range");
         if (idx < 0 || idx >= x.dims[dim])
           op_error(n, "index " + std::to_string(idx) + " is out of bounds for dimension " + std::to_string(dim) +
                           " with size " + std::to_string(x.dims[dim]));
         n.dtype = x.dtype;
         n.dims = x.dims;
         n.dims.erase(n.dims.begin() + dim);
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         int64_t dim = n.attr_int(0), idx = n.attr_int(1);
         Node s;  // the equivalent one-wide slice
         s.attrs = {dim, idx, idx + 1, int64_t(1)};
         s.dims = x.dims;
         s.dims[dim] = 1;
         std::string v = slice_lower(cx, s, x, cx.in(n, 0));
         return cx.reshape(v, n.dtype, s.dims, n.dims);
       },
       [](const Node& view, NodePtr parent, NodePtr value) {
         int64_t dim = view.attr_int(0), idx = view.attr_int(1);
         Dims d = parent->dims;
         d[dim] = 1;
         auto v = make("reshape", {value}, {d});
         return make("slice_scatter", {parent, v}, {dim, idx, idx + 1, int64_t(1)});
       },
       [](const Node& n, Dims& strides, int64_t& offset) {
         int64_t dim = n.attr_int(0);
         offset += n.attr_int(1) * strides[dim];
         strides.erase(strides.begin() + dim);
         return true;
       });

// slice_scatter(base, src; dim, start, end, step): base with the slice replaced by src.
TXC_OP("slice_scatter", 2,
       [](Node& n) {
         const Node& base = *n.operands[0];
         const Node& src = *n.operands[1];
         Node s;
         s.operands = {n.operands[0]};
         s.attrs = n.attrs;
         s.op = n.op;
         slice_infer(s);
         if (s.dims != src.dims)
           op_error(n, "source of shape " + dims_str(src.dims) + " does not fit the slice of shape " + dims_str(s.dims));
         n.dtype = base.dtype;
         n.dims = base.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& base = *n.operands[0];
         const Node& src = *n.operands[1];
         int64_t dim = n.attr_int(0), start = n.attr_int(1), step = n.attr_int(3);
         std::string sv = cx.convert(cx.in(n, 1), src.dtype, base.dtype, src.dims);
         std::string ty = LowerCtx::type(base);
         if (step == 1) {
           std::vector<std::string> args = {cx.in(n, 0), sv};
           std::vector<std::string> types = {ty, LowerCtx::type(base.dtype, src.dims)};
           for (int i = 0; i < base.rank(); ++i) {
             args.push_back(cx.constant(i == dim ? start : 0, DType::I64));
             types.push_back("tensor<i64>");
           }
           return cx.op("stablehlo.dynamic_update_slice", args, types, ty);
         }
         // Strided: spread src with interior padding, and select it where a mask says so.
         int64_t cnt = src.dims[dim];
         Dims lo(base.rank(), 0), hi(base.rank(), 0), in(base.rank(), 0);
         lo[dim] = start;
         in[dim] = step - 1;
         hi[dim] = base.dims[dim] - (start + (cnt == 0 ? 0 : (cnt - 1) * step + 1));
         std::string props = "edge_padding_high = " + LowerCtx::i64_array(hi) +
                             ", edge_padding_low = " + LowerCtx::i64_array(lo) +
                             ", interior_padding = " + LowerCtx::i64_array(in);
         std::string padded = cx.op("stablehlo.pad", {sv, cx.constant(0, base.dtype)},
                                    {LowerCtx::type(base.dtype, src.dims), LowerCtx::type(base.dtype, {})}, ty, props);
         std::string mask = cx.op("stablehlo.pad", {cx.constant(1, DType::Bool, src.dims), cx.constant(0, DType::Bool)},
                                  {LowerCtx::type(DType::Bool, src.dims), LowerCtx::type(DType::Bool, {})},
                                  LowerCtx::type(DType::Bool, base.dims), props);
         return cx.op("stablehlo.select", {mask, padded, cx.in(n, 0)},
                      {LowerCtx::type(DType::Bool, base.dims), ty, ty}, ty);
       });

// as_strided(x; sizes, strides, offset): torch's as_strided over x read as
// its contiguous buffer (x is a storage's whole value: LazyTensor::root()).
void as_strided_check(const Node& n, const Node& x) {
  const Dims &size = n.attr_dims(0), &stride = n.attr_dims(1);
  int64_t offset = n.attr_int(2);
  if (size.size() != stride.size())
    op_error(n, "mismatch in length of strides and shape (" + dims_str(size) + " vs " + dims_str(stride) + ")");
  int64_t last = offset, numel = 1;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] < 0) op_error(n, "negative size " + std::to_string(size[i]) + " in " + dims_str(size));
    if (stride[i] < 0) op_error(n, "negative strides are not supported, got strides: " + dims_str(stride));
    numel *= size[i];
    last += (size[i] - 1) * stride[i];
  }
  if (offset < 0) op_error(n, "negative storage offset " + std::to_string(offset));
  if (numel > 0 && last >= x.numel())
    op_error(n, "sizes " + dims_str(size) + ", strides " + dims_str(stride) + " and storage offset " +
                    std::to_string(offset) + " reach element " + std::to_string(last) +
                    ", out of bounds for a storage of " + std::to_string(x.numel()) + " elements");
}
// [sizes..., 1] int64: the flat position of every element.
std::string as_strided_index(LowerCtx& cx, const Node& n, const Dims& size) {
  const Dims& stride = n.attr_dims(1);
  std::string idx = cx.constant(double(n.attr_int(2)), DType::I64, size);
  std::string ty = LowerCtx::type(DType::I64, size);
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == 1 || stride[i] == 0) continue;
    std::string io = cx.op("stablehlo.iota", {}, {}, ty, "iota_dimension = " + std::to_string(i) + " : i64");
    io = cx.op("stablehlo.multiply", {io, cx.constant(double(stride[i]), DType::I64, size)}, {ty, ty}, ty);
    idx = cx.op("stablehlo.add", {idx, io}, {ty, ty}, ty);
  }
  Dims s1 = size;
  s1.push_back(1);
  return cx.reshape(idx, DType::I64, size, s1);
}
TXC_OP("as_strided", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         as_strided_check(n, x);
         n.dtype = x.dtype;
         n.dims = n.attr_dims(0);
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         if (n.numel() == 0) return cx.constant(0, n.dtype, n.dims);
         Dims flat = {x.numel()}, s1 = n.dims;
         s1.push_back(1);
         std::string xf = cx.reshape(cx.in(n, 0), x.dtype, x.dims, flat);
         return cx.op("stablehlo.gather", {xf, as_strided_index(cx, n, n.dims)},
                      {LowerCtx::type(x.dtype, flat), LowerCtx::type(DType::I64, s1)}, LowerCtx::type(n),
                      "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
                      "index_vector_dim = " + std::to_string(n.dims.size()) +
                          ">, indices_are_sorted = false, slice_sizes = array<i64: 1>");
       },
       [](const Node& view, NodePtr parent, NodePtr value) {
         return make("as_strided_scatter", {parent, value}, view.attrs);
       },
       [](const Node& n, Dims& strides, int64_t& offset) {
         strides = n.attr_dims(1);
         offset = n.attr_int(2);
         return true;
       });

// as_strided_scatter(x, src; sizes, strides, offset): x (read as its
// contiguous buffer) with as_strided(x; ...) replaced by src.
TXC_OP("as_strided_scatter", 2,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& src = *n.operands[1];
         as_strided_check(n, x);
         if (src.dims != n.attr_dims(0))
           op_error(n, "source of shape " + dims_str(src.dims) + " does not fit the view of shape " +
                           dims_str(n.attr_dims(0)));
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         const Node& src = *n.operands[1];
         if (src.numel() == 0) return cx.in(n, 0);
         Dims flat = {x.numel()}, s1 = src.dims;
         s1.push_back(1);
         std::string ft = LowerCtx::type(x.dtype, flat), st = LowerCtx::type(x.dtype, {});
         std::string xf = cx.reshape(cx.in(n, 0), x.dtype, x.dims, flat);
         std::string upd = cx.convert(cx.in(n, 1), src.dtype, x.dtype, src.dims);
         std::string idx = as_strided_index(cx, n, src.dims);
         std::string a = cx.fresh(), b = cx.fresh();
         std::string region = "(" + cx.region_text({a, b}, {st, st}, [&] {
           cx.body_.append(cx.indent_, ' ');
           cx.body_ += "\"stablehlo.return\"(" + b + ") : (" + st + ") -> ()\n";
         }) + ")";
         std::string r = cx.op("stablehlo.scatter", {xf, idx, upd},
                               {ft, LowerCtx::type(DType::I64, s1), LowerCtx::type(x.dtype, src.dims)}, ft,
                               "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<"
                               "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = " +
                                   std::to_string(src.dims.size()) + ">, unique_indices = false",
                               region);
         return cx.reshape(r, x.dtype, flat, x.dims);
       });

// concat(xs...; dim): operands promote to a common dtype.
TXC_OP("concat", -1,
       [](Node& n) {
         if (n.operands.empty()) op_error(n, "expected a non-empty list of tensors");
         for (size_t i = 0; i < n.operands.size(); ++i)
           if (n.operands[i]->rank() == 0)
             op_error(n, "zero-dimensional tensor (at position " + std::to_string(i) + ") cannot be concatenated");
         const Dims& d0 = n.operands[0]->dims;
         int64_t dim = n.attr_int(0);
         if (dim < 0 || dim >= int64_t(d0.size())) op_error(n, "dimension " + std::to_string(dim) + " out of range");
         n.dims = d0;
         n.dims[dim] = 0;
         DType t = n.operands[0]->dtype;
         for (const auto& o : n.operands) {
           if (o->rank() != int(d0.size())) op_error(n, "tensors must have the same rank");
           for (int i = 0; i < o->rank(); ++i)
             if (i != dim && o->dims[i] != d0[i])
               op_error(n, "sizes of tensors must match except in dimension " + std::to_string(dim) + ": " +
                               dims_str(d0) + " vs " + dims_str(o->dims));
           n.dims[dim] += o->dims[dim];
           t = promote_types(t, o->dtype);
         }
         n.dtype = t;
       },
       [](LowerCtx& cx, const Node& n) {
         std::vector<std::string> args, types;
         for (size_t i = 0; i < n.operands.size(); ++i) {
           const Node& o = *n.operands[i];
           args.push_back(cx.convert(cx.in(n, i), o.dtype, n.dtype, o.dims));
           types.push_back(LowerCtx::type(n.dtype, o.dims));
         }
         return cx.op("stablehlo.concatenate", args, types, LowerCtx::type(n),
                      "dimension = " + std::to_string(n.attr_int(0)) + " : i64");
       });

// pad(x; lo, hi, value): constant padding; negative pads crop.
TXC_OP("pad", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Dims &lo = n.attr_dims(0), &hi = n.attr_dims(1);
         if (int(lo.size()) != x.rank() || int(hi.size()) != x.rank()) op_error(n, "padding must cover every dim");
         n.dtype = x.dtype;
         n.dims = x.dims;
         for (int i = 0; i < x.rank(); ++i) {
           n.dims[i] += lo[i] + hi[i];
           if (n.dims[i] < 0) op_error(n, "padding makes dimension " + std::to_string(i) + " negative");
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         Dims in(x.rank(), 0);
         // attribute 3, when present: the imaginary part of a complex padding value
         std::string value = n.attrs.size() > 3 && is_complex(x.dtype)
                                 ? cx.complex_constant(n.attr_float(2), n.attr_float(3), x.dtype)
                                 : cx.constant(n.attr_float(2), x.dtype);
         return cx.op("stablehlo.pad", {cx.in(n, 0), value},
                      {LowerCtx::type(x), LowerCtx::type(x.dtype, {})}, LowerCtx::type(n),
                      "edge_padding_high = " + LowerCtx::i64_array(n.attr_dims(1)) +
                          ", edge_padding_low = " + LowerCtx::i64_array(n.attr_dims(0)) +
                          ", interior_padding = " + LowerCtx::i64_array(in));
       });

// flip(x; dims): distinct dims in range (a 0-d tensor takes none)
TXC_OP("flip", 1,
       [](Node& n) {
         const Dims& dims = n.attr_dims(0);
         std::vector<bool> seen(size_t(n.operands[0]->rank()));
         for (auto d : dims) {
           if (d < 0 || d >= n.operands[0]->rank() || seen[size_t(d)])
             op_error(n, "invalid dims " + dims_str(dims) + " for a tensor of rank " +
                             std::to_string(n.operands[0]->rank()) + " (each in range, none twice)");
           seen[size_t(d)] = true;
         }
         n.dtype = n.operands[0]->dtype;
         n.dims = n.operands[0]->dims;
       },
       [](LowerCtx& cx, const Node& n) {
         return unary_op(cx, n, "stablehlo.reverse", "dimensions = " + LowerCtx::i64_array(n.attr_dims(0)));
       });

}  // namespace
}  // namespace txc

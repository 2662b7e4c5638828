// StableHLO text emission (see emitter.h).
#include "lower/emitter.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>
#include "ir/memory.h"
#include "ir/op.h"

namespace txc {

namespace {
thread_local std::string t_precision_hlo = "HIGHEST";  // of the lowering under way on this thread

std::string precision_hlo(const std::string& torch_name) {
  if (torch_name == "highest") return "HIGHEST";
  if (torch_name == "high") return "HIGH";
  if (torch_name == "medium") return "DEFAULT";
  throw std::invalid_argument("float32 matmul precision must be 'highest', 'high' or 'medium', got '" +
                              torch_name + "' (torch.set_float32_matmul_precision)");
}
}  // namespace

std::string precision_config(DType t) {
  // Only float32 products have a choice in torch; others use the default.
  const std::string p = t == DType::F32 || t == DType::C64 ? t_precision_hlo : std::string("DEFAULT");
  return ", precision_config = [#stablehlo<precision " + p + ">, #stablehlo<precision " + p + ">]";
}

std::string LowerCtx::type(DType t, const Dims& d) {
  std::string s = "tensor<";
  for (auto x : d) s += std::to_string(x) + "x";
  return s + mlir_name(t) + ">";
}

std::string LowerCtx::i64_array(const Dims& d) {
  std::string s = "array<i64";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : ": ") + std::to_string(d[i]);
  return s + ">";
}

void LowerCtx::add_funcs(const std::string& key, const std::string& text) {
  for (const auto& f : funcs_)
    if (f.first == key) return;
  funcs_.emplace_back(key, text);
}

std::string LowerCtx::fresh() { return "%v" + std::to_string(counter_++); }

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::string LowerCtx::op(const std::string& name, const std::vector<std::string>& args,
                         const std::vector<std::string>& arg_types, const std::string& result_type,
                         const std::string& props, const std::string& region) {
  std::string r = fresh();
  body_.append(indent_, ' ');
  body_ += r + " = \"" + name + "\"(" + join(args) + ")";
  if (!props.empty()) body_ += " <{" + props + "}>";
  if (!region.empty()) body_ += " " + region;
  body_ += " : (" + join(arg_types) + ") -> " + result_type + "\n";
  return r;
}

std::string LowerCtx::op_multi(const std::string& name, const std::vector<std::string>& args,
                               const std::vector<std::string>& arg_types,
                               const std::vector<std::string>& result_types, const std::string& props,
                               const std::string& region) {
  std::string r = fresh();
  body_.append(indent_, ' ');
  body_ += r + ":" + std::to_string(result_types.size()) + " = \"" + name + "\"(" + join(args) + ")";
  if (!props.empty()) body_ += " <{" + props + "}>";
  if (!region.empty()) body_ += " " + region;
  body_ += " : (" + join(arg_types) + ") -> (" + join(result_types) + ")\n";
  return r;
}

std::string LowerCtx::convert(const std::string& v, DType from, DType to, const Dims& d) {
  if (from == to) return v;
  // torch: nonzero -> true; stablehlo.convert agrees, but be explicit
  if (to == DType::Bool) return compare(v, constant(0, from, d), from, d, "NE");
  if (is_complex(from) && !is_complex(to)) {  // torch keeps the real part
    DType part = real_part_dtype(from);
    std::string re = op("stablehlo.real", {v}, {type(from, d)}, type(part, d));
    return convert(re, part, to, d);
  }
  if (is_floating(from) && is_integral(to)) return float_to_int(v, from, to, d);
  return op("stablehlo.convert", {v}, {type(from, d)}, type(to, d));
}

// Floating -> integer as torch's CPU kernels on x86 (cvttss2si/cvttsd2si):
// truncation; NaN and values out of the range of the instruction's int32 or
// int64 give its lowest value, which int8/int16 (through int32) and uint8
// (through int64) then wrap, as C++'s narrowing does. stablehlo.convert
// saturates instead (NaN -> 0, inf -> the highest value).
std::string LowerCtx::float_to_int(const std::string& v, DType from, DType to, const Dims& d) {
  DType wide = to == DType::I64 || to == DType::U8 ? DType::I64 : DType::I32;
  DType f = from == DType::F64 ? DType::F64 : DType::F32;  // f16/bf16 widen exactly
  std::string x = from == f ? v : op("stablehlo.convert", {v}, {type(from, d)}, type(f, d));
  double lim = wide == DType::I64 ? 9223372036854775808.0 : 2147483648.0;
  std::string ok = binary("stablehlo.and", compare(x, constant(-lim, f, d), f, d, "GE"),
                          compare(x, constant(lim, f, d), f, d, "LT"), DType::Bool, d);
  std::string w = select(ok, op("stablehlo.convert", {x}, {type(f, d)}, type(wide, d)), constant(-lim, wide, d),
                         wide, d);
  return wide == to ? w : op("stablehlo.convert", {w}, {type(wide, d)}, type(to, d));
}

std::string LowerCtx::broadcast_in_dim(const std::string& v, DType t, const Dims& from, const Dims& to,
                                       const Dims& map) {
  if (from == to) return v;
  return op("stablehlo.broadcast_in_dim", {v}, {type(t, from)}, type(t, to),
            "broadcast_dimensions = " + i64_array(map));
}

std::string LowerCtx::broadcast(const std::string& v, DType t, const Dims& from, const Dims& to) {
  if (from == to) return v;
  Dims map(from.size());
  for (size_t i = 0; i < from.size(); ++i) map[i] = int64_t(to.size() - from.size() + i);
  // Size-1 dims that expand: broadcast_in_dim allows operand dim 1 -> any size.
  return broadcast_in_dim(v, t, from, to, map);
}

std::string LowerCtx::reshape(const std::string& v, DType t, const Dims& from, const Dims& to) {
  if (from == to) return v;
  return op("stablehlo.reshape", {v}, {type(t, from)}, type(t, to));
}

std::string LowerCtx::literal(double v, DType t) {
  // A complex element is "(re, im)" (MLIR's dense complex literal).
  if (is_complex(t)) return complex_literal(v, 0, t);
  char buf[64];
  if (t == DType::Bool) return v != 0 ? "true" : "false";
  if (is_integral(t)) {
    // Saturate: int64's highest value is 2^63 as a double, and converting
    // that to long long is undefined (x86 gives the lowest value).
    long long i = v >= 9223372036854775807.0 ? LLONG_MAX : v <= -9223372036854775808.0 ? LLONG_MIN : (long long)v;
    // unsigned: modulo 2^bits, as a C cast of the integer (torch fills uint8 with -2 as 254); MLIR refuses "-2"
    if (is_unsigned(t)) i &= (1LL << bit_width(t)) - 1;
    std::snprintf(buf, sizeof buf, "%lld", i);
    return buf;
  }
  if (std::isnan(v) || std::isinf(v)) {
    bool neg = std::signbit(v);
    const char* s = nullptr;
    switch (t) {
      case DType::F16: s = std::isnan(v) ? "0x7E00" : neg ? "0xFC00" : "0x7C00"; break;
      case DType::BF16: s = std::isnan(v) ? "0x7FC0" : neg ? "0xFF80" : "0x7F80"; break;
      case DType::F32: s = std::isnan(v) ? "0x7FC00000" : neg ? "0xFF800000" : "0x7F800000"; break;
      default: s = std::isnan(v) ? "0x7FF8000000000000" : neg ? "0xFFF0000000000000" : "0x7FF0000000000000";
    }
    return s;
  }
  std::snprintf(buf, sizeof buf, "%.17e", v);
  return buf;
}

std::string LowerCtx::complex_literal(double re, double im, DType t) {
  DType part = real_part_dtype(t);
  return "(" + literal(re, part) + ", " + literal(im, part) + ")";
}

std::string LowerCtx::complex_constant(double re, double im, DType t, const Dims& d) {
  std::string c = op("stablehlo.constant", {}, {}, type(t, {}),
                     "value = dense<" + complex_literal(re, im, t) + "> : " + type(t, {}));
  return broadcast(c, t, {}, d);
}

std::string LowerCtx::constant(double v, DType t, const Dims& d) {
  std::string c = op("stablehlo.constant", {}, {}, type(t, {}),
                     "value = dense<" + literal(v, t) + "> : " + type(t, {}));
  return broadcast(c, t, {}, d);
}

std::string LowerCtx::coerce(const Node& n, size_t i, DType t, const Dims& d) {
  const Node& o = *n.operands.at(i);
  std::string v = convert(in(n, i), o.dtype, t, o.dims);
  return broadcast(v, t, o.dims, d);
}

std::string LowerCtx::reduce(const std::string& v, DType t, const Dims& in_dims, const Dims& axes,
                             const std::string& body_op, double init) {
  if (axes.empty()) return v;
  Dims out;
  for (size_t i = 0; i < in_dims.size(); ++i) {
    bool r = false;
    for (auto a : axes) r |= a == int64_t(i);
    if (!r) out.push_back(in_dims[i]);
  }
  std::string st = type(t, {});
  return op("stablehlo.reduce", {v, constant(init, t)}, {type(t, in_dims), st}, type(t, out),
            "dimensions = " + i64_array(axes), combiner(t, body_op));
}

// A node's op's lowering rule; a value of no elements is a constant of its
// type (nothing to compute, and XLA refuses some ops on zero-size operands,
// a gather's slice of size 1 out of a dim of size 0).
std::string LowerCtx::lower_node(const Node& n) {
  const OpDef& def = op_def(n.op);
  if (!def.lower) throw std::runtime_error("core op '" + def.name + "' has no lowering");
  if (n.numel() == 0) return constant(0, n.dtype, n.dims);
  std::string r = def.lower(*this, n);
  if (def.ordered) last_ordered_ = {r, &n};
  return r;
}

std::string LowerCtx::ordered_in(const Node& n, size_t i) {
  const std::string& v = in(n, i);
  const Node* prev = last_ordered_.second;
  if (prev == nullptr || prev->numel() == 0) return v;  // nothing before it, or a constant (no elements)
  // z: an int32 0 computed from the previous result's first element, which
  // XLA cannot prove is 0 (a popcount is at most 32; 32 >> 6 == 0), so it
  // keeps the dependency; v | z (on the bits of a floating v) is v, bit for
  // bit (complex: v - z, the same value).
  DType pd = prev->dtype;
  std::string first = last_ordered_.first;
  if (!prev->dims.empty()) {
    Dims zeros(prev->dims.size(), 0), ones(prev->dims.size(), 1);
    first = op("stablehlo.slice", {first}, {type(*prev)}, type(pd, ones),
               "start_indices = " + i64_array(zeros) + ", limit_indices = " + i64_array(ones) +
                   ", strides = " + i64_array(ones));
    first = op("stablehlo.reshape", {first}, {type(pd, ones)}, type(pd, {}));
  }
  if (is_complex(pd)) {
    first = op("stablehlo.real", {first}, {type(pd, {})}, type(real_part_dtype(pd), {}));
    pd = real_part_dtype(pd);
  }
  const std::string i32 = type(DType::I32, {});
  std::string z = pd == DType::I32 ? first : op("stablehlo.convert", {first}, {type(pd, {})}, i32);
  z = op("stablehlo.popcnt", {z}, {i32}, i32);
  z = op("stablehlo.shift_right_logical", {z, constant(6, DType::I32)}, {i32, i32}, i32);
  const Node& x = *n.operands.at(i);
  // v | z on v's bits (a floating v as the integer of its width), v - z for complex
  DType bits = x.dtype == DType::F16 || x.dtype == DType::BF16 ? DType::I16
               : x.dtype == DType::F32                        ? DType::I32
               : x.dtype == DType::F64                        ? DType::I64
                                                              : x.dtype;
  if (bits != DType::I32) z = op("stablehlo.convert", {z}, {i32}, type(bits, {}));
  z = broadcast(z, bits, {}, x.dims);
  if (is_complex(x.dtype)) return op("stablehlo.subtract", {v, z}, {type(x), type(x)}, type(x));
  std::string w = bits == x.dtype ? v : op("stablehlo.bitcast_convert", {v}, {type(x)}, type(bits, x.dims));
  w = op("stablehlo.or", {w, z}, {type(bits, x.dims), type(bits, x.dims)}, type(bits, x.dims));
  return bits == x.dtype ? w : op("stablehlo.bitcast_convert", {w}, {type(bits, x.dims)}, type(x));
}

std::vector<std::string> LowerCtx::lower_body(const Body& b, const std::vector<std::string>& args) {
  if (args.size() != b.params.size())
    throw std::runtime_error("lower_body: " + std::to_string(args.size()) + " arguments for a body of " +
                             std::to_string(b.params.size()) + " parameters");
  for (size_t i = 0; i < b.params.size(); ++i) set_name(b.params[i].get(), args[i]);
  auto outer_ordered = std::exchange(last_ordered_, {});  // a body's ordered ops chain among themselves
  for (const Node* n : b.order) {
    if (named(n)) continue;  // a parameter
    set_name(n, lower_node(*n));
  }
  last_ordered_ = std::move(outer_ordered);
  std::vector<std::string> outs;
  for (const auto& o : b.outputs) outs.push_back(name_of(o.get()));
  for (const Node* n : b.order) ids_.erase(n);  // the body may be lowered again (another loop over it)
  return outs;
}

std::string LowerCtx::region_text(const std::vector<std::string>& args, const std::vector<std::string>& types,
                                  const std::function<void()>& emit) {
  std::string saved;
  saved.swap(body_);
  std::unordered_map<std::string, std::string> saved_memo;
  saved_memo.swap(memo_);
  int outer = indent_;
  std::string head(outer, ' ');
  body_ = head + "^bb0(";
  for (size_t i = 0; i < args.size(); ++i) body_ += (i ? ", " : "") + args[i] + ": " + types[i];
  body_ += "):\n";
  indent_ = outer + 2;
  try {
    emit();
  } catch (...) {
    indent_ = outer;
    body_.swap(saved);
    memo_.swap(saved_memo);
    throw;
  }
  indent_ = outer;
  std::string r = "{\n" + body_ + head + "}";
  body_.swap(saved);
  memo_.swap(saved_memo);
  return r;
}

// Written out here rather than through LowerCtx::op (whose signature is part
// of the extension API, csrc/ext/extension.h): this op also needs an
// attribute dictionary after its properties.
std::string annotate_placement(LowerCtx& cx, const std::string& v, const std::string& type, int kind) {
  std::string r = cx.fresh();
  cx.body_.append(size_t(cx.indent_), ' ');
  cx.body_ += r + " = \"stablehlo.custom_call\"(" + v +
              ") <{call_target_name = \"annotate_device_placement\", has_side_effect = true, api_version = 1 : i32}>"
              " {mhlo.frontend_attributes = {_xla_buffer_placement = \"" + memory_kind_name(kind) + "\"}} : (" +
              type + ") -> " + type + "\n";
  return r;
}

std::string LowerCtx::memo(const std::string& key, const std::function<std::string()>& make) {
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  std::string v = make();
  memo_[key] = v;
  return v;
}

// The order lower_graph emits the walk's nodes in (indices into order): the
// walk's post-order, or with two or more ordered ops (collectives) the order
// the nodes were built in (Node::seq; an operand is built before its users,
// so this is an order of the graph too), which puts the ordered ops in trace
// order for ordered_in's chain.
static std::vector<size_t> emission_order(const std::vector<const Node*>& order) {
  std::vector<size_t> idx(order.size());
  for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  size_t ordered = 0;
  for (const Node* n : order) ordered += op_def(n->op).ordered;
  if (ordered >= 2)
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return order[a]->seq < order[b]->seq; });
  return idx;
}

std::string lower_graph(const std::vector<const Node*>& order, const std::vector<const Node*>& params,
                        const std::vector<const Node*>& outputs, const LowerOptions& options,
                        std::vector<int>* line_node, const std::vector<std::pair<const Node*, int>>* shared) {
  struct PrecisionScope {
    std::string saved = t_precision_hlo;
    explicit PrecisionScope(const std::string& p) { t_precision_hlo = p; }
    ~PrecisionScope() { t_precision_hlo = saved; }
  } precision(precision_hlo(options.precision));
  LowerCtx cx;
  cx.names_.reserve(order.size());
  std::vector<int> alias_of(params.size(), -1);
  for (auto [p, o] : options.aliases) alias_of.at(size_t(p)) = o;
  std::string sig;
  std::vector<int> host_params;
  for (size_t i = 0; i < params.size(); ++i) {
    const Node* p = params[i];
    cx.set_name(p, "%arg" + std::to_string(i));
    sig += (i ? ", " : "") + cx.names_.back() + ": " + LowerCtx::type(*p);
    std::string attrs;
    if (alias_of[i] >= 0) attrs = "tf.aliasing_output = " + std::to_string(alias_of[i]) + " : i32";
    if (i < options.param_shardings.size() && !options.param_shardings[i].empty())
      attrs += std::string(attrs.empty() ? "" : ", ") + "mhlo.sharding = \"" + options.param_shardings[i] + "\"";
    if (p->memory != kDevice) {
      // A buffer on the host: declared so, and brought to the device for its uses.
      attrs += std::string(attrs.empty() ? "" : ", ") + "mhlo.memory_kind = \"" + memory_kind_name(p->memory) + "\"";
      host_params.push_back(int(i));
    }
    if (!attrs.empty()) sig += " {" + attrs + "}";
  }
  for (size_t j = 0; j < options.unread_aliases.size(); ++j) {
    int o = options.unread_aliases[j];
    sig += (sig.empty() ? "%arg" : ", %arg") + std::to_string(params.size() + j) + ": " +
           LowerCtx::type(*outputs.at(size_t(o))) + " {tf.aliasing_output = " + std::to_string(o) + " : i32}";
  }
  if (shared)
    for (auto [n, i] : *shared) cx.set_name(n, "%arg" + std::to_string(i));
  if (line_node) line_node->assign(2, -1);  // the module and func.func lines
  size_t counted = 0;
  for (int i : host_params) {
    const Node* p = params[size_t(i)];
    std::string& name = cx.names_[size_t(cx.ids_.at(p))];
    name = annotate_placement(cx, name, LowerCtx::type(*p), kDevice);
  }
  if (line_node) {
    for (; counted < cx.body_.size(); ++counted)
      if (cx.body_[counted] == '\n') line_node->push_back(-1);
  }
  for (size_t k : emission_order(order)) {
    const Node* n = order[k];
    if (cx.named(n)) continue;  // a parameter
    cx.set_name(n, cx.lower_node(*n));
    if (line_node) {
      for (; counted < cx.body_.size(); ++counted)
        if (cx.body_[counted] == '\n') line_node->push_back(int(k));
    }
  }
  std::string rets, rtypes, rsig;
  for (size_t i = 0; i < outputs.size(); ++i) {
    rets += (i ? ", " : "") + cx.name_of(outputs[i]);
    rtypes += (i ? ", " : "") + LowerCtx::type(*outputs[i]);
    int kind = memory_kind_of(*outputs[i]);
    rsig += (i ? ", " : "") + LowerCtx::type(*outputs[i]);
    if (kind != kDevice) rsig += std::string(" {mhlo.memory_kind = \"") + memory_kind_name(kind) + "\"}";
  }
  std::string funcs;
  for (const auto& f : cx.funcs_) funcs += f.second;
  return "module @txc attributes {mhlo.num_partitions = " + std::to_string(options.num_partitions) +
         " : i32, mhlo.num_replicas = " + std::to_string(options.num_replicas) + " : i32} {\n"
         "  func.func public @main(" + sig + ") -> (" + rsig + ") {\n" + cx.body_ +
         "    \"func.return\"(" + rets + ") : (" + rtypes + ") -> ()\n  }\n" + funcs + "}\n";
}

}  // namespace txc

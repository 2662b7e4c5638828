// StableHLO text emission. LowerCtx writes ops in MLIR's generic form
// ("stablehlo.add"(%a, %b) : (...) -> ...) into one function body; op
// lowering rules call its helpers for the common pieces (converts,
// broadcasts, constants, reductions). lower_graph() wraps a graph into a
// module with one public @main.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>
#include "ir/node.h"

namespace txc {

// Precision of float matrix products and convolutions (stablehlo
// precision_config) in the graph being lowered, from torch's name as
// torch.set_float32_matmul_precision takes it: "highest" (full fp32 like
// eager PyTorch), "high" (TF32 where the device has it), "medium" (bf16
// passes). lower_graph() sets it for the duration of one lowering; the
// executor makes it part of the compile-cache key.
// ", precision_config = [...]" for a product computing in t.
std::string precision_config(DType t);

class LowerCtx {
 public:
  // SSA name of operand i of n (already lowered).
  const std::string& in(const Node& n, size_t i) const { return name_of(n.operands.at(i).get()); }
  // Operand i of an ordered op (OpDef::ordered), made to depend on the
  // previous ordered op's result of this region: XLA cannot start it before
  // that one has finished. A data dependency, because XLA:CPU drops
  // optimization barriers before it schedules, and its memory schedulers
  // order independent collectives by buffer sizes, which differ by process
  // (an uneven shard): processes taking their collectives in different
  // orders wait on each other forever. The first one's is in(n, i).
  std::string ordered_in(const Node& n, size_t i);
  // SSA name of a lowered node.
  const std::string& name_of(const Node* n) const { return names_.at(size_t(ids_.at(n))); }
  static std::string type(DType t, const Dims& d);
  static std::string type(const Node& n) { return type(n.dtype, n.dims); }

  // Emits one generic op with a single result; returns its SSA name.
  // props: the contents of <{...}> (may be empty); region: "({...})" text or empty.
  std::string op(const std::string& name, const std::vector<std::string>& args,
                 const std::vector<std::string>& arg_types, const std::string& result_type,
                 const std::string& props = "", const std::string& region = "");
  // Emits an op with several results; returns the base name, results are base#i.
  std::string op_multi(const std::string& name, const std::vector<std::string>& args,
                       const std::vector<std::string>& arg_types, const std::vector<std::string>& result_types,
                       const std::string& props = "", const std::string& region = "");
  std::string fresh();  // a new SSA name (for block arguments)

  std::string convert(const std::string& v, DType from, DType to, const Dims& d);
  // floating -> integral as torch's CPU kernels (see emitter.cpp): convert's part for those dtypes
  std::string float_to_int(const std::string& v, DType from, DType to, const Dims& d);
  // numpy-style broadcast (trailing alignment) from `from` to `to`.
  std::string broadcast(const std::string& v, DType t, const Dims& from, const Dims& to);
  // broadcast_in_dim with explicit dimension mapping.
  std::string broadcast_in_dim(const std::string& v, DType t, const Dims& from, const Dims& to, const Dims& map);
  std::string reshape(const std::string& v, DType t, const Dims& from, const Dims& to);
  std::string constant(double v, DType t, const Dims& d = {});
  // Operand i of n, converted to `t` and broadcast to `d`.
  std::string coerce(const Node& n, size_t i, DType t, const Dims& d);
  // Reduces v over `axes` with a binary body op ("stablehlo.add", ...) from `init`.
  std::string reduce(const std::string& v, DType t, const Dims& in, const Dims& axes, const std::string& body_op,
                     double init);
  // Lowers a sub-graph (a loop body) into the current text at the current
  // indent: b.params[i] is the value named args[i]. Returns the names of
  // b.outputs. Region ops (stablehlo.while) wrap this with region_text().
  std::vector<std::string> lower_body(const Body& b, const std::vector<std::string>& args);
  // Emits node n (its operands already lowered) and returns its SSA name.
  std::string lower_node(const Node& n);
  // The text of one region "{\n ^bb0(args): ... }" whose block arguments are
  // named `args` (with `types`); `emit` writes the region's ops (ending with
  // its terminator) through this context.
  std::string region_text(const std::vector<std::string>& args, const std::vector<std::string>& types,
                          const std::function<void()>& emit);
  static std::string i64_array(const Dims& d);  // "array<i64: 1, 2>"
  static std::string literal(double v, DType t);  // constant element text
  static std::string complex_literal(double re, double im, DType t);  // "(re, im)" for a complex t
  std::string complex_constant(double re, double im, DType t, const Dims& d = {});

  // ---- building blocks: made of the calls above and defined inline below,
  // so extensions (ext/extension.h) get them with no entry of their own.
  // stablehlo's comparison type for values of dtype t: FLOAT, UNSIGNED (bool
  // too) or SIGNED.
  static const char* comparison_type(DType t);
  // The properties of a stablehlo.compare; `as` names another comparison
  // type than t's (e.g. "TOTALORDER").
  static std::string compare_props(DType t, const char* direction, const char* as = nullptr);
  // a <direction> b elementwise over values of (t, d): a bool tensor of dims d.
  std::string compare(const std::string& a, const std::string& b, DType t, const Dims& d, const char* direction,
                      const char* as = nullptr);
  // pred ? on_true : on_false elementwise over values of (t, d).
  std::string select(const std::string& pred, const std::string& on_true, const std::string& on_false, DType t,
                     const Dims& d);
  // An elementwise op whose operands and result all have type (t, d).
  std::string unary(const std::string& name, const std::string& v, DType t, const Dims& d);
  std::string binary(const std::string& name, const std::string& a, const std::string& b, DType t, const Dims& d);
  // Writes a region's terminator, "stablehlo.return"(values).
  void region_return(const std::vector<std::string>& values, const std::vector<std::string>& types);
  // The "({...})" region of a reduce, reduce_window, scatter or sort whose
  // block arguments are scalars of `arg_dtypes`: `emit` writes the region's
  // ops through this context from the argument names and returns the values
  // it returns (scalars of `result_dtypes`).
  using RegionBody = std::function<std::vector<std::string>(const std::vector<std::string>& args)>;
  std::string scalar_region(const std::vector<DType>& arg_dtypes, const std::vector<DType>& result_dtypes,
                            const RegionBody& emit);
  // The region combining two scalars of t with body_op ("stablehlo.add", ...);
  // an empty body_op returns the second (scatter's "replace").
  std::string combiner(DType t, const std::string& body_op);

  // Adds a module-level function (text of one or more func.func ops) under
  // `key` once: sub-graphs lowered elsewhere (call_jax modules) that the
  // current body calls by name. lower_graph writes them after @main.
  void add_funcs(const std::string& key, const std::string& text);

  // A value emitted once per region under `key` (e.g. a draw's key from the
  // RNG state, named by the state's SSA name): the first call runs `make`,
  // later calls in the same region return its name. region_text() scopes it,
  // so a value of an enclosing region is never used inside a nested one.
  std::string memo(const std::string& key, const std::function<std::string()>& make);

  // Used by lower_graph. The lowering's scratch lives here, not in the
  // (immutable) nodes: a failed lowering leaves nothing behind.
  void set_name(const Node* n, std::string name) {
    ids_[n] = int(names_.size());
    names_.push_back(std::move(name));
  }
  bool named(const Node* n) const { return ids_.count(n) != 0; }
  std::vector<std::string> names_;
  std::unordered_map<const Node*, int> ids_;  // node -> index into names_
  std::vector<std::pair<std::string, std::string>> funcs_;  // key -> text, in first-use order
  std::string body_;
  int indent_ = 4;
  std::unordered_map<std::string, std::string> memo_;  // memo(): key -> SSA name, this region
  std::pair<std::string, const Node*> last_ordered_;  // the last ordered op's result and node (lower_node)

 private:
  int counter_ = 0;
};

// How to lower one graph: the matmul precision (torch's name) and the
// parameters donated to outputs of the same type (input/output aliasing:
// pairs of parameter index, output index).
// For SPMD (torch_xla_core/_execution/spmd.py): the number of partitions (devices of
// the mesh) and each parameter's sharding as XLA's HloSharding text
// ("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", "{replicated}"),
// written as mhlo.sharding on @main's arguments; results carry none, so
// XLA's SPMD partitioner chooses them (propagation). For a graph with
// collectives across processes, the number of replicas.
struct LowerOptions {
  std::string precision = "highest";
  std::vector<std::pair<int, int>> aliases;
  int num_partitions = 1;
  std::vector<std::string> param_shardings;  // empty: no SPMD
  int num_replicas = 1;  // a graph with collectives: one replica per process (ops/collective.cpp)
  // Outputs that an extra parameter, appended after the graph's and read by nothing, is donated to: the
  // buffer that output replaces is written in place (a replayed step's old grads: replay/_compiled.py).
  std::vector<int> unread_aliases;
};

// line_node, when given, receives for each line of the text (index = line
// number - 1) the position in `order` of the node that emitted it, or -1: a
// compiler error's line number then names the op at fault.
// shared: nodes that read parameter i of another node (equal Python numbers).
std::string lower_graph(const std::vector<const Node*>& order, const std::vector<const Node*>& params,
                        const std::vector<const Node*>& outputs, const LowerOptions& options,
                        std::vector<int>* line_node = nullptr,
                        const std::vector<std::pair<const Node*, int>>* shared = nullptr);

// StableHLO for moving value `v` of type `type` into memory kind `kind`
// (ir/memory.h): custom_call @annotate_device_placement, as XLA's
// host-offload passes expect. Used for @main's host arguments and by the
// core op "place" (ops/placement.cpp).
std::string annotate_placement(LowerCtx& cx, const std::string& v, const std::string& type, int kind);

inline const char* LowerCtx::comparison_type(DType t) {
  return is_floating(t) || is_complex(t) ? "FLOAT" : (is_unsigned(t) || is_bool(t)) ? "UNSIGNED" : "SIGNED";
}

inline std::string LowerCtx::compare_props(DType t, const char* direction, const char* as) {
  return std::string("compare_type = #stablehlo<comparison_type ") + (as ? as : comparison_type(t)) +
         ">, comparison_direction = #stablehlo<comparison_direction " + direction + ">";
}

inline std::string LowerCtx::compare(const std::string& a, const std::string& b, DType t, const Dims& d,
                                     const char* direction, const char* as) {
  std::string ty = type(t, d);
  return op("stablehlo.compare", {a, b}, {ty, ty}, type(DType::Bool, d), compare_props(t, direction, as));
}

inline std::string LowerCtx::select(const std::string& pred, const std::string& on_true, const std::string& on_false,
                                    DType t, const Dims& d) {
  std::string ty = type(t, d);
  return op("stablehlo.select", {pred, on_true, on_false}, {type(DType::Bool, d), ty, ty}, ty);
}

inline std::string LowerCtx::unary(const std::string& name, const std::string& v, DType t, const Dims& d) {
  std::string ty = type(t, d);
  return op(name, {v}, {ty}, ty);
}

inline std::string LowerCtx::binary(const std::string& name, const std::string& a, const std::string& b, DType t,
                                    const Dims& d) {
  std::string ty = type(t, d);
  return op(name, {a, b}, {ty, ty}, ty);
}

inline void LowerCtx::region_return(const std::vector<std::string>& values, const std::vector<std::string>& types) {
  std::string vals, tys;
  for (size_t i = 0; i < values.size(); ++i) {
    vals += (i ? ", " : "") + values[i];
    tys += (i ? ", " : "") + types[i];
  }
  body_.append(indent_, ' ');
  body_ += "\"stablehlo.return\"(" + vals + ") : (" + tys + ") -> ()\n";
}

inline std::string LowerCtx::scalar_region(const std::vector<DType>& arg_dtypes,
                                           const std::vector<DType>& result_dtypes, const RegionBody& emit) {
  std::vector<std::string> args, arg_types, result_types;
  for (DType t : arg_dtypes) {
    args.push_back(fresh());
    arg_types.push_back(type(t, {}));
  }
  for (DType t : result_dtypes) result_types.push_back(type(t, {}));
  return "(" + region_text(args, arg_types, [&] { region_return(emit(args), result_types); }) + ")";
}

inline std::string LowerCtx::combiner(DType t, const std::string& body_op) {
  return scalar_region({t, t}, {t}, [&](const std::vector<std::string>& ab) {
    return std::vector<std::string>{body_op.empty() ? ab[1] : binary(body_op, ab[0], ab[1], t, {})};
  });
}

}  // namespace txc

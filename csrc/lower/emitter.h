// StableHLO text emission. LowerCtx writes ops in MLIR's generic form
// ("stablehlo.add"(%a, %b) : (...) -> ...) into one function body; op
// lowering rules call its helpers for the common pieces (converts,
// broadcasts, constants, reductions). lower_graph() wraps a graph into a
// module with one public @main.
#pragma once
#include <functional>
#include <string>
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
  const std::string& in(const Node& n, size_t i) const { return names_[n.operands.at(i)->ssa]; }
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
  // The text of one region "{\n ^bb0(args): ... }" whose block arguments are
  // named `args` (with `types`); `emit` writes the region's ops (ending with
  // its terminator) through this context.
  std::string region_text(const std::vector<std::string>& args, const std::vector<std::string>& types,
                          const std::function<void()>& emit);
  static std::string i64_array(const Dims& d);  // "array<i64: 1, 2>"
  static std::string literal(double v, DType t);  // constant element text

  // Used by lower_graph.
  std::vector<std::string> names_;
  std::string body_;
  int indent_ = 4;

 private:
  int counter_ = 0;
};

// How to lower one graph: the matmul precision (torch's name) and the
// parameters donated to outputs of the same type (input/output aliasing:
// pairs of parameter index, output index).
struct LowerOptions {
  std::string precision = "highest";
  std::vector<std::pair<int, int>> aliases;
};

// line_node, when given, receives for each line of the text (index = line
// number - 1) the position in `order` of the node that emitted it, or -1: a
// compiler error's line number then names the op at fault.
std::string lower_graph(const std::vector<const Node*>& order, const std::vector<const Node*>& params,
                        const std::vector<const Node*>& outputs, const LowerOptions& options,
                        std::vector<int>* line_node = nullptr);

}  // namespace txc

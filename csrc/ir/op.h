// The op table: what each core op is. A node's `op` is an index into it.
// An OpDef gives an op's name, arity, shape rule (fills a node's dtype and
// dims from its operands and attributes, or throws an error naming the op)
// and lowering rule (emits StableHLO for the node), and for a view op its
// write-back and strides rules. The table belongs to the IR, the bottom
// layer; the op families fill it (ops/*.cpp, one TXC_OP row per op, see
// ops/registry.h) and the emitter (lower/emitter.cpp) calls the lowering
// rules it finds here, so neither the IR nor the emitter knows any family.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "ir/node.h"

namespace txc {

// The lowering context (lower/emitter.h): a lowering rule's first argument.
// Only its name is needed here; the IR never runs a rule.
class LowerCtx;
using InferFn = std::function<void(Node&)>;
using LowerFn = std::function<std::string(LowerCtx&, const Node&)>;

struct OpDef {
  std::string name;
  int arity = -1;  // -1: any number of operands
  InferFn infer;
  LowerFn lower;
  // View ops only: writes `value` (the view's new contents) back into
  // `parent` through the view `view` (a node of this op) and returns the
  // parent's new value. In-place ops on views go through this.
  std::function<NodePtr(const Node& view, NodePtr parent, NodePtr value)> scatter = nullptr;
  // View ops only: the view's strides and storage offset (in elements, as
  // torch defines them) from its operand's, rewritten in place; false when
  // the view cannot be expressed with strides (a reshape torch would copy).
  // LazyTensor::layout() chains these from the storage (trace/tensor.h).
  bool (*strides)(const Node& view, Dims& strides, int64_t& offset) = nullptr;
  uint64_t name_hash = 0;  // set by register_op
  // The dtype a Python number among the operands takes (a "wrapped" scalar,
  // weakly typed: see ResultType). Null: torch's promotion of all operands,
  // which is right for elementwise arithmetic and harmless elsewhere. Run by
  // make_node before the shape rule and the hash, so a node never changes
  // after it is built.
  DType (*number_dtype)(const std::vector<NodePtr>& operands) = nullptr;
  // A collective across replicas (ops/collective.cpp): the lowering emits
  // ordered ops in trace order (Node::seq), each one's input tied to the
  // previous one's result (LowerCtx::ordered_in), so every process runs them
  // in the order its program traced them, whatever else its graph holds.
  bool ordered = false;
};

uint16_t register_op(OpDef def);
const OpDef& op_def(uint16_t op);
int find_op(const std::string& name);  // -1 when unknown
uint16_t op_id(const std::string& name);  // throws when unknown
const std::vector<OpDef>& all_ops();

// torch's result type of the operands (Python numbers weakly typed): the
// default OpDef::number_dtype.
DType promoted_dtype(const std::vector<NodePtr>& operands);

}  // namespace txc

// The op registry: each core op is defined once, by name, arity, a shape rule
// (fills the node's dtype and dims from operands and attributes, or throws an
// error naming the op) and a lowering rule (emits StableHLO for the node).
// Ops register themselves from their family's file (ops/*.cpp) with TXC_OP.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "ir/node.h"

namespace txc {

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
  // LazyTensor::layout() chains these from the storage (tensor.h).
  bool (*strides)(const Node& view, Dims& strides, int64_t& offset) = nullptr;
  uint64_t name_hash = 0;  // set by register_op
  // The dtype a Python number among the operands takes (a "wrapped" scalar,
  // weakly typed: see ResultType). Null: torch's promotion of all operands,
  // which is right for elementwise arithmetic and harmless elsewhere. Run by
  // make_node before the shape rule and the hash, so a node never changes
  // after it is built.
  DType (*number_dtype)(const std::vector<NodePtr>& operands) = nullptr;
};

uint16_t register_op(OpDef def);
const OpDef& op_def(uint16_t op);
int find_op(const std::string& name);  // -1 when unknown
uint16_t op_id(const std::string& name);  // throws when unknown
const std::vector<OpDef>& all_ops();

// Errors from shape rules name the op: "add: shapes [2, 3] and [4] ...".
[[noreturn]] void op_error(const Node& n, const std::string& msg);

#define TXC_CAT2(a, b) a##b
#define TXC_CAT(a, b) TXC_CAT2(a, b)
#define TXC_OP(...) static const uint16_t TXC_CAT(txc_op_, __LINE__) = ::txc::register_op(::txc::OpDef{__VA_ARGS__})

// torch's result type of the operands (Python numbers weakly typed): the
// default OpDef::number_dtype.
DType promoted_dtype(const std::vector<NodePtr>& operands);

// Shared shape-rule pieces.
Dims broadcast_dims(const Node& n, const Dims& a, const Dims& b);
int64_t norm_dim(const Node& n, int64_t d, int64_t rank);  // wraps negative dims, checks range

}  // namespace txc

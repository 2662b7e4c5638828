// How the op families register their ops: one TXC_OP row per core op (name,
// arity, shape rule, lowering rule, ...: an OpDef, the IR's op table in
// ir/op.h), in its family's file (ops/*.cpp), and the shape-rule pieces the
// families share.
#pragma once
#include <stdexcept>
#include <string>
#include "ir/op.h"

namespace txc {

// Errors from shape rules name the op: "add: shapes [2, 3] and [4] ...".
[[noreturn]] void op_error(const Node& n, const std::string& msg);

// A dtype the op has no kernel for, in torch too: Python sees it as
// NotImplementedError (module.cpp's translator), the type torch's kernels
// raise for it ("not implemented for 'ComplexFloat'").
struct DtypeNotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void op_dtype_not_implemented(const Node& n, const std::string& msg);

#define TXC_CAT2(a, b) a##b
#define TXC_CAT(a, b) TXC_CAT2(a, b)
#define TXC_OP(...) static const uint16_t TXC_CAT(txc_op_, __LINE__) = ::txc::register_op(::txc::OpDef{__VA_ARGS__})

// Shared shape-rule pieces.
Dims broadcast_dims(const Node& n, const Dims& a, const Dims& b);
int64_t norm_dim(const Node& n, int64_t d, int64_t rank);  // wraps negative dims, checks range

}  // namespace txc

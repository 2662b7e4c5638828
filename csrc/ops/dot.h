// The one emitter of a matrix product, stablehlo.dot_general: the core op
// "dot" (ops/linalg.cpp) and the fused ops built on products
// (ops/attention.cpp) lower through it. Operands of one dtype; the result
// dtype may be wider (bf16/f16 operands, a float32 result: XLA's
// preferred_element_type, the product accumulated and returned in float32,
// as the fused attention kernels and torch's CPU matmul kernels keep it).
#pragma once
#include <string>
#include "lower/emitter.h"

namespace txc {

// Which dims of the two operands are batch (paired) and contracted (paired).
struct DotDims {
  Dims lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

// a (dtype t, dims ad) . b (t, bd): result dims `out` (batch, then a's free
// dims, then b's), dtype `result`.
std::string dot_general(LowerCtx& cx, DType t, const std::string& a, const Dims& ad, const std::string& b,
                        const Dims& bd, const DotDims& dd, DType result, const Dims& out);

}  // namespace txc

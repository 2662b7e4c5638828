// Scan loops (ops/scan.cpp): building a loop body from traced values and the
// loop over it. Python reaches these through py/scan.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>
#include "ir/node.h"

namespace txc {

// Body parameter `index` (core op "placeholder") of dtype t and dims d.
NodePtr placeholder(int64_t index, DType t, const Dims& d);
// Builds a body from traced values: params are placeholders 0..P-1, outs the
// body's results, caps the values of tensors the traced function closed over
// (they become params P.. in order).
std::shared_ptr<Body> build_body(const std::vector<NodePtr>& params, const std::vector<NodePtr>& outs,
                                 const std::vector<NodePtr>& caps);
// For each value: does it depend on any of `params`? (Tensors made inside a
// traced function by paths the tracer did not watch look like captures;
// those that depend on the function's inputs are body values instead.)
std::vector<bool> depends_on(const std::vector<NodePtr>& vals, const std::vector<NodePtr>& params);
// Runs body b over xs: operands are the initial carries, the xs (stacked on
// dim 0, `length` slices), then the captured values; returns the final
// carries, then the stacked ys (core ops "scan" and "scan_result").
std::vector<NodePtr> scan_loop(std::shared_ptr<const Body> b, std::vector<NodePtr> operands, int64_t n_carry,
                               int64_t n_xs, int64_t length, bool reverse);

}  // namespace txc

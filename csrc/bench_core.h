// Core-only microbenchmarks (bench/flavors.py): the C++ work of tracing,
// without Python, so the two C++-ABI flavors can be compared where the ABI
// matters (std::string, std::function, containers).
#pragma once
#include <pybind11/pybind11.h>

namespace txc {
// Registers _C.bench_core(kind, n, repeats) and _C.bench_core_text(n).
void bind_bench_core(pybind11::module_& m);
}  // namespace txc

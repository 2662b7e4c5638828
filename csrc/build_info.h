// Build facts read from the compiled core itself (ABI define, compiler).
#pragma once
#include <pybind11/pybind11.h>
namespace txc {
void bind_build_info(pybind11::module_& m);
}

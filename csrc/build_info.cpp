// Build facts read from the compiled core itself: the _GLIBCXX_USE_CXX11_ABI
// value every translation unit was compiled with, and the compiler.
#include "build_info.h"
#include <string>

namespace txc {
void bind_build_info(pybind11::module_& m) {
  m.def("cxx11_abi", [] { return bool(_GLIBCXX_USE_CXX11_ABI); },
        "The _GLIBCXX_USE_CXX11_ABI value the core was compiled with.");
  m.def("compiler", [] {
#if defined(__clang__)
    return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    return std::string("gcc ") + __VERSION__;
#else
    return std::string("unknown");
#endif
  });
}
}  // namespace txc

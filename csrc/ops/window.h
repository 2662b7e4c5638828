// Window geometry shared by convolution (ops/conv.cpp) and pooling
// (ops/pool.cpp): dilated sizes, padding attributes, dim lists in messages.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "ir/node.h"

namespace txc {
namespace window {

using Pads = std::vector<std::pair<int64_t, int64_t>>;

// Extent of s elements spaced d apart.
inline int64_t dilate(int64_t s, int64_t d) { return s == 0 ? 0 : 1 + d * (s - 1); }

inline Dims ones(size_t n) { return Dims(n, 1); }

// "2 x 3" (or with another separator), as torch's messages write sizes.
inline std::string list_str(const Dims& d, const char* sep = " x ") {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? sep : "") + std::to_string(d[i]);
  return s;
}

// (low, high) padding per spatial dim as a stablehlo dense attribute.
inline std::string pads_attr(const Pads& p) {
  if (p.empty()) return "dense<> : tensor<0x2xi64>";
  std::string s = "dense<[";
  for (size_t i = 0; i < p.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(p[i].first) + ", " + std::to_string(p[i].second) + "]";
  return s + "]> : tensor<" + std::to_string(p.size()) + "x2xi64>";
}

}  // namespace window
}  // namespace txc

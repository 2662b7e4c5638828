// Shape-rule helpers shared by the op families (see registry.h).
#include "ops/registry.h"
#include <algorithm>
#include <stdexcept>

namespace txc {

void op_error(const Node& n, const std::string& msg) { throw std::runtime_error(op_def(n.op).name + ": " + msg); }

void op_dtype_not_implemented(const Node& n, const std::string& msg) {
  throw DtypeNotImplemented(op_def(n.op).name + ": " + msg);
}

Dims broadcast_dims(const Node& n, const Dims& a, const Dims& b) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      op_error(n, "shapes " + dims_str(a) + " and " + dims_str(b) + " cannot be broadcast together (dim " +
                      std::to_string(i) + ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t norm_dim(const Node& n, int64_t d, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  if (d < -r || d >= r)
    op_error(n, "dimension " + std::to_string(d) + " out of range for a tensor of rank " + std::to_string(rank));
  return d < 0 ? d + r : d;
}

}  // namespace txc

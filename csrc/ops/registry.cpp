// The op registry (see registry.h) and shape-rule helpers shared by op families.
#include "ops/registry.h"
#include <stdexcept>
#include <unordered_map>

namespace txc {

static std::vector<OpDef>& ops() {
  static std::vector<OpDef> v;
  return v;
}
static std::unordered_map<std::string, uint16_t>& by_name() {
  static std::unordered_map<std::string, uint16_t> m;
  return m;
}

uint16_t register_op(OpDef def) {
  if (by_name().count(def.name)) throw std::logic_error("core op registered twice: " + def.name);
  def.name_hash = std::hash<std::string>{}(def.name);
  uint16_t id = uint16_t(ops().size());
  by_name()[def.name] = id;
  ops().push_back(std::move(def));
  return id;
}

const OpDef& op_def(uint16_t op) { return ops()[op]; }
const std::vector<OpDef>& all_ops() { return ops(); }

int find_op(const std::string& name) {
  auto it = by_name().find(name);
  return it == by_name().end() ? -1 : int(it->second);
}

uint16_t op_id(const std::string& name) {
  int id = find_op(name);
  if (id < 0) throw std::runtime_error("unknown core op '" + name + "'");
  return uint16_t(id);
}

void op_error(const Node& n, const std::string& msg) { throw std::runtime_error(op_def(n.op).name + ": " + msg); }

DType promoted_dtype(const std::vector<NodePtr>& operands) {
  ResultType rt;
  for (const auto& o : operands) rt.add(o->dtype, o->rank(), o->wrapped);
  return rt.result();
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

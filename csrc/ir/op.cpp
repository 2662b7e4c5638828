// The op table (see op.h).
#include "ir/op.h"
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

DType promoted_dtype(const std::vector<NodePtr>& operands) {
  ResultType rt;
  for (const auto& o : operands) rt.add(o->dtype, o->rank(), o->wrapped);
  return rt.result();
}

}  // namespace txc

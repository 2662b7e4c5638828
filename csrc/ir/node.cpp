// Node construction and structural hashing.
#include "ir/node.h"
#include <cstring>
#include <functional>
#include "ops/registry.h"

namespace txc {

int64_t Node::numel() const {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

uint64_t hash_attrs(uint64_t h, const Attrs& attrs) {
  for (const auto& a : attrs) {
    h = hash_mix(h, a.index());
    switch (a.index()) {
      case 0: h = hash_mix(h, uint64_t(std::get<int64_t>(a))); break;
      case 1: {
        double d = std::get<double>(a);
        uint64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        h = hash_mix(h, bits);
        break;
      }
      case 2: h = hash_mix(h, std::hash<std::string>{}(std::get<std::string>(a))); break;
      case 3:
        for (auto v : std::get<Dims>(a)) h = hash_mix(h, uint64_t(v));
        h = hash_mix(h, std::get<Dims>(a).size());
        break;
    }
  }
  return h;
}

void rehash(Node& n) {
  uint64_t h = hash_mix(0x7863u, op_def(n.op).name_hash);
  h = hash_mix(h, uint64_t(n.dtype));
  for (auto d : n.dims) h = hash_mix(h, uint64_t(d));
  h = hash_mix(h, n.dims.size());
  for (const auto& o : n.operands) h = hash_mix(h, o->hash);
  if (n.body) h = hash_mix(h, n.body->hash);
  n.hash = hash_attrs(h, n.attrs);
}

NodePtr make_node(uint16_t op, std::vector<NodePtr> operands, Attrs attrs) {
  const OpDef& def = op_def(op);
  if (def.arity >= 0 && int(operands.size()) != def.arity)
    throw std::runtime_error(def.name + ": expected " + std::to_string(def.arity) + " operands, got " +
                             std::to_string(operands.size()));
  auto n = std::make_shared<Node>();
  n->op = op;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  def.infer(*n);
  rehash(*n);
  return n;
}

NodePtr make_node_shaped(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, DType dtype, Dims dims) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  n->dtype = dtype;
  n->dims = std::move(dims);
  rehash(*n);
  return n;
}

std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace txc

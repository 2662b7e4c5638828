// Node construction and structural hashing.
#include "ir/node.h"
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <functional>
#include "ir/op.h"

namespace txc {

uint64_t next_seq() {
  static std::atomic<uint64_t> count{0};
  return count.fetch_add(1, std::memory_order_relaxed) + 1;
}

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

uint64_t node_hash(const Node& n) {
  uint64_t h = hash_mix(0x7863u, op_def(n.op).name_hash);
  h = hash_mix(h, uint64_t(n.dtype));
  for (auto d : n.dims) h = hash_mix(h, uint64_t(d));
  h = hash_mix(h, n.dims.size());
  for (const auto& o : n.operands) h = hash_mix(h, o->hash);
  if (n.body) h = hash_mix(h, n.body->hash);
  return hash_attrs(h, n.attrs);
}

thread_local uint32_t t_origin = 0;

namespace {
std::vector<std::string>& origin_table() {
  static auto* t = new std::vector<std::string>{""};
  return *t;
}
}  // namespace

uint32_t origin_id(const std::string& aten_name) {
  auto& t = origin_table();
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i] == aten_name) return uint32_t(i);
  t.push_back(aten_name);
  return uint32_t(t.size() - 1);
}

const std::string& origin_name(uint32_t id) {
  auto& t = origin_table();
  return id < t.size() ? t[id] : t[0];
}

bool is_error(const Node& n) {
  static const uint16_t error = op_id("error");
  return n.op == error;
}


// A value that failed to compute cannot feed a new op: say why, once, here.
// Returns the operands' device (kAnyDevice: none has one); two devices are refused
// with torch's own message.
static int16_t check_operands(const std::vector<NodePtr>& operands) {
  int16_t device = kAnyDevice;
  for (const auto& o : operands) {
    if (is_error(*o)) throw std::runtime_error(o->attr_str(0));
    if (o->device >= 0 && o->device != device) {
      if (device >= 0)
        throw std::runtime_error("Expected all tensors to be on the same device, but found at least two devices, xla:" +
                                 std::to_string(device) + " and xla:" + std::to_string(o->device) +
                                 "! Move one with .to(other.device).");
      device = o->device;
    }
  }
  return device;
}

bool g_multi_device = false;

int16_t operand_device(const std::vector<NodePtr>& operands) { return check_operands(operands); }

// Every node is built here: new_node (a fresh node of `op`, by this
// thread's current origin, numbered in build order) or renumbered (a copy
// of another); the builder fills its fields, then sealed() hashes it.
// Nothing changes a node once it is sealed (replay's swap_buffer, which
// replaces a lone data node's buffer, aside: ARCHITECTURE.md).
static NodePtr new_node(uint16_t op) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->origin = t_origin;
  n->seq = next_seq();
  return n;
}

static NodePtr renumbered(const Node& from) {
  auto n = std::make_shared<Node>(from);
  n->seq = next_seq();
  return n;
}

static NodePtr sealed(NodePtr n) {
  n->hash = node_hash(*n);
  return n;
}

NodePtr make_scalar(double value, DType dtype, bool wrapped, double imag) {
  static const uint16_t scalar = op_id("scalar");
  NodePtr n = new_node(scalar);
  n->dtype = dtype;
  n->scalar = value;
  n->scalar_imag = imag;
  n->wrapped = wrapped;
  return sealed(std::move(n));
}

NodePtr make_data(DType dtype, Dims dims, std::shared_ptr<const LeafData> data, int16_t device, uint8_t memory) {
  static const uint16_t op = op_id("data");
  NodePtr n = new_node(op);
  n->dtype = dtype;
  n->dims = std::move(dims);
  n->data = std::move(data);
  n->device = device;
  n->memory = memory;
  if (device > 0) g_multi_device = true;
  return sealed(std::move(n));
}

NodePtr copy_node(const Node& from, std::vector<NodePtr> operands) {
  check_operands(operands);
  NodePtr n = renumbered(from);
  n->operands = std::move(operands);
  return sealed(std::move(n));
}

NodePtr placed_on(const NodePtr& n, int16_t device) {
  if (n->device == device) return n;
  if (n->device >= 0)
    throw std::runtime_error("cannot place a value of xla:" + std::to_string(n->device) + " on xla:" +
                             std::to_string(device));
  NodePtr c = renumbered(*n);
  c->device = device;  // not hashed: c->hash stays n's
  if (device > 0) g_multi_device = true;
  return c;
}

// Python numbers that only this new node uses (just made from the caller's
// arguments) take the dtype the op computes them in (OpDef::number_dtype),
// as new scalar leaves: nothing built is changed afterwards. A Python bool
// stays bool: ops that refuse a bool operand (sub: `x - True`) see it.
static void settle_numbers(const OpDef& def, std::vector<NodePtr>& operands) {
  bool fresh = false;
  for (const auto& o : operands) fresh = fresh || (o->wrapped && o.use_count() == 1 && o->dtype != DType::Bool);
  if (!fresh) return;
  DType t = def.number_dtype ? def.number_dtype(operands) : promoted_dtype(operands);
  for (auto& o : operands)
    if (o->wrapped && o.use_count() == 1 && o->dtype != t && o->dtype != DType::Bool)
      o = make_scalar(o->scalar, t, true, o->scalar_imag);
}

NodePtr make_node(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, std::shared_ptr<const Body> body) {
  const OpDef& def = op_def(op);
  int16_t device = check_operands(operands);
  settle_numbers(def, operands);
  if (def.arity >= 0 && int(operands.size()) != def.arity)
    throw std::runtime_error(def.name + ": expected " + std::to_string(def.arity) + " operands, got " +
                             std::to_string(operands.size()));
  NodePtr n = new_node(op);
  n->device = device;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  n->body = std::move(body);
  def.infer(*n);
  return sealed(std::move(n));
}

NodePtr make_node_shaped(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, DType dtype, Dims dims) {
  int16_t device = check_operands(operands);
  NodePtr n = new_node(op);
  n->device = device;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  n->dtype = dtype;
  n->dims = std::move(dims);
  return sealed(std::move(n));
}

std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace txc

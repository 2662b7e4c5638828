// Graph cuts (see graph.h).
#include "trace/graph.h"
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include "ir/memory.h"
#include "ir/node_map.h"
#include "ir/op.h"
#include "lower/emitter.h"

namespace txc {

static bool is_param(const Node& n) {
  static const uint16_t data = op_id("data"), scalar = op_id("scalar");
  return n.op == data || n.op == scalar;
}

namespace {
// A Python number's parameter value: equal keys bind one buffer
// (runtime.scalar caches it by dtype and value bits).
struct ScalarKey {
  uint64_t re, im;
  DType dtype;
  int16_t device;
  bool operator==(const ScalarKey& o) const {
    return re == o.re && im == o.im && dtype == o.dtype && device == o.device;
  }
};
struct ScalarKeyHash {
  size_t operator()(const ScalarKey& k) const {
    return size_t(hash_mix(hash_mix(hash_mix(k.re, k.im), uint64_t(k.dtype)), uint64_t(uint16_t(k.device))));
  }
};
ScalarKey scalar_key(const Node& n) {
  ScalarKey k{0, 0, n.dtype, n.device};
  std::memcpy(&k.re, &n.scalar, sizeof k.re);
  std::memcpy(&k.im, &n.scalar_imag, sizeof k.im);
  return k;
}
}  // namespace

GraphCut::GraphCut(std::vector<std::shared_ptr<Storage>> roots, bool all_live, int device) : all_live_(all_live) {
  static const uint16_t data = op_id("data");
  if (all_live) {
    for (Storage* s = live_storages_head(); s; s = s->next)
      if (s->value->op != data && (device == kAllDevices || std::max<int>(s->value->device, 0) == device))
        roots.push_back(s->shared_from_this());
  } else if (device != kAllDevices) {
    roots.erase(std::remove_if(roots.begin(), roots.end(),
                               [&](const auto& r) { return std::max<int>(r->value->device, 0) != device; }),
                roots.end());
  }
  NodeMap<int> seen(roots.size());
  for (auto& r : roots) {
    if (r->value->op == data) continue;
    if (is_error(*r->value)) {
      if (all_live) continue;  // failed earlier: its error was raised then, and is raised again on use
      throw std::runtime_error(r->value->attr_str(0));
    }
    auto [k, added] = seen.emplace(r->value.get(), int(outputs_.size()));
    if (added) outputs_.push_back(r->value);
    roots_.push_back(r);
    root_output_.push_back(*k);
  }
  walk();
}

namespace {
// One frame of the walk's explicit stack.
struct Frame {
  const Node* n;
  uint32_t i;       // next operand to visit
  uint32_t marked;  // n is in WalkScratch::pos (else it has one owner: reached once)
  uint64_t entry;   // n's graph-hash entry so far: its hash, then its operands' positions
};
// The walk's scratch, one per thread, reset by each walk: its memory stays
// warm between syncs (fresh arrays cost a page fault per 4 KiB). Never in
// the nodes, so a failed walk leaves them untouched.
struct WalkScratch {
  NodeMap<int64_t> pos;      // marked nodes: post-order position (-1: not finished)
  std::vector<Frame> stack;
  size_t last = 0;           // the last walk's node count (the next one's size hint)
  std::unordered_map<ScalarKey, int, ScalarKeyHash> numbers;  // Python numbers: their parameter index
};
// Not inlined: the walk then holds a plain pointer (inlined, the compiler
// re-derives the thread-local address at every use, through __tls_get_addr).
__attribute__((noinline)) WalkScratch* walk_scratch() {
  static thread_local WalkScratch w;
  return &w;
}
}  // namespace

void GraphCut::walk() {
  // A node's graph-hash entry mixes its own hash with the post-order
  // positions of its operands (so a+a and a+b differ), folded into the
  // frame as each operand's position becomes known: finishing a node needs
  // no lookups. Only nodes with more than one owner (shared operands,
  // storage values) can be reached twice, so only those are marked in `pos`.
  WalkScratch& w = *walk_scratch();
  NodeMap<int64_t>& pos = w.pos;
  pos.reset(w.last);
  if (w.stack.size() < 64) w.stack.resize(64);
  Frame* st = w.stack.data();
  size_t sp = 0;
  auto push = [&](const Node* n, uint32_t marked) {
    if (sp == w.stack.size()) {
      w.stack.resize(2 * sp);
      st = w.stack.data();
    }
    st[sp++] = Frame{n, 0, marked, hash_mix(0x6e6f6465ULL, n->hash)};
  };
  order_.reserve(w.last);
  static const uint16_t scalar = op_id("scalar");
  // Equal Python numbers share a parameter (an optimizer's betas, eps and lr
  // appear once per parameter tensor: thousands of arguments otherwise). The
  // sharing is part of the graph's hash: each number's parameter index.
  auto& numbers = w.numbers;
  numbers.clear();
  uint64_t h = 0x6772617068ULL;
  for (const auto& out : outputs_) {
    if (!pos.emplace(out.get(), -1).second) continue;
    push(out.get(), 1);
    while (sp) {
      Frame& f = st[sp - 1];
      if (f.i < f.n->operands.size()) {
        const NodePtr& c = f.n->operands[f.i++];
        if (c.use_count() == 1) {  // this operand slot is its only owner: reached once, no mark needed
          push(c.get(), 0);
          continue;
        }
        auto [v, fresh] = pos.emplace(c.get(), -1);
        if (fresh) push(c.get(), 1);
        else f.entry = hash_mix(f.entry, uint64_t(*v));  // finished earlier (a DAG: never an ancestor)
        continue;
      }
      const Node* n = f.n;
      int64_t p = int64_t(order_.size());
      h = hash_mix(h, f.entry);
      if (f.marked) *pos.find(n) = p;
      if (n->op == scalar) {
        auto [it, fresh] = numbers.emplace(scalar_key(*n), int(params_.size()));
        if (fresh) params_.push_back(n);
        else shared_.emplace_back(n, it->second);
        h = hash_mix(h, uint64_t(it->second));
      } else if (is_param(*n)) {
        params_.push_back(n);
      }
      order_.push_back(n);
      if (--sp) st[sp - 1].entry = hash_mix(st[sp - 1].entry, uint64_t(p));  // the parent's operand
    }
  }
  for (const auto& out : outputs_) h = hash_mix(h, uint64_t(*pos.find(out.get())));
  hash_ = hash_mix(h, outputs_.size());
  w.last = order_.size();
}

int GraphCut::device() const {
  int d = -1;
  for (const auto& o : outputs_)
    if (o->device >= 0 && o->device != d) {
      if (d >= 0)
        throw std::runtime_error("Expected all tensors to be on the same device, but found at least two devices, "
                                 "xla:" + std::to_string(d) + " and xla:" + std::to_string(o->device) +
                                 "! Sync the tensors of each device separately.");
      d = o->device;
    }
  return std::max(d, 0);
}

std::vector<int> GraphCut::param_devices() const {
  std::vector<int> r;
  r.reserve(params_.size());
  for (const Node* p : params_) r.push_back(p->device);
  return r;
}

std::vector<const Node*> GraphCut::annotations() const {
  static const uint16_t sharding = op_id("sharding");
  return nodes_of({sharding});
}

std::vector<const Node*> GraphCut::nodes_of(const std::vector<uint16_t>& ops) const {
  // The top-level nodes, then the nodes of each distinct sub-graph (scan
  // bodies, and bodies nested in them): an annotation (or a collective)
  // inside a loop body decides how the graph runs as one outside does.
  std::vector<const Node*> r;
  std::vector<const Body*> bodies;
  auto visit = [&](const std::vector<const Node*>& nodes) {
    for (const Node* n : nodes) {
      if (std::find(ops.begin(), ops.end(), n->op) != ops.end()) r.push_back(n);
      if (n->body && std::find(bodies.begin(), bodies.end(), n->body.get()) == bodies.end())
        bodies.push_back(n->body.get());
    }
  };
  visit(order_);
  for (size_t k = 0; k < bodies.size(); ++k) visit(bodies[k]->order);  // grows while nested bodies are found
  return r;
}

std::string GraphCut::lower(const LowerOptions& options) const {
  std::vector<const Node*> outs;
  for (const auto& o : outputs_) outs.push_back(o.get());
  return lower_graph(order_, params_, outs, options, &line_node_, &shared_);
}

std::string GraphCut::text() const {
  static const uint16_t scalar = op_id("scalar");
  std::unordered_map<const Node*, size_t> pos;
  std::unordered_map<const Node*, int> arg;  // a Python number's parameter (equal numbers share one)
  for (size_t i = 0; i < params_.size(); ++i) arg.emplace(params_[i], int(i));
  for (auto [n, i] : shared_) arg.emplace(n, i);
  std::string s;
  for (size_t k = 0; k < order_.size(); ++k) {
    const Node& n = *order_[k];
    pos.emplace(&n, k);
    s += "%" + std::to_string(k) + " = " + op_def(n.op).name + "(";
    for (size_t i = 0; i < n.operands.size(); ++i)
      s += (i ? ", %" : "%") + std::to_string(pos.at(n.operands[i].get()));
    s += ")";
    if (n.op == scalar) {
      s += " {arg " + std::to_string(arg.at(&n)) + "}";
    } else if (!n.attrs.empty()) {
      s += " {";
      for (size_t i = 0; i < n.attrs.size(); ++i) {
        const Attr& a = n.attrs[i];
        s += i ? ", " : "";
        if (auto* v = std::get_if<int64_t>(&a)) s += std::to_string(*v);
        else if (auto* d = std::get_if<double>(&a)) s += std::to_string(*d);
        else if (auto* t = std::get_if<std::string>(&a)) s += "\"" + *t + "\"";
        else s += dims_str(std::get<Dims>(a));
      }
      s += "}";
    }
    s += std::string(" : ") + dtype_name(n.dtype) + dims_str(n.dims);
    if (n.origin) s += "  # " + origin_name(n.origin);
    s += "\n";
  }
  s += "outputs:";
  for (const auto& o : outputs_) s += " %" + std::to_string(pos.at(o.get()));
  return s + "\n";
}

std::vector<std::pair<int, int>> GraphCut::donations() const {
  static const uint16_t data = op_id("data");
  // Only a sync of every live storage donates: then no pending storage is
  // left out of the cut that could still read a parameter (a partial sync,
  // e.g. .item(), leaves such storages behind). Within it, device data may
  // be overwritten when its node's only holders are operand edges inside
  // the cut: no storage holds it (a storage's own value), no view chain, no
  // cached scan body. View chains that hold other nodes of the cut are
  // rebuilt from the new value after assign (the storage's version moves).
  std::vector<std::pair<int, int>> out;
  if (!all_live_) return out;
  std::unordered_map<const Node*, std::pair<long, long>> refs;  // data node -> (edges in cut, use_count)
  for (const Node* n : order_)
    for (const auto& o : n->operands)
      if (o->op == data) {
        auto& r = refs[o.get()];
        r.first += 1;
        r.second = long(o.use_count());
      }
  std::vector<char> taken(outputs_.size(), 0);
  for (size_t p = 0; p < params_.size(); ++p) {
    const Node* n = params_[p];
    auto it = refs.find(n);
    if (n->op != data || it == refs.end() || it->second.first != it->second.second) continue;
    if (n->memory != kDevice) continue;  // a host buffer never aliases a device result
    if (!n->data || n->data->held_elsewhere()) continue;  // someone else holds it
    for (size_t o = 0; o < outputs_.size(); ++o) {
      if (taken[o] || outputs_[o]->dtype != n->dtype || outputs_[o]->dims != n->dims) continue;
      if (memory_kind_of(*outputs_[o]) != kDevice) continue;
      taken[o] = 1;
      out.emplace_back(int(p), int(o));
      break;
    }
  }
  return out;
}

int GraphCut::node_at_line(int line) const {
  if (line < 1 || size_t(line) > line_node_.size()) return -1;
  return line_node_[size_t(line) - 1];
}

int64_t GraphCut::bytes(const Node& n) { return n.numel() * std::max(bit_width(n.dtype), 8) / 8; }

std::vector<int> GraphCut::largest(int count) const {
  std::vector<int> idx(order_.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
  auto bits = [&](int i) { return order_[size_t(i)]->numel() * std::max(bit_width(order_[size_t(i)]->dtype), 8); };
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return bits(a) > bits(b); });
  idx.resize(std::min(idx.size(), size_t(std::max(count, 0))));
  return idx;
}

std::vector<int> GraphCut::roots_using(int k) const {
  const Node* target = order_.at(size_t(k));
  // Which outputs reach target: one walk per output (an error path, not hot).
  std::vector<char> uses(outputs_.size(), 0);
  for (size_t o = 0; o < outputs_.size(); ++o) {
    std::vector<const Node*> stack{outputs_[o].get()};
    std::unordered_map<const Node*, bool> seen;
    while (!stack.empty() && !uses[o]) {
      const Node* n = stack.back();
      stack.pop_back();
      if (n == target) uses[o] = 1;
      for (const auto& c : n->operands)
        if (seen.emplace(c.get(), true).second) stack.push_back(c.get());
    }
  }
  std::vector<int> r;
  for (size_t i = 0; i < roots_.size(); ++i)
    if (uses[size_t(root_output_[i])]) r.push_back(int(i));
  return r;
}

GraphCut GraphCut::subset(const std::vector<int>& roots) const {
  std::vector<std::shared_ptr<Storage>> rs;
  for (int i : roots) rs.push_back(roots_.at(size_t(i)));
  return GraphCut(std::move(rs), false);
}

// Storage s now holds a failed value shaped like `out` whose use raises `message`.
static void hold_error(Storage& s, const Node& out, const std::string& message) {
  static const uint16_t error = op_id("error");
  s.value = make_node_shaped(error, {}, {message}, out.dtype, out.dims);
  ++s.version;
}

void GraphCut::poison(const std::vector<int>& roots, const std::string& message) {
  for (int i : roots) {
    Storage& s = *roots_.at(size_t(i));
    const NodePtr& out = outputs_[size_t(root_output_[size_t(i)])];
    if (s.value == out) hold_error(s, *out, message);
  }
}

void GraphCut::poison_assigned(const std::function<bool(const Node& value, size_t output)>& holds_output,
                               const std::string& message) {
  for (size_t i = 0; i < roots_.size(); ++i) {
    Storage& s = *roots_[i];
    size_t k = size_t(root_output_[i]);
    if (holds_output(*s.value, k)) hold_error(s, *outputs_[k], message);  // (else written since)
  }
}

std::vector<std::pair<int, int>> GraphCut::param_memory_kinds() const {
  std::vector<std::pair<int, int>> r;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->memory != kDevice) r.emplace_back(int(i), int(params_[i]->memory));
  return r;
}

std::vector<std::pair<int, int>> GraphCut::output_memory_kinds() const {
  std::vector<std::pair<int, int>> r;
  for (size_t o = 0; o < outputs_.size(); ++o) {
    int kind = memory_kind_of(*outputs_[o]);
    if (kind != kDevice) r.emplace_back(int(o), kind);
  }
  return r;
}

void GraphCut::assign(std::vector<std::shared_ptr<const LeafData>> data) {
  if (data.size() != outputs_.size()) throw std::runtime_error("GraphCut.assign: wrong number of outputs");
  std::vector<NodePtr> nodes;
  nodes.reserve(data.size());
  for (size_t k = 0; k < outputs_.size(); ++k) {
    // a result placed on the host stays there; "any" stays any (the RNG state)
    nodes.push_back(make_data(outputs_[k]->dtype, outputs_[k]->dims, std::move(data[k]), outputs_[k]->device,
                              uint8_t(memory_kind_of(*outputs_[k]))));
  }
  for (size_t i = 0; i < roots_.size(); ++i) {
    Storage& s = *roots_[i];
    // The storage may have been written since the cut (not within one sync).
    if (s.value == outputs_[root_output_[i]]) {
      s.value = nodes[root_output_[i]];
      ++s.version;
    }
  }
}

}  // namespace txc

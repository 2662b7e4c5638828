// Graph cuts (see graph.h).
#include "trace/graph.h"
#include <algorithm>
#include <unordered_map>
#include <pybind11/stl.h>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace py = pybind11;

namespace txc {

static uint64_t g_epoch = 0;

static bool is_param(const Node& n) {
  static const uint16_t data = op_id("data"), scalar = op_id("scalar");
  return n.op == data || n.op == scalar;
}

GraphCut::GraphCut(std::vector<std::shared_ptr<Storage>> roots, bool all_live) {
  static const uint16_t data = op_id("data");
  if (all_live) {
    for (Storage* s = live_storages_head(); s; s = s->next)
      if (s->value->op != data) roots.push_back(s->shared_from_this());
  }
  std::unordered_map<const Node*, int> seen;
  for (auto& r : roots) {
    if (r->value->op == data) continue;
    if (is_error(*r->value)) {
      if (all_live) continue;  // failed earlier: its error was raised then, and is raised again on use
      throw std::runtime_error(r->value->attr_str(0));
    }
    auto it = seen.find(r->value.get());
    int k;
    if (it == seen.end()) {
      k = int(outputs_.size());
      seen.emplace(r->value.get(), k);
      outputs_.push_back(r->value);
    } else {
      k = it->second;
    }
    roots_.push_back(r);
    root_output_.push_back(k);
  }
  walk();
}

void GraphCut::walk() {
  uint64_t epoch = ++g_epoch;
  uint64_t h = 0x6772617068ULL;
  std::vector<std::pair<const Node*, size_t>> stack;
  for (const auto& out : outputs_) {
    if (out->visit == epoch) continue;
    stack.emplace_back(out.get(), 0);
    out->visit = epoch;
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->operands.size()) {
        const Node* c = n->operands[i++].get();
        if (c->visit != epoch) {
          c->visit = epoch;
          stack.emplace_back(c, 0);
        }
        continue;
      }
      // Post-order position; the hash sees each node's own hash and which
      // earlier positions its operands are, so a+a and a+b differ.
      n->ssa = int(order_.size());
      h = hash_mix(h, n->hash);
      for (const auto& o : n->operands) h = hash_mix(h, uint64_t(o->ssa));
      if (is_param(*n)) params_.push_back(n);
      order_.push_back(n);
      stack.pop_back();
    }
  }
  for (const auto& out : outputs_) h = hash_mix(h, uint64_t(out->ssa));
  for (const Node* n : order_) n->ssa = -1;
  h = hash_mix(h, std::hash<std::string>()(matmul_precision_name()));  // lowering setting
  hash_ = hash_mix(h, outputs_.size());
}

std::string GraphCut::lower() const {
  std::vector<const Node*> outs;
  for (const auto& o : outputs_) outs.push_back(o.get());
  return lower_graph(order_, params_, outs, &line_node_);
}

int GraphCut::node_at_line(int line) const {
  if (line < 1 || size_t(line) > line_node_.size()) return -1;
  return line_node_[size_t(line) - 1];
}

py::dict GraphCut::node_info(int k) const {
  const Node& n = *order_.at(size_t(k));
  py::dict d;
  d["op"] = op_def(n.op).name;
  d["origin"] = origin_name(n.origin);
  d["dtype"] = dtype_name(n.dtype);
  d["shape"] = py::cast(n.dims);
  d["bytes"] = n.numel() * std::max(bit_width(n.dtype), 8) / 8;
  return d;
}

py::list GraphCut::largest(int count) const {
  std::vector<int> idx(order_.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
  auto bytes = [&](int i) { return order_[size_t(i)]->numel() * std::max(bit_width(order_[size_t(i)]->dtype), 8); };
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return bytes(a) > bytes(b); });
  py::list l;
  for (int i = 0; i < count && size_t(i) < idx.size(); ++i) l.append(node_info(idx[size_t(i)]));
  return l;
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

void GraphCut::poison(const std::vector<int>& roots, const std::string& message) {
  static const uint16_t error = op_id("error");
  for (int i : roots) {
    Storage& s = *roots_.at(size_t(i));
    const NodePtr& out = outputs_[size_t(root_output_[size_t(i)])];
    if (s.value != out) continue;
    auto n = make_node_shaped(error, {}, {message}, out->dtype, out->dims);
    s.value = std::move(n);
    ++s.version;
  }
}

py::list GraphCut::params() const {
  static const uint16_t data = op_id("data");
  py::list l;
  for (const Node* p : params_) {
    if (p->op == data) {
      l.append(p->data);
    } else if (is_floating(p->dtype)) {
      l.append(py::make_tuple(p->scalar, int(p->dtype)));
    } else {
      l.append(py::make_tuple(int64_t(p->scalar), int(p->dtype)));
    }
  }
  return l;
}

py::list GraphCut::output_specs() const {
  py::list l;
  for (const auto& o : outputs_) l.append(py::make_tuple(int(o->dtype), py::tuple(py::cast(o->dims))));
  return l;
}

void GraphCut::assign(const py::list& outs) {
  static const uint16_t data = op_id("data");
  if (outs.size() != outputs_.size()) throw std::runtime_error("GraphCut.assign: wrong number of outputs");
  std::vector<NodePtr> nodes;
  for (size_t k = 0; k < outputs_.size(); ++k) {
    auto n = make_node_shaped(data, {}, {}, outputs_[k]->dtype, outputs_[k]->dims);
    n->data = outs[k];
    nodes.push_back(n);
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

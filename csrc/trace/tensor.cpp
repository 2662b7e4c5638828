// Lazy tensors, storages and view write-back (see tensor.h).
#include "trace/tensor.h"
#include <algorithm>
#include <stdexcept>
#include "ir/op.h"

namespace txc {

static Storage* g_head = nullptr;
static Storage* g_tail = nullptr;
static size_t g_count = 0;

Storage::Storage(NodePtr v) : value(std::move(v)) {
  prev = g_tail;
  if (g_tail) g_tail->next = this; else g_head = this;
  g_tail = this;
  ++g_count;
}

Storage::~Storage() {
  if (prev) prev->next = next; else g_head = next;
  if (next) next->prev = prev; else g_tail = prev;
  --g_count;
}

Storage* live_storages_head() { return g_head; }
size_t live_storage_count() { return g_count; }

LazyTensor::LazyTensor(const LazyTensor& base, NodePtr view) : st_(base.st_), chain_(base.chain_) {
  version_ = st_->version;
  if (!base.chain_.empty() && base.version_ != st_->version) {
    // base was stale: rebuild its chain first so the new view sits on current data.
    LazyTensor fresh(base);
    fresh.value();
    chain_ = fresh.chain_;
    view = make_node(view->op, {chain_.back()}, view->attrs);
  }
  chain_.push_back(std::move(view));
  static const uint16_t reshape = op_id("reshape"), alias = op_id("alias");
  const Node& v = *chain_.back();
  // Reshapes and aliases of a contiguous layout are contiguous (squeeze and
  // unsqueeze too, but for unsqueeze's zero strides next to an empty dim).
  plain_ = base.plain_ && (v.op == alias || (v.op == reshape && (v.attrs.size() == 1 || v.numel() > 0)));
  Dims strides;
  int64_t offset;
  if (v.op == reshape && !base.plain_ && !layout(strides, offset)) {
    // torch's reshape copies here (and its view raises, see the view handler).
    NodePtr copy = std::move(chain_.back());
    chain_.clear();
    st_ = std::make_shared<Storage>(std::move(copy));
    version_ = st_->version;
    plain_ = true;
  }
}

LazyTensor LazyTensor::root() const {
  LazyTensor r(*this);
  r.chain_.clear();
  r.version_ = st_->version;
  r.plain_ = true;
  return r;
}

bool LazyTensor::layout(Dims& strides, int64_t& offset) const {
  const Dims& dims = chain_.empty() ? st_->value->dims : chain_[0]->operands[0]->dims;
  strides.resize(dims.size());
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(dims[i], 1);
  }
  offset = 0;
  for (const auto& v : chain_) {
    auto rule = op_def(v->op).strides;
    if (!rule || !rule(*v, strides, offset)) return false;
  }
  return true;
}

const NodePtr& LazyTensor::value() {
  if (chain_.empty()) return st_->value;
  if (version_ != st_->version) {
    NodePtr parent = st_->value;
    for (auto& v : chain_) {
      v = make_node(v->op, {parent}, v->attrs);
      parent = v;
    }
    version_ = st_->version;
  }
  return chain_.back();
}

void LazyTensor::assign(NodePtr v) {
  const NodePtr& cur = value();
  if (cur->dims != v->dims || cur->dtype != v->dtype)
    throw std::runtime_error("in-place write of a " + std::string(dtype_name(v->dtype)) + dims_str(v->dims) +
                             " value into a " + dtype_name(cur->dtype) + dims_str(cur->dims) + " tensor");
  for (size_t i = chain_.size(); i-- > 0;) {
    const Node& view = *chain_[i];
    const OpDef& def = op_def(view.op);
    if (!def.scatter)
      throw std::runtime_error("in-place write through a '" + def.name +
                               "' view is not supported; write to a clone() instead");
    NodePtr parent = i == 0 ? st_->value : chain_[i - 1];
    v = def.scatter(view, parent, v);
  }
  static const uint16_t alias = op_id("alias"), data = op_id("data");
  if (v->device == kAnyDevice && st_->value->device >= 0) {
    // A value of no device (a constant, fill_) written into a tensor on
    // xla:N keeps the tensor there: an alias node on that device. With one
    // device in use so far, a copy of the value's node on xla:0 (no node
    // more in the graph): a second device used later still sees where the
    // tensor is (torch.ones(2, device="xla") is empty + fill_: it joined
    // xla:1's graphs silently).
    int16_t d = st_->value->device;
    if (g_multi_device || d > 0) v = placed_on(make_node(alias, {std::move(v)}, {}), d);
    else if (v->op != data) v = placed_on(v, d);
  }
  st_->value = std::move(v);
  ++st_->version;
  if (!chain_.empty()) value();
  else version_ = st_->version;
}

}  // namespace txc

// Lazy tensors. A Storage holds the current IR value of one buffer; every
// LazyTensor refers to a Storage, and a view also keeps its chain of view
// nodes from the storage's value. Writing to a view scatters the new value
// back into the storage through the chain (each view op's scatter rule);
// other views of the same storage see the write because they rebuild their
// chain when the storage's version moved. Live storages form the pending
// graph: sync() computes those whose value is not device data.
//
// A view's layout (torch's strides and storage offset, relative to the
// storage as a contiguous buffer) follows from its chain: each view op's
// strides rule (OpDef::strides, ir/op.h). Views whose layout torch would
// not have (a reshape that torch would copy) are made copies when they are
// built.
#pragma once
#include <memory>
#include <vector>
#include "ir/node.h"

namespace txc {

struct Storage : std::enable_shared_from_this<Storage> {
  NodePtr value;
  uint64_t version = 0;
  Storage* prev = nullptr;
  Storage* next = nullptr;
  explicit Storage(NodePtr v);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

// Live storages, oldest first.
Storage* live_storages_head();
size_t live_storage_count();

class LazyTensor {
 public:
  explicit LazyTensor(NodePtr v) : st_(std::make_shared<Storage>(std::move(v))) {}
  // A view of `base`: `view` is a view node whose operand is base.value().
  // A reshape that strides cannot express over a view base (torch would copy)
  // becomes a new storage holding the reshaped value instead: a copy.
  LazyTensor(const LazyTensor& base, NodePtr view);
  LazyTensor(LazyTensor&&) = default;
  LazyTensor& operator=(LazyTensor&&) = default;

  const NodePtr& value();   // current IR (rebuilds a stale view chain)
  void assign(NodePtr v);   // in-place write of a whole new value
  bool is_view() const { return !chain_.empty(); }
  const std::shared_ptr<Storage>& storage() const { return st_; }
  // A new tensor sharing this one's storage and view chain (an alias).
  LazyTensor alias() const { return *this; }
  // The whole storage as a tensor (no view chain): what as_strided indexes.
  LazyTensor root() const;
  // The view's strides and storage offset in elements; false when the chain
  // has a view op without a strides rule. A non-view is contiguous at 0.
  bool layout(Dims& strides, int64_t& offset) const;
  // The layout is known to be contiguous at offset 0 without computing it
  // (a non-view, or reshapes/aliases of one): wrap()'s cheap path.
  bool plain() const { return plain_; }

 private:
  LazyTensor(const LazyTensor&) = default;
  std::shared_ptr<Storage> st_;
  std::vector<NodePtr> chain_;  // view nodes, chain_[0] applied to st_->value
  uint64_t version_ = 0;        // st_->version that chain_ was built from
  bool plain_ = true;           // see plain()
};

}  // namespace txc

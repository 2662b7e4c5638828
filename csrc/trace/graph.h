// A graph cut: the pending values of a set of storages (all live ones at
// sync(), or the few a transfer needs), walked once in post-order to find the
// parameters (device data and Python numbers) and a structural hash that keys
// the compile cache. After execution, assign() makes each storage hold its
// computed device data, so the traced IR is dropped.
#pragma once
#include <pybind11/pybind11.h>
#include <memory>
#include <string>
#include <vector>
#include "trace/tensor.h"

namespace txc {

class GraphCut {
 public:
  // roots: storages to compute; empty means every live storage.
  explicit GraphCut(std::vector<std::shared_ptr<Storage>> roots, bool all_live);

  uint64_t hash() const { return hash_; }
  size_t num_outputs() const { return outputs_.size(); }
  size_t num_nodes() const { return order_.size(); }
  std::string lower() const;
  // Parameters in order: a device buffer object, or (number, dtype code) for
  // a Python number.
  pybind11::list params() const;
  // Output i's dtype code and dims, for the runtime.
  pybind11::list output_specs() const;
  // Makes each root storage hold the computed buffer `outs[k]` (objects from
  // the runtime, one per output).
  void assign(const pybind11::list& outs);

 private:
  void walk();
  std::vector<std::shared_ptr<Storage>> roots_;
  std::vector<int> root_output_;
  std::vector<NodePtr> outputs_;
  std::vector<const Node*> order_, params_;
  uint64_t hash_ = 0;
};

}  // namespace txc

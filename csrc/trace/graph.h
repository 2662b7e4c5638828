// A graph cut: the pending values of a set of storages (all live ones at
// sync(), or the few a transfer needs), walked once in post-order to find the
// parameters (device data and Python numbers) and a structural hash that keys
// the compile cache. After execution, assign() makes each storage hold its
// computed device data, so the traced IR is dropped. A cut's hash is the
// graph's structure only; the executor's compile-cache key adds the lowering
// options and the device (torch_xla_core/_execution/executor.py). Plain C++: its Python
// face (parameters as buffer objects and numbers, outputs assigned from
// runtime buffers, node descriptions as dicts) is py/graph.cpp.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "lower/emitter.h"
#include "trace/tensor.h"

namespace txc {

class GraphCut {
 public:
  // roots: storages to compute, or with all_live every live storage whose
  // value is not device data (roots empty: an empty cut). Storages holding
  // device data or a failed value are skipped (a failed root raises its
  // error unless all_live).
  // device >= 0: only the roots whose value is on that device (kAnyDevice
  // counts as 0); kAllDevices: all.
  explicit GraphCut(std::vector<std::shared_ptr<Storage>> roots, bool all_live, int device = kAllDevices);

  uint64_t hash() const { return hash_; }
  size_t num_outputs() const { return outputs_.size(); }
  size_t num_nodes() const { return order_.size(); }
  size_t num_roots() const { return roots_.size(); }
  // The device the outputs are on (0 when none has one); throws torch's
  // device-mismatch error when they are on several (a partial sync of
  // tensors on different devices: sync them one device at a time).
  int device() const;
  // Each parameter's device (kAnyDevice, e.g. the RNG state; the executor moves
  // such a buffer to the graph's device when it lies elsewhere).
  std::vector<int> param_devices() const;
  // The SPMD sharding annotations in the cut, scan bodies included (nodes of
  // core op "sharding"; attributes: hlo sharding text, mesh device ids, mesh
  // shape, axis names).
  std::vector<const Node*> annotations() const;
  // The nodes of the cut, scan bodies included, whose op is one of `ops`
  // (annotations() is those of "sharding"; the executor asks for collectives).
  std::vector<const Node*> nodes_of(const std::vector<uint16_t>& ops) const;
  // StableHLO text of the cut (see LowerOptions: precision, donation).
  std::string lower(const LowerOptions& options) const;
  // One line per node ("%3 = add(%1, %2) : float32[2, 3]  # aten.add.Tensor"):
  // the graph a sync would compile, for people.
  std::string text() const;
  // Parameters that may be donated to an output of the same type, as
  // (parameter index, output index) pairs: in a sync of every live storage,
  // device data that nothing but this graph refers to (no storage, view
  // chain or scan body holds its node, no other Python reference to its
  // buffer), so overwriting it in place is invisible. A training step's old
  // parameters and optimizer state are.
  std::vector<std::pair<int, int>> donations() const;
  // After a failure (see torch_xla_core/_execution/executor.py). The node that emitted
  // line `line` (1-based) of the last lower(), as its position in the walk,
  // or -1.
  int node_at_line(int line) const;
  // Node k of the walk (post-order), and the bytes of its value.
  const Node& node(int k) const { return *order_.at(size_t(k)); }
  static int64_t bytes(const Node& n);
  // Up to `count` nodes (their positions) by size, largest first.
  std::vector<int> largest(int count) const;
  // Indices of the roots whose value uses node k.
  std::vector<int> roots_using(int k) const;
  // A cut of some of this cut's roots (by index).
  GraphCut subset(const std::vector<int>& roots) const;
  // Makes the given roots hold a failed value (core op "error") whose use
  // raises `message`; unless they were written since the cut.
  void poison(const std::vector<int>& roots, const std::string& message);
  // The same for every root still holding what assign() gave it (the graph
  // failed while running, after its outputs were handed out): those whose
  // value `holds_output(value, output index)` says is that output's.
  void poison_assigned(const std::function<bool(const Node& value, size_t output)>& holds_output,
                       const std::string& message);
  // Parameters in order: data leaves (device buffers) and Python numbers
  // (one per distinct number: equal ones share it).
  const std::vector<const Node*>& params() const { return params_; }
  // The outputs in order (one per distinct root value).
  const std::vector<NodePtr>& outputs() const { return outputs_; }
  // The parameters and the outputs that live outside device memory, as
  // (index, MemoryKind) pairs (ir/memory.h). Part of the executor's cache key.
  std::vector<std::pair<int, int>> param_memory_kinds() const;
  std::vector<std::pair<int, int>> output_memory_kinds() const;
  // Makes each root storage hold the computed buffer `data[k]` (the payloads
  // of new data leaves, one per output).
  void assign(std::vector<std::shared_ptr<const LeafData>> data);

 private:
  void walk();
  std::vector<std::shared_ptr<Storage>> roots_;
  std::vector<int> root_output_;
  std::vector<NodePtr> outputs_;
  std::vector<const Node*> order_, params_;
  // Python numbers equal to an earlier one (dtype, value, device): they read
  // that one's parameter (index) instead of one of their own.
  std::vector<std::pair<const Node*, int>> shared_;
  uint64_t hash_ = 0;
  mutable std::vector<int> line_node_;  // from the last lower()
  bool all_live_ = false;
};

}  // namespace txc

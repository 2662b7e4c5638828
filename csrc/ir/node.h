// The IR: a Node is one core op applied to operand nodes, with attributes,
// an output shape and dtype, and a structural hash computed once when it is
// built (op, operand hashes, attributes, shape, dtype, body). Every node has
// one output. Nodes are immutable: complete and hashed when make_node (or a
// leaf constructor) returns them, never changed afterwards, and they hold no
// scratch state: graph walks and lowering keep theirs in their own context.
// Data and Scalar nodes are the graph's parameters: their payload (an
// opaque device buffer, a number) is not part of the hash, so new data never
// changes a graph's identity.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>
#include "ir/dtype.h"

namespace txc {

using Dims = std::vector<int64_t>;
using Attr = std::variant<int64_t, double, std::string, Dims>;
using Attrs = std::vector<Attr>;

// Device numbers besides a device's index (Python: _C.ANY_DEVICE, _C.ALL_DEVICES).
constexpr int16_t kAnyDevice = -1;  // a value that joins a graph on any device (numbers, constants, the RNG state)
constexpr int kAllDevices = -2;     // a GraphCut over every device's values (a sync of all live tensors)

struct Node;
using NodePtr = std::shared_ptr<Node>;
struct Body;

// The payload of a data leaf (a device buffer): opaque to the IR; the
// Python layer subclasses it (py/data.h).
struct LeafData {
  virtual ~LeafData() = default;
  // Whether something besides the node holds the buffer (a Python
  // reference): then overwriting it in place (donation) would be seen.
  // A payload that cannot tell says so.
  virtual bool held_elsewhere() const { return true; }
};

struct Node {
  uint16_t op = 0;        // index into the op table (ir/op.h)
  DType dtype = DType::F32;
  Dims dims;
  std::vector<NodePtr> operands;
  Attrs attrs;
  uint64_t hash = 0;
  // Payload of parameter nodes (not hashed): device data, or a number.
  std::shared_ptr<const LeafData> data;
  double scalar = 0;
  double scalar_imag = 0;  // a complex Python number's imaginary part
  bool wrapped = false;  // a Python number: weakly typed in promotion
  // Data nodes: the memory space their buffer lives in (MemoryKind, see
  // ir/memory.h). Not hashed: the executor's cache key carries the
  // graph's input and output memory kinds.
  uint8_t memory = 0;
  // The xla device index the value lives on, or kAnyDevice (Python
  // numbers, constants and factories without a device, the RNG state): taken
  // from the operands when built; operands on two different devices are
  // refused with torch's device-mismatch error. A sharded value (SPMD) is on
  // device 0, the mesh's virtual device, as in torch_xla. Not hashed: the
  // executor's cache key carries the graph's device.
  int16_t device = kAnyDevice;
  // Where the node came from: the aten overload being dispatched when it was
  // built (an index into origin_names(); 0 = none). Not hashed: it only names
  // ops in errors (a failed compile, an out-of-memory).
  uint32_t origin = 0;
  // When the node was built: a process-wide count every constructor takes
  // (next_seq()), so an operand's seq is below its users'. Not hashed: the
  // lowering emits ordered ops (collectives across replicas, OpDef::ordered)
  // in this order, each after the previous one, as the user traced them.
  uint64_t seq = 0;
  // Sub-graph ops (a scan loop): the body they run; its hash is part of n.hash.
  std::shared_ptr<const Body> body;

  int64_t numel() const;
  int rank() const { return int(dims.size()); }
  int64_t attr_int(size_t i) const { return std::get<int64_t>(attrs.at(i)); }
  double attr_float(size_t i) const { return std::get<double>(attrs.at(i)); }
  const Dims& attr_dims(size_t i) const { return std::get<Dims>(attrs.at(i)); }
  const std::string& attr_str(size_t i) const { return std::get<std::string>(attrs.at(i)); }
};

// A sub-graph (a loop body): ordinary nodes over placeholder parameters
// (core op "placeholder", attribute 0 = its index), built by ops/scan.cpp.
// The hash is structural (ops, shapes, wiring), so equal bodies share
// compiled code and different ones never do.
struct Body {
  std::vector<NodePtr> params;    // placeholders; params[i] has index i
  std::vector<NodePtr> outputs;
  // Leaves the body read that are not its inputs (device data, Python
  // numbers): passed to the sub-graph op as its last operands, seen by the
  // body as its last params.
  std::vector<NodePtr> consts;
  std::vector<const Node*> order;  // params, then the rest in post-order
  uint64_t hash = 0;
};

// 64-bit hash mixing (splitmix64 finalizer).
inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  v += 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  v ^= v >> 30; v *= 0xbf58476d1ce4e5b9ULL;
  v ^= v >> 27; v *= 0x94d049bb133111ebULL;
  v ^= v >> 31;
  return h ^ v;
}
uint64_t hash_attrs(uint64_t h, const Attrs& attrs);

// Builds a node, the one way computed nodes are made: settles the dtype of
// fresh Python-number operands (OpDef::number_dtype), runs the op's shape
// rule, then hashes. `body`: the sub-graph of a sub-graph op (scan). Throws
// std::runtime_error naming the op when the operands don't fit.
NodePtr make_node(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, std::shared_ptr<const Body> body = nullptr);
// n with other operands (same op, attributes, shape, body, payload), built
// and hashed anew: how a graph is copied (scan bodies).
// The copy keeps n's device.
NodePtr copy_node(const Node& n, std::vector<NodePtr> operands);
// n on xla device `device` (n's device must be -1 "any" or `device`): a copy
// with the same hash, so a value made without a device (a factory's, a
// constant written into a tensor on xla:N) is placed without changing a
// built node.
NodePtr placed_on(const NodePtr& n, int16_t device);
// A device data leaf (core op "data"): a graph parameter holding `data` on
// xla device `device` (-1: any) in memory space `memory` (ir/memory.h).
NodePtr make_data(DType dtype, Dims dims, std::shared_ptr<const LeafData> data, int16_t device, uint8_t memory = 0);
// A scalar leaf (core op "scalar"): a number `value` + `imag` i passed as a
// graph parameter (on no device); `wrapped`: a Python number, weakly typed
// in promotion.
NodePtr make_scalar(double value, DType dtype, bool wrapped, double imag = 0);
// The device of a new node over these operands (see Node::device); throws
// torch's device-mismatch error when two differ, or an operand's failure.
int16_t operand_device(const std::vector<NodePtr>& operands);
// Set once a value is put on a device other than xla:0: from then on a
// value of no device written in place into a tensor on xla:0 is pinned
// there too (LazyTensor::assign), so that mixing devices is always caught.
extern bool g_multi_device;
// A leaf whose shape is given (placeholders of a body, failed values; the
// extension API's ops whose rule needs the caller's shape).
NodePtr make_node_shaped(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, DType dtype, Dims dims);

// Provenance of new nodes: the aten overload being dispatched on this thread
// (set by the dispatcher around each handler; 0 outside any).
extern thread_local uint32_t t_origin;
uint32_t origin_id(const std::string& aten_name);   // interns a name
const std::string& origin_name(uint32_t id);        // "" for 0

// A failed value: the node a storage holds after the graph computing it
// failed (core op "error", attribute 0 = the message). Using it as an operand
// raises that message.
bool is_error(const Node& n);

// n's structural hash from its fields. The core hashes every node as it
// builds it (the extension API v1 still offers rehash(n) for nodes an
// extension builds by hand).
uint64_t node_hash(const Node& n);
uint64_t next_seq();  // Node::seq of the next node built

std::string dims_str(const Dims& d);  // "[2, 3]" for errors

}  // namespace txc

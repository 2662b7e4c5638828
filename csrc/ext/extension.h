// The extension side of the core's C++ API. Include it in exactly ONE
// source file of an extension module (it defines functions), and write the
// module with TXC_EXTENSION_MODULE instead of PYBIND11_MODULE:
//
//   #include <torch_xla_core/ext/extension.h>
//   using namespace txc;
//   TXC_OP("my_op", 1, my_shape_rule, my_lowering);   // as in csrc/ops/*.cpp
//   TXC_EXTENSION_MODULE(_C, m) { m.def(...); }
//
// Other source files of the extension include the core's headers as usual
// (ops/registry.h, lower/emitter.h, ir/node.h) and use the same functions.
//
// How it works: the core is a Python extension module with hidden symbols,
// so an extension cannot link against it. This file defines the core
// functions the headers declare (register_op, op_error, make_node, the
// LowerCtx helpers, ...) as forwarders into the table the core publishes as
// the capsule torch_xla_core._C._api (ext/api.h). When the module is
// imported, TXC_EXTENSION_MODULE first checks, from the capsule's name
// alone, that the core was compiled with this extension's C++ ABI flavor:
// otherwise it raises ImportError naming both flavors and the wheel to
// install, before any std::string crosses between the two. Then it checks
// the headers' layout against the core's, and only then registers the ops.
//
// Ops registered with TXC_OP at namespace scope run before that check: they
// are queued and enter the core's registry when the module imports (the id
// TXC_OP returns is not yet valid then; look it up with op_id(name), or in
// Python from the module's `ops` dict, or torch_xla_core._C.op_ids()). Ops
// registered inside the module body get their id at once. Forwarded: the
// functions of ops/registry.h, ir/op.h, ir/node.h, ir/dtype.h and LowerCtx
// (lower/emitter.h), and ext::graph_hash / ext::graph_stablehlo (a graph's
// cut, as a sync makes it); using another core function fails at import with an
// undefined symbol (add it to the table: ext/api.h).
#pragma once
#include <Python.h>
#include <pybind11/eval.h>
#include <pybind11/pybind11.h>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "ext/api.h"

// Everything below is this extension's own: hidden, so that two extensions
// never share (GNU-unique) inline state such as g_api or the pending ops.
#pragma GCC visibility push(hidden)

namespace txc {
namespace ext {

inline const Api* g_api = nullptr;
constexpr uint16_t kPendingOp = 0xFFFF;  // what TXC_OP returns before the module imports

inline std::vector<OpDef>& pending_ops() {
  static std::vector<OpDef> v;
  return v;
}
inline std::vector<std::pair<std::string, uint16_t>>& registered_ops() {
  static std::vector<std::pair<std::string, uint16_t>> v;
  return v;
}

inline const Api& api() {
  if (!g_api)
    throw std::logic_error(
        "torch_xla_core extension API used before the module was imported (a core function called from a "
        "static initializer? register ops with TXC_OP and call the core from the module body or from op rules)");
  return *g_api;
}

// Python's str() of an attribute chain, or `fallback` when anything fails.
inline std::string py_lookup(const char* code, const std::string& fallback) {
  try {
    pybind11::dict scope;
    return pybind11::str(pybind11::eval(code, scope)).cast<std::string>();
  } catch (const std::exception&) {
    PyErr_Clear();
    return fallback;
  }
}

// The message for an extension of flavor `mine` loaded into a core of flavor `core`.
inline std::string flavor_mismatch_message(const std::string& ext_name, const std::string& mine,
                                           const std::string& core) {
  std::string version = py_lookup("__import__('importlib.metadata').metadata.version('torch_xla_core')", "");
  std::string base = version.substr(0, version.find('+'));
  std::string label = py_lookup(
      ("__import__('importlib').import_module('torch_xla_core._runtime.build_info').LOCAL_LABEL['" + mine + "']").c_str(),
                                mine == "cxx11" ? "" : mine);
  std::string want = "torch_xla_core==" + (base.empty() ? std::string("<version>") : base) +
                     (label.empty() ? "" : "+" + label);
  int my_abi = _GLIBCXX_USE_CXX11_ABI;
  return ext_name + " was built against the " + mine + " flavor of torch_xla_core (_GLIBCXX_USE_CXX11_ABI=" +
         std::to_string(my_abi) + "), but the installed torch_xla_core" + (version.empty() ? "" : " " + version) +
         " is the " + core + " flavor (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(1 - my_abi) +
         "): the two flavors' C++ types differ, so the extension cannot be loaded into it. Install the " + mine +
         " wheel of torch_xla_core: `pip install " + want + " -f wheelhouse/" + mine +
         " --force-reinstall --no-deps`, or rebuild " + ext_name + " against the installed " + core + " core.";
}

// Fetches and checks the core's API table; raises ImportError (through
// pybind11) when the core is missing, of the other flavor, or of other headers.
inline void import_api(pybind11::module_& m) {
  std::string me = "extension";
  try {
    me = m.attr("__name__").cast<std::string>();
  } catch (const std::exception&) {
    PyErr_Clear();
  }
  pybind11::object core = pybind11::reinterpret_steal<pybind11::object>(PyImport_ImportModule("torch_xla_core._C"));
  if (!core) {
    pybind11::error_already_set e;
    throw pybind11::import_error(me + " needs torch_xla_core, which failed to import: " + e.what());
  }
  pybind11::object cap = pybind11::reinterpret_steal<pybind11::object>(PyObject_GetAttrString(core.ptr(), "_api"));
  if (!cap || !PyCapsule_CheckExact(cap.ptr())) {
    PyErr_Clear();
    throw pybind11::import_error(me + " needs torch_xla_core's C++ extension API (torch_xla_core._C._api), which the "
                                 "installed torch_xla_core does not provide: install a newer torch_xla_core");
  }
  const char* name = PyCapsule_GetName(cap.ptr());
  if (!name) name = "";
  const size_t plen = std::strlen(TXC_API_CAPSULE_PREFIX);
  if (std::strncmp(name, TXC_API_CAPSULE_PREFIX, plen) != 0)
    throw pybind11::import_error(me + " was built for torch_xla_core's extension API " TXC_API_CAPSULE_PREFIX
                                 "*, but the installed core provides '" + std::string(name) +
                                 "': rebuild " + me + " against the installed torch_xla_core");
  const std::string core_flavor = name + plen;
  if (core_flavor != TXC_API_FLAVOR)  // before reading anything but C strings
    throw pybind11::import_error(flavor_mismatch_message(me, TXC_API_FLAVOR, core_flavor));
  const Api* a = static_cast<const Api*>(PyCapsule_GetPointer(cap.ptr(), name));
  if (!a) throw pybind11::error_already_set();
  const ApiHeader& h = a->header;
  if (h.magic != TXC_API_MAGIC || h.version != TXC_API_VERSION || h.size < sizeof(Api) ||
      h.cxx11_abi != _GLIBCXX_USE_CXX11_ABI || h.layout != layout_hash())
    throw pybind11::import_error(me + " was built against torch_xla_core headers that do not match the installed core "
                                 "(API v" + std::to_string(h.version) + ", table of " + std::to_string(h.size) +
                                 " bytes, layout " + (h.layout == layout_hash() ? "equal" : "different") +
                                 "): rebuild " + me + " against the installed torch_xla_core");
  g_api = a;
  std::vector<OpDef> ops = std::move(pending_ops());
  pending_ops().clear();
  for (auto& d : ops) {
    std::string op_name = d.name;
    try {
      registered_ops().emplace_back(op_name, a->register_op(&d));
    } catch (const std::exception& e) {
      throw pybind11::import_error(me + ": cannot register core op '" + op_name + "': " + e.what());
    }
  }
}

// After the module body: the module's `ops` dict ({name: core op id}), and
// torch_xla_core._tracing.tensor.OP learns the new ops when it is already loaded
// (later imports read the registry themselves).
inline void publish_ops(pybind11::module_& m) {
  pybind11::dict ops;
  for (auto& [name, id] : registered_ops()) ops[pybind11::str(name)] = id;
  m.attr("ops") = ops;
  m.attr("flavor") = TXC_API_FLAVOR;
  pybind11::dict modules = pybind11::module_::import("sys").attr("modules");
  if (modules.contains("torch_xla_core._tracing.tensor")) {
    pybind11::object table = modules["torch_xla_core._tracing.tensor"].attr("OP");
    for (auto& [name, id] : registered_ops()) pybind11::setattr(table, name.c_str(), pybind11::int_(id));
  }
}

// The graph that computes `roots` as a sync would cut it: its hash (the
// compile-cache key's graph part) and its StableHLO text.
inline uint64_t graph_hash(const std::vector<NodePtr>& roots) { return api().graph_hash(roots); }
inline std::string graph_stablehlo(const std::vector<NodePtr>& roots) { return api().graph_stablehlo(roots); }

}  // namespace ext

// ---- The core's functions, forwarded through the table (hidden: they are
// this extension's own definitions, never exported or interposed).

uint16_t register_op(OpDef def) {
  if (!ext::g_api) {
    ext::pending_ops().push_back(std::move(def));
    return ext::kPendingOp;
  }
  std::string name = def.name;
  uint16_t id = ext::g_api->register_op(&def);
  ext::registered_ops().emplace_back(std::move(name), id);
  return id;
}
const OpDef& op_def(uint16_t op) { return ext::api().op_def(op); }
int find_op(const std::string& name) { return ext::api().find_op(name); }
uint16_t op_id(const std::string& name) {
  int id = find_op(name);
  if (id < 0) throw std::runtime_error("unknown core op '" + name + "'");
  return uint16_t(id);
}
const std::vector<OpDef>& all_ops() { return ext::api().all_ops(); }
void op_error(const Node& n, const std::string& msg) {
  ext::api().op_error(n, msg);
  throw std::logic_error("op_error returned");  // unreachable: the core's op_error throws
}
Dims broadcast_dims(const Node& n, const Dims& a, const Dims& b) { return ext::api().broadcast_dims(n, a, b); }
int64_t norm_dim(const Node& n, int64_t d, int64_t rank) { return ext::api().norm_dim(n, d, rank); }

NodePtr make_node(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, std::shared_ptr<const Body> body) {
  if (body)  // sub-graph ops (scan) are the core's own
    throw std::invalid_argument("make_node: the extension API builds nodes without a body (core op '" +
                                op_def(op).name + "' was given one)");
  return ext::api().make_node(op, &operands, &attrs);
}
NodePtr make_node_shaped(uint16_t op, std::vector<NodePtr> operands, Attrs attrs, DType dtype, Dims dims) {
  return ext::api().make_node_shaped(op, &operands, &attrs, dtype, dims);
}
void rehash(Node& n) { ext::api().rehash(n); }
std::string dims_str(const Dims& d) { return ext::api().dims_str(d); }
uint64_t hash_attrs(uint64_t h, const Attrs& attrs) { return ext::api().hash_attrs(h, attrs); }
int64_t Node::numel() const { return ext::api().numel(*this); }
NodePtr make_data(DType dtype, Dims dims, std::shared_ptr<const LeafData> data, int16_t device, uint8_t memory) {
  return ext::api().make_data(dtype, &dims, &data, device, memory);
}

const char* mlir_name(DType t) { return ext::api().mlir_name(t); }
const char* dtype_name(DType t) { return ext::api().dtype_name(t); }
int bit_width(DType t) { return ext::api().bit_width(t); }
DType promote_types(DType a, DType b) { return ext::api().promote_types(a, b); }
void ResultType::add(DType t, int rank, bool wrapped_number) { ext::api().result_type_add(*this, t, rank, wrapped_number); }
DType ResultType::result() const { return ext::api().result_type_result(*this); }

std::string LowerCtx::type(DType t, const Dims& d) { return ext::api().type(t, d); }
std::string LowerCtx::i64_array(const Dims& d) { return ext::api().i64_array(d); }
std::string LowerCtx::literal(double v, DType t) { return ext::api().literal(v, t); }
std::string LowerCtx::fresh() { return ext::api().fresh(*this); }
std::string LowerCtx::op(const std::string& name, const std::vector<std::string>& args,
                         const std::vector<std::string>& arg_types, const std::string& result_type,
                         const std::string& props, const std::string& region) {
  return ext::api().op(*this, name, args, arg_types, result_type, props, region);
}
std::string LowerCtx::op_multi(const std::string& name, const std::vector<std::string>& args,
                               const std::vector<std::string>& arg_types, const std::vector<std::string>& result_types,
                               const std::string& props, const std::string& region) {
  return ext::api().op_multi(*this, name, args, arg_types, result_types, props, region);
}
std::string LowerCtx::convert(const std::string& v, DType from, DType to, const Dims& d) {
  return ext::api().convert(*this, v, from, to, d);
}
std::string LowerCtx::broadcast(const std::string& v, DType t, const Dims& from, const Dims& to) {
  return ext::api().broadcast(*this, v, t, from, to);
}
std::string LowerCtx::broadcast_in_dim(const std::string& v, DType t, const Dims& from, const Dims& to,
                                       const Dims& map) {
  return ext::api().broadcast_in_dim(*this, v, t, from, to, map);
}
std::string LowerCtx::reshape(const std::string& v, DType t, const Dims& from, const Dims& to) {
  return ext::api().reshape(*this, v, t, from, to);
}
std::string LowerCtx::constant(double v, DType t, const Dims& d) { return ext::api().constant(*this, v, t, d); }
std::string LowerCtx::coerce(const Node& n, size_t i, DType t, const Dims& d) {
  return ext::api().coerce(*this, n, i, t, d);
}
std::string LowerCtx::reduce(const std::string& v, DType t, const Dims& in, const Dims& axes,
                             const std::string& body_op, double init) {
  return ext::api().reduce(*this, v, t, in, axes, body_op, init);
}
std::vector<std::string> LowerCtx::lower_body(const Body& b, const std::vector<std::string>& args) {
  return ext::api().lower_body(*this, b, args);
}
std::string LowerCtx::region_text(const std::vector<std::string>& args, const std::vector<std::string>& types,
                                  const std::function<void()>& emit) {
  return ext::api().region_text(*this, args, types, emit);
}

}  // namespace txc

#pragma GCC visibility pop

// The extension's module: PYBIND11_MODULE, with the core's API imported and
// checked (flavor, version) before the body runs, and the module's core ops
// published afterwards (`ops`, `flavor` attributes).
#define TXC_EXT_CAT2(a, b) a##b
#define TXC_EXT_CAT(a, b) TXC_EXT_CAT2(a, b)
#define TXC_EXTENSION_MODULE(name, variable)                                        \
  static void TXC_EXT_CAT(txc_ext_body_, name)(::pybind11::module_ & variable);     \
  PYBIND11_MODULE(name, txc_ext_module_) {                                          \
    ::txc::ext::import_api(txc_ext_module_);                                        \
    TXC_EXT_CAT(txc_ext_body_, name)(txc_ext_module_);                              \
    ::txc::ext::publish_ops(txc_ext_module_);                                       \
  }                                                                                 \
  static void TXC_EXT_CAT(txc_ext_body_, name)(::pybind11::module_ & variable)

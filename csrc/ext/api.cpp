// The core's side of the extension API (ext/api.h): fills the table and
// publishes it as the capsule torch_xla_core._C._api, named
// "torch_xla_core._C.api.v1.<flavor>". Extensions read it through
// ext/extension.h; nothing here is called from the core itself.
#include "ext/api.h"
#include <pybind11/pybind11.h>
#include "trace/graph.h"
#include "trace/tensor.h"

namespace txc {
namespace ext {
namespace {

GraphCut cut_of(const std::vector<NodePtr>& roots) {
  std::vector<std::shared_ptr<Storage>> storages;
  for (const NodePtr& r : roots) storages.push_back(LazyTensor(r).storage());
  return GraphCut(std::move(storages), false);  // the cut keeps the storages alive
}

const Api kApi = {
    {TXC_API_MAGIC, TXC_API_VERSION, uint32_t(sizeof(Api)), int32_t(_GLIBCXX_USE_CXX11_ABI), TXC_API_FLAVOR,
     layout_hash()},
    // registry
    [](OpDef* def) { return txc::register_op(std::move(*def)); },
    [](uint16_t op) -> const OpDef& { return txc::op_def(op); },
    [](const std::string& name) { return txc::find_op(name); },
    []() -> const std::vector<OpDef>& { return txc::all_ops(); },
    [](const Node& n, const std::string& msg) { txc::op_error(n, msg); },
    [](const Node& n, const Dims& a, const Dims& b) { return txc::broadcast_dims(n, a, b); },
    [](const Node& n, int64_t d, int64_t rank) { return txc::norm_dim(n, d, rank); },
    // node
    [](uint16_t op, std::vector<NodePtr>* xs, Attrs* attrs) { return txc::make_node(op, std::move(*xs), std::move(*attrs)); },
    [](uint16_t op, std::vector<NodePtr>* xs, Attrs* attrs, DType t, const Dims& d) {
      return txc::make_node_shaped(op, std::move(*xs), std::move(*attrs), t, d);
    },
    [](Node& n) { n.hash = txc::node_hash(n); },
    [](const Dims& d) { return txc::dims_str(d); },
    [](uint64_t h, const Attrs& a) { return txc::hash_attrs(h, a); },
    [](const Node& n) { return n.numel(); },
    // dtype
    [](DType t) { return txc::mlir_name(t); },
    [](DType t) { return txc::dtype_name(t); },
    [](DType t) { return txc::bit_width(t); },
    [](DType a, DType b) { return txc::promote_types(a, b); },
    [](ResultType& r, DType t, int rank, bool w) { r.add(t, rank, w); },
    [](const ResultType& r) { return r.result(); },
    // LowerCtx
    [](DType t, const Dims& d) { return LowerCtx::type(t, d); },
    [](const Dims& d) { return LowerCtx::i64_array(d); },
    [](double v, DType t) { return LowerCtx::literal(v, t); },
    [](LowerCtx& cx) { return cx.fresh(); },
    [](LowerCtx& cx, const std::string& name, const std::vector<std::string>& args,
       const std::vector<std::string>& arg_types, const std::string& result_type, const std::string& props,
       const std::string& region) { return cx.op(name, args, arg_types, result_type, props, region); },
    [](LowerCtx& cx, const std::string& name, const std::vector<std::string>& args,
       const std::vector<std::string>& arg_types, const std::vector<std::string>& result_types,
       const std::string& props, const std::string& region) {
      return cx.op_multi(name, args, arg_types, result_types, props, region);
    },
    [](LowerCtx& cx, const std::string& v, DType from, DType to, const Dims& d) { return cx.convert(v, from, to, d); },
    [](LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to) {
      return cx.broadcast(v, t, from, to);
    },
    [](LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to, const Dims& map) {
      return cx.broadcast_in_dim(v, t, from, to, map);
    },
    [](LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to) {
      return cx.reshape(v, t, from, to);
    },
    [](LowerCtx& cx, double v, DType t, const Dims& d) { return cx.constant(v, t, d); },
    [](LowerCtx& cx, const Node& n, size_t i, DType t, const Dims& d) { return cx.coerce(n, i, t, d); },
    [](LowerCtx& cx, const std::string& v, DType t, const Dims& in, const Dims& axes, const std::string& body_op,
       double init) { return cx.reduce(v, t, in, axes, body_op, init); },
    [](LowerCtx& cx, const Body& b, const std::vector<std::string>& args) { return cx.lower_body(b, args); },
    [](LowerCtx& cx, const std::vector<std::string>& args, const std::vector<std::string>& types,
       const std::function<void()>& emit) { return cx.region_text(args, types, emit); },
    // node: data leaves
    [](DType t, Dims* d, std::shared_ptr<const LeafData>* data, int16_t device, uint8_t memory) {
      return txc::make_data(t, std::move(*d), std::move(*data), device, memory);
    },
    // graph
    [](const std::vector<NodePtr>& roots) { return cut_of(roots).hash(); },
    [](const std::vector<NodePtr>& roots) { return cut_of(roots).lower(LowerOptions{}); },
};

}  // namespace

void bind_ext_api(pybind11::module_& m) {
  // The name says the flavor: PyCapsule_IsValid(cap, "...api.v1.<flavor>")
  // is an extension's whole check, in C, before anything C++ crosses.
  m.attr("_api") = pybind11::capsule(static_cast<const void*>(&kApi), TXC_API_CAPSULE_NAME);
  m.attr("_api_flavor") = TXC_API_FLAVOR;
}

}  // namespace ext
}  // namespace txc

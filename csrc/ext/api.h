// The core's C++ API for out-of-tree extensions, as one versioned table of
// function pointers. The core (_C, a Python extension module whose symbols
// are hidden) publishes it as the PyCapsule `torch_xla_core._C._api`, named
// "torch_xla_core._C.api.v1.<flavor>"; an extension fetches it when it is
// imported (ext/extension.h) instead of linking against _C.
//
// The table starts with an ABI-neutral header (integers and C strings only),
// so an extension reads the core's flavor before it touches anything that
// holds a std::string or std::list: the pre-C++11 and C++11 ABIs of
// libstdc++ lay those out differently, and an OpDef or Node handed across
// the two flavors would crash. The rest of the table is plain C++ (OpDef,
// Node, LowerCtx, std::string), safe once the flavors and layouts match.
//
// Adding an entry: append it at the end of Api (never reorder or remove in
// v1), fill it in ext/api.cpp, forward it in ext/extension.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "ir/node.h"
#include "lower/emitter.h"
#include "ops/registry.h"

#if !defined(_GLIBCXX_USE_CXX11_ABI)
#error "torch_xla_core's C++ API needs libstdc++ (the core is built with it)"
#endif

#define TXC_API_VERSION 1
#define TXC_API_MAGIC 0x41435854u  // "TXCA"
#define TXC_API_CAPSULE_PREFIX "torch_xla_core._C.api.v1."
// The flavor this translation unit is compiled for (names of build/flavors.toml).
#if _GLIBCXX_USE_CXX11_ABI
#define TXC_API_FLAVOR "cxx11"
#else
#define TXC_API_FLAVOR "precxx11"
#endif
#define TXC_API_CAPSULE_NAME TXC_API_CAPSULE_PREFIX TXC_API_FLAVOR

namespace txc {
namespace ext {

// ABI-neutral: the same bytes in both flavors. Read it first.
struct ApiHeader {
  uint32_t magic;        // TXC_API_MAGIC
  uint32_t version;      // TXC_API_VERSION
  uint32_t size;         // sizeof(Api) in the core: entries past an older extension's end are extra
  int32_t cxx11_abi;     // _GLIBCXX_USE_CXX11_ABI of the core
  const char* flavor;    // "cxx11" | "precxx11"
  uint64_t layout;       // layout_hash() of the core (compare only when the flavors match)
};

// Sizes of the types that cross the boundary by reference; differs between
// headers of different core versions (and between flavors).
constexpr uint64_t layout_hash() {
  uint64_t h = 1469598103934665603ULL;
  const uint64_t sizes[] = {sizeof(Node), alignof(Node), sizeof(OpDef), sizeof(LowerCtx),
                            sizeof(std::string), sizeof(Attr), sizeof(NodePtr), uint64_t(DType::kCount)};
  for (uint64_t s : sizes) h = (h ^ s) * 1099511628211ULL;
  return h;
}

struct Api {
  ApiHeader header;

  // ir/op.h (the op table), ops/registry.h
  uint16_t (*register_op)(OpDef* def);  // moves *def into the core's registry
  const OpDef& (*op_def)(uint16_t op);
  int (*find_op)(const std::string& name);
  const std::vector<OpDef>& (*all_ops)();
  void (*op_error)(const Node& n, const std::string& msg);  // throws
  Dims (*broadcast_dims)(const Node& n, const Dims& a, const Dims& b);
  int64_t (*norm_dim)(const Node& n, int64_t d, int64_t rank);

  // ir/node.h
  NodePtr (*make_node)(uint16_t op, std::vector<NodePtr>* operands, Attrs* attrs);
  NodePtr (*make_node_shaped)(uint16_t op, std::vector<NodePtr>* operands, Attrs* attrs, DType dtype,
                              const Dims& dims);
  void (*rehash)(Node& n);
  std::string (*dims_str)(const Dims& d);
  uint64_t (*hash_attrs)(uint64_t h, const Attrs& attrs);
  int64_t (*numel)(const Node& n);

  // ir/dtype.h
  const char* (*mlir_name)(DType t);
  const char* (*dtype_name)(DType t);
  int (*bit_width)(DType t);
  DType (*promote_types)(DType a, DType b);
  void (*result_type_add)(ResultType& r, DType t, int rank, bool wrapped_number);
  DType (*result_type_result)(const ResultType& r);

  // lower/emitter.h (LowerCtx)
  std::string (*type)(DType t, const Dims& d);
  std::string (*i64_array)(const Dims& d);
  std::string (*literal)(double v, DType t);
  std::string (*fresh)(LowerCtx& cx);
  std::string (*op)(LowerCtx& cx, const std::string& name, const std::vector<std::string>& args,
                    const std::vector<std::string>& arg_types, const std::string& result_type,
                    const std::string& props, const std::string& region);
  std::string (*op_multi)(LowerCtx& cx, const std::string& name, const std::vector<std::string>& args,
                          const std::vector<std::string>& arg_types, const std::vector<std::string>& result_types,
                          const std::string& props, const std::string& region);
  std::string (*convert)(LowerCtx& cx, const std::string& v, DType from, DType to, const Dims& d);
  std::string (*broadcast)(LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to);
  std::string (*broadcast_in_dim)(LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to,
                                  const Dims& map);
  std::string (*reshape)(LowerCtx& cx, const std::string& v, DType t, const Dims& from, const Dims& to);
  std::string (*constant)(LowerCtx& cx, double v, DType t, const Dims& d);
  std::string (*coerce)(LowerCtx& cx, const Node& n, size_t i, DType t, const Dims& d);
  std::string (*reduce)(LowerCtx& cx, const std::string& v, DType t, const Dims& in, const Dims& axes,
                        const std::string& body_op, double init);
  std::vector<std::string> (*lower_body)(LowerCtx& cx, const Body& b, const std::vector<std::string>& args);
  std::string (*region_text)(LowerCtx& cx, const std::vector<std::string>& args, const std::vector<std::string>& types,
                             const std::function<void()>& emit);

  // ir/node.h: a device data leaf (a graph parameter)
  NodePtr (*make_data)(DType dtype, Dims* dims, std::shared_ptr<const LeafData>* data, int16_t device, uint8_t memory);
  // trace/graph.h, for an extension's own checks and benchmarks: the graph
  // that computes `roots`, cut as a sync cuts it (post-order walk + graph
  // hash), and its StableHLO text (default lowering options)
  uint64_t (*graph_hash)(const std::vector<NodePtr>& roots);
  std::string (*graph_stablehlo)(const std::vector<NodePtr>& roots);
};

}  // namespace ext
}  // namespace txc

// pybind11 bindings of the core: torch_xla_core._C. Python passes core op ids
// (from op_ids()), operands (LazyTensors, Python numbers, or (number, dtype)
// pairs for 0-d host tensors) and attributes (ints, floats, strings, int
// lists); everything about shapes, dtypes, hashing and lowering happens here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "bench_core.h"
#include "build_info.h"
#include "lower/emitter.h"
#include "ops/registry.h"
#include "trace/graph.h"
#include "trace/tensor.h"
#include "py/lazy.h"
#include "py/data.h"
#include "py/mapping.h"
#include "py/wrapper.h"

namespace py = pybind11;

namespace txc {
void bind_dispatch(py::module_& m);              // py/dispatch.cpp: the C++ __torch_dispatch__
namespace ext { void bind_ext_api(py::module_& m); }  // ext/api.cpp: C++ API for extensions
void bind_scan(py::module_& m);                 // ops/scan.cpp

}  // namespace txc

PYBIND11_MODULE(_C, m) {
  using namespace txc;
  m.doc() = "torch_xla_core's C++ lazy-tensor core";
  bind_build_info(m);
  ext::bind_ext_api(m);
  bind_bench_core(m);

  m.def("op_ids", [] {
    py::dict d;
    const auto& ops = all_ops();
    for (size_t i = 0; i < ops.size(); ++i) d[py::str(ops[i].name)] = i;
    return d;
  });

  bind_lazy(m);
  bind_wrapper(m);
  bind_dispatch(m);
  bind_mapping(m);
  m.def("from_data", [](py::object data, int dtype, const Dims& dims) {
          return LazyTensor(make_py_data(std::move(data), DType(dtype), dims));
        },
        "A LazyTensor holding device data (a runtime buffer object).");
  m.def("live_count", &live_storage_count, "Number of live storages.");

  py::class_<GraphCut>(m, "GraphCut")
      .def(py::init([](py::object tensors) {
             if (tensors.is_none()) return GraphCut({}, true);
             std::vector<std::shared_ptr<Storage>> roots;
             for (auto h : tensors) roots.push_back(lazy_arg(h).storage());
             return GraphCut(std::move(roots), false);
           }),
           py::arg("tensors") = py::none(),
           "Cuts the pending graph of `tensors` (default: every live tensor).")
      .def_property_readonly("hash", &GraphCut::hash)
      .def_property_readonly("num_outputs", &GraphCut::num_outputs)
      .def_property_readonly("num_nodes", &GraphCut::num_nodes)
      .def("lower",
           [](const GraphCut& c, const std::string& precision, const std::vector<std::pair<int, int>>& aliases) {
             return c.lower(LowerOptions{precision, aliases});
           },
           py::arg("precision") = "highest", py::arg("aliases") = std::vector<std::pair<int, int>>{},
           "StableHLO text of the cut: matmul precision (torch's name), donated (parameter, output) pairs.")
      .def("text", &GraphCut::text, "The graph, one node per line, for people.")
      .def("donations", &GraphCut::donations)
      .def("params", &GraphCut::params)
      .def("output_specs", &GraphCut::output_specs)
      .def("memory_kinds", &GraphCut::memory_kinds)
      .def("assign", &GraphCut::assign)
      .def_property_readonly("num_roots", &GraphCut::num_roots)
      .def("node_at_line", &GraphCut::node_at_line)
      .def("node_info", &GraphCut::node_info)
      .def("largest", &GraphCut::largest)
      .def("roots_using", &GraphCut::roots_using)
      .def("subset", &GraphCut::subset)
      .def("poison", &GraphCut::poison);

  bind_scan(m);
}

// Python bindings of scan loops (ops/scan.cpp, through ops/scan.h):
// torch_xla_core._C.Body, placeholder, depends_on, build_body and scan_loop,
// which torch_xla_core's scan traces a body and builds its loop with.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "ops/scan.h"
#include "py/lazy.h"

namespace txc {
namespace {

std::vector<NodePtr> values(const py::list& l) {
  std::vector<NodePtr> v;
  v.reserve(l.size());
  for (auto h : l) v.push_back(lazy_arg(h).value());
  return v;
}

}  // namespace

void bind_scan(py::module_& m) {
  py::class_<Body, std::shared_ptr<Body>>(m, "Body", "A traced loop body (see csrc/ops/scan.cpp).")
      .def_property_readonly("hash", [](const Body& b) { return b.hash; })
      .def_property_readonly("num_params", [](const Body& b) { return b.params.size(); })
      .def_property_readonly("num_consts", [](const Body& b) { return b.consts.size(); })
      .def_property_readonly("num_nodes", [](const Body& b) { return b.order.size(); })
      .def("output_specs", [](const Body& b) {
        py::list l;
        for (const auto& o : b.outputs) l.append(py::make_tuple(int(o->dtype), py::tuple(py::cast(o->dims))));
        return l;
      });
  m.def("placeholder", [](int64_t index, int dtype, const Dims& dims) {
          return LazyTensor(placeholder(index, DType(dtype), dims));
        },
        "Body parameter `index` of the given dtype code and dims.");
  m.def("depends_on", [](const py::list& vals, const py::list& params) {
          return depends_on(values(vals), values(params));
        },
        "For each value (LazyTensor): whether it depends on any of params.");
  m.def("build_body", [](const py::list& params, const py::list& outs, const py::list& caps) {
          return build_body(values(params), values(outs), values(caps));
        },
        "A Body from placeholders 0..P-1, the traced outputs and the captured values (params P..).");
  m.def("scan_loop", [](std::shared_ptr<Body> b, const py::list& operands, int64_t n_carry, int64_t n_xs,
                        int64_t length, bool reverse) {
          py::list out;
          for (auto& n : scan_loop(std::move(b), values(operands), n_carry, n_xs, length, reverse))
            out.append(LazyTensor(std::move(n)));
          return out;
        },
        "Runs body over xs: operands are init carries, xs, then captured values; returns the final carries and "
        "the stacked ys (LazyTensors).");
}

}  // namespace txc

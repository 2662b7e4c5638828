// pybind11 bindings of the core: torch_xla_core._C. Python passes core op ids
// (from op_ids()), operands (LazyTensors, Python numbers, or (number, dtype)
// pairs for 0-d host tensors) and attributes (ints, floats, strings, int
// lists); everything about shapes, dtypes, hashing and lowering happens here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "build_info.h"
#include "lower/emitter.h"
#include "ops/registry.h"
#include "trace/graph.h"
#include "trace/tensor.h"

namespace py = pybind11;

namespace txc {
DType elementwise_scalar_dtype(const Node& n);  // ops/elementwise.cpp

namespace {

Attrs to_attrs(const py::tuple& t) {
  Attrs a;
  a.reserve(t.size());
  for (auto h : t) {
    if (PyBool_Check(h.ptr()) || PyLong_Check(h.ptr())) {
      a.emplace_back(int64_t(PyLong_AsLongLong(h.ptr())));
    } else if (PyFloat_Check(h.ptr())) {
      a.emplace_back(PyFloat_AS_DOUBLE(h.ptr()));
    } else if (PyUnicode_Check(h.ptr())) {
      a.emplace_back(h.cast<std::string>());
    } else if (PyTuple_Check(h.ptr()) || PyList_Check(h.ptr())) {
      a.emplace_back(h.cast<Dims>());
    } else {
      throw py::type_error("core op attribute of unsupported type " + std::string(py::str(h.get_type())));
    }
  }
  return a;
}

NodePtr scalar_node(double v, DType t, bool wrapped) {
  static const uint16_t scalar = op_id("scalar");
  auto n = make_node_shaped(scalar, {}, {}, t, {});
  n->scalar = v;
  n->wrapped = wrapped;
  return n;
}

NodePtr operand(py::handle h, bool& has_wrapped) {
  if (py::isinstance<LazyTensor>(h)) return h.cast<LazyTensor&>().value();
  if (PyBool_Check(h.ptr())) {
    has_wrapped = true;
    return scalar_node(h.ptr() == Py_True, DType::Bool, true);
  }
  if (PyLong_Check(h.ptr())) {
    has_wrapped = true;
    return scalar_node(double(PyLong_AsLongLong(h.ptr())), DType::I64, true);
  }
  if (PyFloat_Check(h.ptr())) {
    has_wrapped = true;
    return scalar_node(PyFloat_AS_DOUBLE(h.ptr()), DType::F64, true);
  }
  if (PyTuple_Check(h.ptr()) && PyTuple_GET_SIZE(h.ptr()) == 2) {  // (number, dtype): a 0-d host tensor
    auto t = h.cast<py::tuple>();
    return scalar_node(t[0].cast<double>(), DType(t[1].cast<int>()), false);
  }
  throw py::type_error("core op operand of unsupported type " + std::string(py::str(h.get_type())));
}

LazyTensor make(int op, const py::tuple& operands, const py::tuple& attrs) {
  std::vector<NodePtr> xs;
  xs.reserve(operands.size());
  bool has_wrapped = false;
  for (auto h : operands) xs.push_back(operand(h, has_wrapped));
  NodePtr n = make_node(uint16_t(op), std::move(xs), to_attrs(attrs));
  if (has_wrapped) {
    // Python numbers take the dtype the op computes in.
    DType t = elementwise_scalar_dtype(*n);
    for (auto& o : n->operands)
      if (o->wrapped && o.use_count() == 1) {
        o->dtype = t;
        rehash(*o);
      }
    rehash(*n);
  }
  return LazyTensor(std::move(n));
}

py::tuple shape_of(LazyTensor& t) {
  const Dims& d = t.value()->dims;
  py::tuple r(d.size());
  for (size_t i = 0; i < d.size(); ++i) r[i] = py::int_(d[i]);
  return r;
}

}  // namespace
}  // namespace txc

PYBIND11_MODULE(_C, m) {
  using namespace txc;
  m.doc() = "torch_xla_core's C++ lazy-tensor core";
  bind_build_info(m);

  m.def("op_ids", [] {
    py::dict d;
    const auto& ops = all_ops();
    for (size_t i = 0; i < ops.size(); ++i) d[py::str(ops[i].name)] = i;
    return d;
  });

  py::class_<LazyTensor>(m, "LazyTensor")
      .def_property_readonly("shape", &shape_of)
      .def_property_readonly("dtype", [](LazyTensor& t) { return int(t.value()->dtype); })
      .def_property_readonly("is_view", &LazyTensor::is_view)
      .def_property_readonly("is_data", [](LazyTensor& t) {
        static const uint16_t data = op_id("data");
        return t.value()->op == data;
      })
      .def_property_readonly("data", [](LazyTensor& t) -> py::object {
        static const uint16_t data = op_id("data");
        const NodePtr& v = t.value();
        return v->op == data ? v->data : py::none();
      })
      .def_property_readonly("op", [](LazyTensor& t) { return op_def(t.value()->op).name; })
      .def_property_readonly("hash", [](LazyTensor& t) { return t.value()->hash; })
      .def_property_readonly("storage_id", [](LazyTensor& t) { return uintptr_t(t.storage().get()); })
      .def("assign", [](LazyTensor& t, LazyTensor& v) { t.assign(v.value()); },
           "In-place write: this tensor (and its storage, through its views) now holds v's value.")
      .def("alias", &LazyTensor::alias, "A new tensor sharing this one's storage and view chain.");

  m.def("make", &make, "Applies core op `op` to operands with attributes; returns a new LazyTensor.");
  m.def("view", [](int op, LazyTensor& base, const py::tuple& attrs) {
          NodePtr v = make_node(uint16_t(op), {base.value()}, to_attrs(attrs));
          if (!op_def(uint16_t(op)).scatter && op_def(uint16_t(op)).name != "expand")
            throw std::runtime_error("core op '" + op_def(uint16_t(op)).name + "' is not a view op");
          return LazyTensor(base, std::move(v));
        },
        "A view of base through view op `op`: shares base's storage.");
  m.def("from_data", [](py::object data, int dtype, const Dims& dims) {
          static const uint16_t data_op = op_id("data");
          auto n = make_node_shaped(data_op, {}, {}, DType(dtype), dims);
          n->data = std::move(data);
          return LazyTensor(std::move(n));
        },
        "A LazyTensor holding device data (a runtime buffer object).");
  m.def("live_count", &live_storage_count, "Number of live storages.");

  py::class_<GraphCut>(m, "GraphCut")
      .def(py::init([](py::object tensors) {
             if (tensors.is_none()) return GraphCut({}, true);
             std::vector<std::shared_ptr<Storage>> roots;
             for (auto h : tensors) roots.push_back(h.cast<LazyTensor&>().storage());
             return GraphCut(std::move(roots), false);
           }),
           py::arg("tensors") = py::none(),
           "Cuts the pending graph of `tensors` (default: every live tensor).")
      .def_property_readonly("hash", &GraphCut::hash)
      .def_property_readonly("num_outputs", &GraphCut::num_outputs)
      .def_property_readonly("num_nodes", &GraphCut::num_nodes)
      .def("lower", &GraphCut::lower, "StableHLO text of the cut.")
      .def("params", &GraphCut::params)
      .def("output_specs", &GraphCut::output_specs)
      .def("assign", &GraphCut::assign);
}

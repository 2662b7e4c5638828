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

namespace py = pybind11;

namespace txc {
DType elementwise_scalar_dtype(const Node& n);  // ops/elementwise.cpp
namespace ext { void bind_ext_api(py::module_& m); }  // ext/api.cpp: C++ API for extensions
void bind_scan(py::module_& m);                 // ops/scan.cpp

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

// The Python wrapper tensor class (XlaTensor) and how to build one; set once
// by configure_wrapper() so that op()/view_op() return wrappers directly.
struct Wrapper {
  PyObject* cls = nullptr;       // XlaTensor
  PyObject* factory = nullptr;   // torch.Tensor._make_wrapper_subclass
  PyObject* device = nullptr;    // torch.device("xla", 0)
  PyObject* kwnames = nullptr;   // ("dtype", "device")
  PyObject* lt_name = nullptr;   // "_lt"
  PyObject* fallback = nullptr;  // Python: other operand -> core operand, or raise
  std::vector<PyObject*> dtypes; // dtype code -> torch.dtype
} g_wrap;

LazyTensor& lazy_of_wrapper(py::handle h) {
  py::object lt = py::reinterpret_steal<py::object>(PyObject_GetAttr(h.ptr(), g_wrap.lt_name));
  if (!lt) throw py::error_already_set();
  return lt.cast<LazyTensor&>();  // the wrapper keeps lt alive
}

// Autograd runs the backward of xla tensors on its own device thread, and
// every op there enters Python through a GIL acquire that, when the thread
// has no Python thread state yet, creates one and deletes it again on
// release: a thread state per op. Holding one extra reference to this
// thread's state (once per thread; never released) keeps it alive.
void keep_thread_state() {
  thread_local bool kept = false;
  if (!kept) {
    PyGILState_Ensure();
    kept = true;
  }
}

py::object wrap(LazyTensor&& t) {
  keep_thread_state();
  const NodePtr& v = t.value();
  py::tuple shape(v->dims.size());
  for (size_t i = 0; i < v->dims.size(); ++i) PyTuple_SET_ITEM(shape.ptr(), i, PyLong_FromLongLong(v->dims[i]));
  PyObject* args[] = {g_wrap.cls, shape.ptr(), g_wrap.dtypes[size_t(v->dtype)], g_wrap.device};
  py::object w = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_wrap.factory, args, 2, g_wrap.kwnames));
  if (!w) throw py::error_already_set();
  py::object lt = py::cast(std::move(t));
  if (PyObject_SetAttr(w.ptr(), g_wrap.lt_name, lt.ptr()) < 0) throw py::error_already_set();
  return w;
}

NodePtr operand(py::handle h, bool& has_wrapped) {
  if (g_wrap.cls && (Py_TYPE(h.ptr()) == (PyTypeObject*)g_wrap.cls || PyObject_TypeCheck(h.ptr(), (PyTypeObject*)g_wrap.cls)))
    return lazy_of_wrapper(h).value();
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
  if (g_wrap.fallback) {  // e.g. a 0-d CPU tensor -> (number, dtype); raises for others
    py::object r = py::reinterpret_borrow<py::object>(g_wrap.fallback)(h);
    return operand(r, has_wrapped);
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
  ext::bind_ext_api(m);
  bind_bench_core(m);

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

  m.def("configure_wrapper", [](py::object cls, py::object factory, py::list dtypes, py::object device,
                                py::object fallback) {
          g_wrap.cls = cls.release().ptr();
          g_wrap.factory = factory.release().ptr();
          g_wrap.device = device.release().ptr();
          g_wrap.fallback = fallback.release().ptr();
          g_wrap.kwnames = py::make_tuple("dtype", "device").release().ptr();
          g_wrap.lt_name = py::str("_lt").release().ptr();
          PyUnicode_InternInPlace(&g_wrap.lt_name);
          g_wrap.dtypes.clear();
          for (auto d : dtypes) g_wrap.dtypes.push_back(d.inc_ref().ptr());
        },
        "Sets the wrapper tensor class that op() and view_op() return.");
  m.def("op", [](int op, const py::tuple& operands, const py::tuple& attrs) { return wrap(make(op, operands, attrs)); },
        "make(), returning a wrapper tensor.");
  m.def("view_op", [](int op, py::handle base, const py::tuple& attrs) {
          LazyTensor& b = py::isinstance<LazyTensor>(base) ? base.cast<LazyTensor&>() : lazy_of_wrapper(base);
          NodePtr v = make_node(uint16_t(op), {b.value()}, to_attrs(attrs));
          return wrap(LazyTensor(b, std::move(v)));
        },
        "A view of a wrapper tensor through view op `op`, as a wrapper tensor.");
  m.def("wrap", [](LazyTensor& t) { return wrap(t.alias()); }, "A wrapper tensor sharing t's storage.");
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

  bind_scan(m);
}

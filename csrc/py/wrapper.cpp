// Python objects <-> core: operands, attributes and the XlaTensor wrapper
// (see wrapper.h). The wrapper class and its factory are set once from
// Python by configure_wrapper(), so that ops return wrappers directly.
#include "py/wrapper.h"
#include <pybind11/stl.h>
#include <structmember.h>
#include <algorithm>
#include "ops/registry.h"

namespace txc {
namespace {

struct Wrapper {
  PyObject* cls = nullptr;       // XlaTensor
  PyObject* factory = nullptr;   // torch.Tensor._make_wrapper_subclass
  PyObject* device = nullptr;    // torch.device("xla", 0)
  std::vector<PyObject*> devices;  // torch.device("xla", i), made on first use
  PyObject* kwnames = nullptr;   // ("dtype", "device")
  PyObject* lt_name = nullptr;   // "_lt"
  Py_ssize_t lt_offset = 0;      // where the class's `_lt` slot sits in an instance (0: not a slot)
  PyObject* fallback = nullptr;  // Python: other operand -> core operand, or raise
  std::vector<PyObject*> dtypes; // dtype code -> torch.dtype
} g_wrap;

// The torch.device of a value on core device d (kAnyDevice: xla:0).
PyObject* device_object(int d) {
  if (d <= 0) return g_wrap.device;
  if (size_t(d) >= g_wrap.devices.size()) g_wrap.devices.resize(size_t(d) + 1, nullptr);
  PyObject*& o = g_wrap.devices[size_t(d)];
  if (!o) o = py::module_::import("torch").attr("device")("xla", d).release().ptr();  // lives for the process
  return o;
}

}  // namespace

Attr to_attr(py::handle h) {
  if (PyBool_Check(h.ptr()) || PyLong_Check(h.ptr())) return int64_t(PyLong_AsLongLong(h.ptr()));
  if (PyFloat_Check(h.ptr())) return PyFloat_AS_DOUBLE(h.ptr());
  if (PyUnicode_Check(h.ptr())) return h.cast<std::string>();
  if (PyTuple_Check(h.ptr()) || PyList_Check(h.ptr())) return h.cast<Dims>();
  throw py::type_error("core op attribute of unsupported type " + std::string(py::str(py::type::handle_of(h))));
}

Attrs to_attrs(const py::tuple& t) {
  Attrs a;
  a.reserve(t.size());
  for (auto h : t) a.push_back(to_attr(h));
  return a;
}

bool is_wrapper(py::handle h) {
  return g_wrap.cls && (Py_TYPE(h.ptr()) == (PyTypeObject*)g_wrap.cls ||
                        PyObject_TypeCheck(h.ptr(), (PyTypeObject*)g_wrap.cls));
}

PyObject* lazy_slot_unchecked(PyObject* h) {
  if (!g_wrap.lt_offset || Py_TYPE(h) != (PyTypeObject*)g_wrap.cls) return nullptr;
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(h) + g_wrap.lt_offset);
}

LazyTensor& lazy_of_wrapper(py::handle h) {
  if (g_wrap.lt_offset && is_wrapper(h)) {  // read the slot directly: no attribute lookup
    PyObject* lt = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(h.ptr()) + g_wrap.lt_offset);
    if (!lt || !is_lazy(lt)) throw py::attribute_error("xla tensor without a lazy value (_lt)");
    return lazy_ref(lt);  // the wrapper keeps lt alive
  }
  py::object lt = py::reinterpret_steal<py::object>(PyObject_GetAttr(h.ptr(), g_wrap.lt_name));
  if (!lt) throw py::error_already_set();
  return lazy_arg(lt);  // the wrapper keeps lt alive
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

namespace {

py::tuple int_tuple(const Dims& d) {
  py::tuple r(d.size());
  for (size_t i = 0; i < d.size(); ++i) PyTuple_SET_ITEM(r.ptr(), i, PyLong_FromLongLong(d[i]));
  return r;
}

// The wrapper of a view: torch's strides and storage offset (so that torch's
// contiguous(), reshape() and view() see what CPU would), or a null object
// when they are the contiguous default (then the plain call is cheaper).
py::object make_view_wrapper(const LazyTensor& t, const Node& v, PyObject* shape) {
  Dims strides;
  int64_t offset;
  if (!t.layout(strides, offset)) return py::object();
  bool plain = offset == 0;
  int64_t s = 1;
  for (size_t i = v.dims.size(); plain && i-- > 0;) {
    plain = strides[i] == s;
    s *= std::max<int64_t>(v.dims[i], 1);
  }
  if (plain) return py::object();
  py::tuple st = int_tuple(strides);
  py::object off = py::reinterpret_steal<py::object>(PyLong_FromLongLong(offset));
  // _make_wrapper_subclass(cls, size, strides, storage_offset, *, dtype, device)
  PyObject* args[] = {g_wrap.cls, shape, st.ptr(), off.ptr(), g_wrap.dtypes[size_t(v.dtype)], device_object(v.device)};
  py::object w = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_wrap.factory, args, 4, g_wrap.kwnames));
  if (!w) throw py::error_already_set();
  return w;
}

}  // namespace

py::object wrap(LazyTensor&& t) {
  keep_thread_state();
  const NodePtr& v = t.value();
  py::tuple shape(v->dims.size());
  for (size_t i = 0; i < v->dims.size(); ++i) PyTuple_SET_ITEM(shape.ptr(), i, PyLong_FromLongLong(v->dims[i]));
  py::object w;
  if (!t.plain()) w = make_view_wrapper(t, *v, shape.ptr());
  if (!w) {
    PyObject* args[] = {g_wrap.cls, shape.ptr(), g_wrap.dtypes[size_t(v->dtype)], device_object(v->device)};
    w = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_wrap.factory, args, 2, g_wrap.kwnames));
    if (!w) throw py::error_already_set();
  }
  set_lazy(w, std::move(t));
  return w;
}

void set_lazy(py::handle w, LazyTensor&& t) {
  py::object lt = py::reinterpret_steal<py::object>(new_lazy(std::move(t)));
  if (g_wrap.lt_offset) {
    PyObject** slot = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(w.ptr()) + g_wrap.lt_offset);
    Py_XSETREF(*slot, lt.release().ptr());
  } else if (PyObject_SetAttr(w.ptr(), g_wrap.lt_name, lt.ptr()) < 0) {
    throw py::error_already_set();
  }
}

NodePtr operand(py::handle h, bool& has_wrapped) {
  if (is_wrapper(h)) return lazy_of_wrapper(h).value();
  if (is_lazy(h.ptr())) return lazy_ref(h.ptr()).value();
  if (PyBool_Check(h.ptr())) {
    has_wrapped = true;
    return make_scalar(h.ptr() == Py_True, DType::Bool, true);
  }
  if (PyLong_Check(h.ptr())) {
    has_wrapped = true;
    return make_scalar(double(PyLong_AsLongLong(h.ptr())), DType::I64, true);
  }
  if (PyFloat_Check(h.ptr())) {
    has_wrapped = true;
    return make_scalar(PyFloat_AS_DOUBLE(h.ptr()), DType::F64, true);
  }
  if (PyComplex_Check(h.ptr())) {
    has_wrapped = true;
    return make_scalar(PyComplex_RealAsDouble(h.ptr()), DType::C64, true, PyComplex_ImagAsDouble(h.ptr()));
  }
  if (PyTuple_Check(h.ptr()) && PyTuple_GET_SIZE(h.ptr()) == 2) {  // (number, dtype): a 0-d host tensor
    auto t = h.cast<py::tuple>();
    PyObject* num = t[0].ptr();
    if (PyComplex_Check(num))
      return make_scalar(PyComplex_RealAsDouble(num), DType(t[1].cast<int>()), false, PyComplex_ImagAsDouble(num));
    return make_scalar(t[0].cast<double>(), DType(t[1].cast<int>()), false);
  }
  if (g_wrap.fallback) {  // e.g. a 0-d CPU tensor -> (number, dtype); raises for others
    py::object r = py::reinterpret_borrow<py::object>(g_wrap.fallback)(h);
    return operand(r, has_wrapped);
  }
  throw py::type_error("core op operand of unsupported type " + std::string(py::str(py::type::handle_of(h))));
}

LazyTensor apply(uint16_t op, const py::tuple& operands, const py::tuple& attrs) {
  std::vector<NodePtr> xs;
  xs.reserve(operands.size());
  bool has_wrapped = false;
  for (auto h : operands) xs.push_back(operand(h, has_wrapped));
  return LazyTensor(make_node(op, std::move(xs), to_attrs(attrs)));
}

LazyTensor view_of(uint16_t op, py::handle base, const py::tuple& attrs) {
  const OpDef& def = op_def(op);
  if (!def.scatter && !def.strides) throw std::runtime_error("core op '" + def.name + "' is not a view op");
  LazyTensor& b = is_lazy(base.ptr()) ? lazy_ref(base.ptr()) : lazy_of_wrapper(base);
  return LazyTensor(b, make_node(op, {b.value()}, to_attrs(attrs)));
}

bool shares_storage(PyObject* w, PyObject* a) {
  const void* s = lazy_of_wrapper(w).storage().get();
  auto same = [&](PyObject* x) { return x != w && is_wrapper(x) && lazy_of_wrapper(x).storage().get() == s; };
  if (PyList_Check(a) || PyTuple_Check(a)) {
    for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(a); i < n; ++i)
      if (same(PySequence_Fast_GET_ITEM(a, i))) return true;
    return false;
  }
  return same(a);
}

static py::object result(LazyTensor&& t, bool lazy) {
  return lazy ? py::reinterpret_steal<py::object>(new_lazy(std::move(t))) : wrap(std::move(t));
}

void bind_wrapper(py::module_& m) {
  m.def("configure_wrapper", [](py::object cls, py::object factory, py::list dtypes, py::object device,
                                py::object fallback) {
          g_wrap.cls = cls.release().ptr();
          g_wrap.factory = factory.release().ptr();
          g_wrap.device = device.release().ptr();
          g_wrap.fallback = fallback.release().ptr();
          g_wrap.kwnames = py::make_tuple("dtype", "device").release().ptr();
          g_wrap.lt_name = py::str("_lt").release().ptr();
          PyUnicode_InternInPlace(&g_wrap.lt_name);
          // `_lt` is a __slots__ member: note its offset (a member descriptor's).
          py::object d = py::handle(g_wrap.cls).attr("__dict__").attr("get")("_lt");
          g_wrap.lt_offset = 0;
          if (Py_IS_TYPE(d.ptr(), &PyMemberDescr_Type)) {
            PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d.ptr())->d_member;
            if (m->type == T_OBJECT_EX) g_wrap.lt_offset = m->offset;
          }
          g_wrap.dtypes.clear();
          for (auto d : dtypes) g_wrap.dtypes.push_back(d.inc_ref().ptr());
        },
        "Sets the wrapper tensor class that op() and view() return.");
  // The three ways Python makes core values (torch_xla_core/_tracing/tensor.py).
  m.def("op", [](int op, const py::tuple& operands, const py::tuple& attrs, bool lazy) {
          if (op < 0 || op >= int(all_ops().size())) throw py::value_error("unknown core op id " + std::to_string(op));
          return result(apply(uint16_t(op), operands, attrs), lazy);
        },
        py::arg("op"), py::arg("operands"), py::arg("attrs"), py::arg("lazy") = false,
        "Core op `op` (an id from op_ids()) over operands (xla tensors, LazyTensors, Python numbers, (number, "
        "dtype code) pairs) with attributes: a new value, as an xla tensor (or its LazyTensor with lazy=True).");
  m.def("view", [](int op, py::handle base, const py::tuple& attrs, bool lazy) {
          if (op < 0 || op >= int(all_ops().size())) throw py::value_error("unknown core op id " + std::to_string(op));
          return result(view_of(uint16_t(op), base, attrs), lazy);
        },
        py::arg("op"), py::arg("base"), py::arg("attrs"), py::arg("lazy") = false,
        "A view of base (an xla tensor or LazyTensor) through view op `op`: shares base's storage.");
  m.def("wrap", [](LazyTensor& t) { return wrap(t.alias()); },
        "An xla tensor sharing t's storage (and view chain).");
  // The cheap first test of an out= op's overlap check
  // (torch_xla_core/_ops/resolution.py _check_writes): one pass, no Python per arg.
  m.def("shares_storage", [](py::handle w, py::handle args) {
          if (!is_wrapper(w)) return false;
          for (py::handle a : args)
            if (shares_storage(w.ptr(), a.ptr())) return true;
          return false;
        },
        py::arg("written"), py::arg("args"),
        "Whether an xla tensor in args (or in a list or tuple in args), other than `written` itself, shares "
        "written's storage.");
}

}  // namespace txc

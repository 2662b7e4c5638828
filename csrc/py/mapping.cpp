// Mappings (see mapping.h): applying one to a call, and the _C.Mapping class
// that torch_xla_core/_ops/registry.py (mapping()) builds from a declaration.
#include "py/mapping.h"
#include <pybind11/stl.h>
#include "ops/registry.h"
#include "py/wrapper.h"

namespace txc {

uint64_t g_mapping_runs = 0, g_mapping_declines = 0;

namespace {

// h as an attribute, or false when it is of a type attributes never have.
bool attr_of(py::handle h, Attr& out) {
  PyObject* o = h.ptr();
  if (PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o)) {
    out = to_attr(h);
    return true;
  }
  if (PyTuple_Check(o) || PyList_Check(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!PyLong_Check(PySequence_Fast_GET_ITEM(o, i))) return false;
    out = to_attr(h);
    return true;
  }
  return false;
}

bool same_name(PyObject* a, PyObject* b) { return a == b || PyUnicode_Compare(a, b) == 0; }

}  // namespace

py::object Mapping::apply(PyObject* args, PyObject* kwargs) const {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n < min_args || n > max_args) return py::object();
  if (kwargs) {  // every keyword must be one of the mapping's attributes
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &k, &v)) {
      bool known = false;
      for (const auto& a : attrs) known = known || (a.from == From::Keyword && same_name(a.name.ptr(), k));
      if (!known) return py::object();
    }
  }
  std::vector<NodePtr> xs;
  xs.reserve(operands.size());
  bool has_wrapped = false;
  LazyTensor* base = nullptr;
  for (const Operand& o : operands) {
    py::handle h = PyTuple_GET_ITEM(args, o.arg);
    if (o.rank == kAny && !view) {
      xs.push_back(operand(h, has_wrapped));
      continue;
    }
    if (!is_wrapper(h)) {
      operand(h, has_wrapped);  // raises torch's device error for a tensor on another device
      return py::object();
    }
    LazyTensor& lt = lazy_of_wrapper(h);
    const NodePtr& val = lt.value();
    if (o.rank >= 0 && val->dims.size() != size_t(o.rank)) return py::object();
    xs.push_back(val);
    if (!base) base = &lt;
  }
  Attrs as;
  as.reserve(attrs.size());
  for (const AttrSpec& a : attrs) {
    PyObject* given = nullptr;
    if (a.from == From::Positional && a.arg < n) given = PyTuple_GET_ITEM(args, a.arg);
    if (a.from == From::Keyword && kwargs) given = PyDict_GetItem(kwargs, a.name.ptr());  // borrowed
    if (!given) {
      as.push_back(a.value);  // a constant, or the default of an absent arg (validated: has_value)
      continue;
    }
    Attr v;
    if (!attr_of(given, v)) return py::object();
    as.push_back(std::move(v));
  }
  if (view) {
    LazyTensor t(*base, make_node(op, std::move(xs), std::move(as)));
    // A view torch's strides cannot express (the core made a copy): not
    // this mapping's call (aten.view raises torch's error, reshape copies).
    if (base->is_view() && !t.is_view()) return py::object();
    return wrap(std::move(t));
  }
  return wrap(LazyTensor(make_node(op, std::move(xs), std::move(as))));
}

PyObject* Mapping::call(PyObject* args, PyObject* kwargs) const {
  try {
    py::object r = apply(args, kwargs);
    if (r) {
      ++g_mapping_runs;
      return r.release().ptr();
    }
  } catch (py::error_already_set& e) {
    e.restore();
    note_handler_error();
    return nullptr;
  } catch (const std::exception& e) {  // the core refused: check may word it, else the core's message
    if (!check.is_none()) {
      PyObject* r = call_handler(check.ptr(), args, kwargs);
      if (!r) return nullptr;
      Py_DECREF(r);
    }
    // a dtype the op has no kernel for: NotImplementedError, as torch's kernels (ops/registry.h)
    PyErr_SetString(dynamic_cast<const DtypeNotImplemented*>(&e) ? PyExc_NotImplementedError : PyExc_RuntimeError,
                    e.what());
    note_handler_error();
    return nullptr;
  }
  ++g_mapping_declines;
  if (!check.is_none()) {
    PyObject* r = call_handler(check.ptr(), args, kwargs);
    if (!r) return nullptr;
    Py_DECREF(r);
  }
  if (rest.is_none()) {
    PyErr_SetString(PyExc_NotImplementedError,
                    (aten + ": this call does not fit its mapping onto core op '" + op_def(op).name +
                     "' and the overload has no handler for the rest")
                        .c_str());
    return nullptr;
  }
  return call_handler(rest.ptr(), args, kwargs);
}

bool is_mapping(py::handle h) { return py::isinstance<Mapping>(h); }
const Mapping& mapping_of(py::handle h) { return h.cast<const Mapping&>(); }

namespace {

Mapping build(int op, const std::string& aten, int min_args, int max_args,
              const std::vector<std::pair<int, int>>& operands, const py::list& attrs, bool view, py::object check,
              py::object rest) {
  Mapping m;
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("mapping of " + aten + " onto core op " +
                                 (op >= 0 && op < int(all_ops().size()) ? "'" + op_def(uint16_t(op)).name + "'"
                                                                       : std::to_string(op)) +
                                 ": " + why);
  };
  if (op < 0 || op >= int(all_ops().size())) throw bad("unknown core op id");
  m.op = uint16_t(op);
  m.aten = aten;
  if (min_args < 0 || max_args < min_args) throw bad("bad positional arg counts");
  m.min_args = min_args;
  m.max_args = max_args;
  for (auto [arg, rank] : operands) {
    if (arg < 0 || arg >= min_args) throw bad("operand " + std::to_string(arg) + " is not a required positional arg");
    if (rank < Mapping::kXla) throw bad("bad operand rank code " + std::to_string(rank));
    m.operands.push_back({arg, rank});
  }
  if (view && (m.operands.size() != 1 || m.operands[0].rank == Mapping::kAny))
    throw bad("a view maps one xla tensor operand");
  for (auto h : attrs) {  // (source, arg, name, has_value, value)
    auto t = h.cast<py::tuple>();
    Mapping::AttrSpec a;
    a.from = Mapping::From(t[0].cast<int>());
    a.arg = t[1].cast<int>();
    a.has_value = t[3].cast<bool>();
    if (a.has_value) a.value = to_attr(t[4]);
    if (a.from == Mapping::From::Keyword) {
      PyObject* s = t[2].cast<py::str>().release().ptr();
      PyUnicode_InternInPlace(&s);
      a.name = py::reinterpret_steal<py::object>(s);
    }
    if (a.from == Mapping::From::Positional && (a.arg < 0 || a.arg >= max_args))
      throw bad("attribute from positional arg " + std::to_string(a.arg) + " of " + std::to_string(max_args));
    if (a.from == Mapping::From::Positional && a.arg >= min_args && !a.has_value)
      throw bad("optional positional arg " + std::to_string(a.arg) + " needs a default");
    if (a.from != Mapping::From::Positional && !a.has_value) throw bad("a constant or keyword attribute needs a value");
    m.attrs.push_back(std::move(a));
  }
  m.view = view;
  m.check = std::move(check);
  m.rest = std::move(rest);
  return m;
}

}  // namespace

void bind_mapping(py::module_& m) {
  py::class_<Mapping>(m, "Mapping",
                      "An aten overload that is one core op (see torch_xla_core._ops.mapping): run by the C++ "
                      "dispatcher, and callable as the overload's handler.")
      .def(py::init(&build), py::arg("op"), py::arg("aten"), py::arg("min_args"), py::arg("max_args"),
           py::arg("operands"), py::arg("attrs"), py::arg("view"), py::arg("check"), py::arg("rest"))
      .def("__call__",
           [](const Mapping& self, py::args args, py::kwargs kwargs) {
             PyObject* r = self.call(args.ptr(), PyDict_GET_SIZE(kwargs.ptr()) ? kwargs.ptr() : nullptr);
             if (!r) throw py::error_already_set();
             return py::reinterpret_steal<py::object>(r);
           })
      .def_property_readonly("op", [](const Mapping& self) { return op_def(self.op).name; })
      .def_readonly("aten", &Mapping::aten)
      .def_readonly("view", &Mapping::view)
      .def_readwrite("check", &Mapping::check)
      .def_readwrite("rest", &Mapping::rest)
      .def("__repr__", [](const Mapping& self) { return "<Mapping " + self.aten + " -> " + op_def(self.op).name + ">"; });
}

}  // namespace txc

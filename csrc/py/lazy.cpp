// The LazyTensor Python type (see lazy.h).
#include "py/lazy.h"
#include <algorithm>
#include <new>
#include <pybind11/stl.h>
#include "ir/memory.h"
#include "ops/registry.h"
#include "py/data.h"

namespace txc {

PyTypeObject* g_lazy_type = nullptr;

namespace {

void lazy_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  reinterpret_cast<PyLazy*>(self)->t.~LazyTensor();
  tp->tp_free(self);
  Py_DECREF(tp);  // instances of a heap type hold a reference to it
}

py::tuple shape_of(LazyTensor& t) {
  const Dims& d = t.value()->dims;
  py::tuple r(d.size());
  for (size_t i = 0; i < d.size(); ++i) PyTuple_SET_ITEM(r.ptr(), i, PyLong_FromLongLong(d[i]));
  return r;
}

// t's view nodes, from the one applied to its storage's value to t's own.
std::vector<NodePtr> view_chain(LazyTensor& t) {
  std::vector<NodePtr> nodes;
  for (NodePtr n = t.value(); n != t.storage()->value; n = n->operands.at(0)) nodes.push_back(n);
  std::reverse(nodes.begin(), nodes.end());
  return nodes;
}

}  // namespace

bool data_exclusive(LazyTensor& t) {
  if (t.is_view()) return false;
  const NodePtr& v = t.storage()->value;
  return v.use_count() == 1 && buffer_held_by_node_only(*v);
}

LazyTensor rebase(LazyTensor& t, LazyTensor& base) {
  if (base.value()->dims != t.storage()->value->dims)
    throw py::value_error("rebase: the new base is " + dims_str(base.value()->dims) + ", the storage is " +
                          dims_str(t.storage()->value->dims));
  LazyTensor r = base.alias();
  for (const NodePtr& n : view_chain(t)) {
    NodePtr v = make_node(n->op, {r.value()}, n->attrs);
    r = LazyTensor(r, std::move(v));
  }
  return r;
}

PyObject* new_lazy(LazyTensor&& t) {
  PyObject* o = g_lazy_type->tp_alloc(g_lazy_type, 0);
  if (!o) throw py::error_already_set();
  new (&reinterpret_cast<PyLazy*>(o)->t) LazyTensor(std::move(t));
  return o;
}

LazyTensor& lazy_arg(py::handle h) {
  if (!is_lazy(h.ptr())) throw py::type_error("expected a LazyTensor, got " + std::string(py::str(py::type::handle_of(h))));
  return lazy_ref(h.ptr());
}

void bind_lazy(py::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(&lazy_dealloc)},
      {Py_tp_doc, const_cast<char*>("A lazy tensor of the core: a value in the pending graph (or device data).")},
      {0, nullptr}};
  static PyType_Spec spec = {"torch_xla_core._C.LazyTensor", int(sizeof(PyLazy)), 0, Py_TPFLAGS_DEFAULT, slots};
  py::object cls = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!cls) throw py::error_already_set();
  g_lazy_type = reinterpret_cast<PyTypeObject*>(cls.inc_ref().ptr());  // lives for the process
  m.add_object("LazyTensor", cls);

  py::object property = py::module_::import("builtins").attr("property");
  auto prop = [&](const char* name, py::cpp_function get) { cls.attr(name) = property(get); };
  static const uint16_t data_op = op_id("data");
  prop("shape", py::cpp_function(&shape_of));
  prop("dtype", py::cpp_function([](LazyTensor& t) { return int(t.value()->dtype); }));
  prop("is_view", py::cpp_function([](LazyTensor& t) { return t.is_view(); }));
  prop("is_data", py::cpp_function([](LazyTensor& t) { return t.value()->op == data_op; }));
  prop("data", py::cpp_function([](LazyTensor& t) -> py::object {
         const NodePtr& v = t.value();
         return v->op == data_op ? py_data(*v) : py::none();
       }));
  prop("op", py::cpp_function([](LazyTensor& t) { return op_def(t.value()->op).name; }));
  // A pending value made from attributes alone (no operand, no body, no payload: full, iota), as (op id,
  // attributes): _C.op(op, (), attrs) makes an equal node; None otherwise (device data, a number, a view, a
  // value computed from others). A replay of a dynamo graph builds such inputs inside its graph (dynamo.py).
  prop("constant", py::cpp_function([](LazyTensor& t) -> py::object {
         static const uint16_t scalar = op_id("scalar"), error = op_id("error"), placeholder = op_id("placeholder");
         const NodePtr& v = t.value();
         if (t.is_view() || !v->operands.empty() || v->body || v->data || v->op == data_op || v->op == scalar ||
             v->op == error || v->op == placeholder)
           return py::none();
         py::tuple attrs(v->attrs.size());
         for (size_t i = 0; i < v->attrs.size(); ++i) {
           const Attr& a = v->attrs[i];
           if (auto* n = std::get_if<int64_t>(&a)) attrs[i] = py::int_(*n);
           else if (auto* d = std::get_if<double>(&a)) attrs[i] = py::float_(*d);
           else if (auto* s = std::get_if<std::string>(&a)) attrs[i] = py::str(*s);
           else attrs[i] = py::cast(std::get<Dims>(a));
         }
         return py::make_tuple(int(v->op), attrs);
       }));
  // may this tensor's buffer be donated (lazy.h)
  prop("data_exclusive", py::cpp_function(&data_exclusive));
  prop("memory_kind", py::cpp_function([](LazyTensor& t) { return memory_kind_name(memory_kind_of(*t.value())); }));
  prop("hash", py::cpp_function([](LazyTensor& t) { return t.value()->hash; }));
  prop("storage_id", py::cpp_function([](LazyTensor& t) { return uintptr_t(t.storage().get()); }));
  // LazyTensors sharing this one's storage (itself included): 1 when no other tensor aliases it.
  prop("storage_refs", py::cpp_function([](LazyTensor& t) { return long(t.storage().use_count()); }));
  cls.attr("assign") = py::cpp_function([](LazyTensor& t, LazyTensor& v) { t.assign(v.value()); },
                                        py::is_method(cls), py::name("assign"),
                                        "In-place write: this tensor (and its storage, through its views) now holds "
                                        "v's value.");
  cls.attr("root") = py::cpp_function([](LazyTensor& t) { return t.root(); }, py::is_method(cls), py::name("root"),
                                      "The whole storage as a tensor (as_strided indexes it).");
  cls.attr("alias") = py::cpp_function([](LazyTensor& t) { return t.alias(); }, py::is_method(cls),
                                       py::name("alias"), "A new tensor sharing this one's storage and view chain.");
  // For deepcopy and torch.save (torch_xla_core/_features/serialization.py).
  prop("view_ops", py::cpp_function([](LazyTensor& t) {
         py::list r;
         for (const NodePtr& n : view_chain(t)) r.append(op_def(n->op).name);
         return py::tuple(r);
       }));
  cls.attr("copy_storage") = py::cpp_function([](LazyTensor& t) { return LazyTensor(t.storage()->value); },
                                      py::is_method(cls), py::name("copy_storage"),
                                      "A new storage holding this tensor's storage's current value (the same IR "
                                      "node, so no device work): an independent copy of the whole storage.");
  cls.attr("rebase") = py::cpp_function(&rebase, py::is_method(cls), py::name("rebase"),
      "This tensor's view chain applied to `base` (a tensor of its storage's shape): a view of base's storage.");
}

}  // namespace txc

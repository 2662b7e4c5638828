// The XlaTensor's __torch_dispatch__ in C++ (a staticmethod on the class).
// torch calls it for every aten op on xla tensors: it is the per-op hot path.
// The aten overload is looked up by identity in a table filled lazily from
// Python (the resolver: func -> its handler, torch_xla_core/_tracing/tensor.py).
// An in-place op's entry first checks, in C++, whether another argument
// shares the written tensor's storage (then Python's overlap check runs).
// A handler is a Mapping (py/mapping.h: an overload that is one core op,
// run here without entering Python) or a Python function, called with
// torch's own args tuple and kwargs dict.
#include <unordered_map>
#include <pybind11/stl.h>
#include "ops/registry.h"
#include "py/mapping.h"
#include "py/wrapper.h"

namespace txc {
namespace {

struct Entry {
  py::object func;     // keeps the key alive
  py::object handler;  // a Mapping, or Python: handler(*args, **kwargs)
  const Mapping* mapping = nullptr;  // handler as a Mapping (it keeps it alive)
  uint32_t origin = 0;  // the overload's name as node provenance (origin_id)
  bool check_self = false;  // an in-place op: torch's overlap check of args[0] against the others first
};

// Never destroyed: their Python references must not be dropped after the
// interpreter has finalized.
auto& g_table = *new std::unordered_map<PyObject*, Entry>();
auto& g_resolver = *new py::object();  // Python: func -> (handler, check_self)
auto& g_check_writes = *new py::object();  // Python: check_each_input(written, inputs), raises on a partial overlap
// The last exception a handler raised on this thread (a new reference, or
// null). torch's Python device guard runs Python while autograd unwinds from
// a failed backward op and loses the pending exception on the way (the
// engine then reports "returned NULL without setting an exception");
// the autograd engine hook (torch_xla_core/_ops/engine.py) re-raises this one instead.
thread_local PyObject* t_last_error = nullptr;

// A handler that read `_lt` of a CPU tensor (nn.Linear's CPU weight with an
// xla input) fails with AttributeError: report torch's device mismatch
// instead (error path only; _tensor.device_mismatch words it).
void mixed_device(PyObject* args, PyObject* kwargs, PyObject*& type, PyObject*& value, PyObject*& tb) {
  try {
    py::object err = py::module_::import("torch_xla_core._tracing.tensor")
                         .attr("device_mismatch")(py::handle(args), kwargs ? py::handle(kwargs) : py::none());
    if (err.is_none()) return;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    type = (PyObject*)Py_TYPE(err.ptr());
    Py_INCREF(type);
    value = err.release().ptr();
    tb = nullptr;
  } catch (py::error_already_set&) {
    // keep the handler's own error
  }
}

Entry& entry_of(PyObject* func) {
  auto it = g_table.find(func);
  if (it != g_table.end()) return it->second;
  if (!g_resolver) throw std::runtime_error("torch_xla_core: the xla dispatcher is not configured");
  Entry e;
  e.func = py::reinterpret_borrow<py::object>(func);
  py::tuple r = g_resolver(py::handle(func));
  e.handler = r[0];
  e.check_self = r[1].cast<bool>();
  if (is_mapping(e.handler)) e.mapping = &mapping_of(e.handler);
  e.origin = origin_id(py::str(py::handle(func)).cast<std::string>());
  return g_table.emplace(func, std::move(e)).first->second;
}

// Whether an xla tensor among args[1:] (or in a list there) or the kwargs'
// values shares the storage of args[0], the tensor an in-place op writes.
bool shares_self(PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) == 0 || !is_wrapper(PyTuple_GET_ITEM(args, 0))) return false;
  PyObject* self = PyTuple_GET_ITEM(args, 0);
  for (Py_ssize_t i = 1, n = PyTuple_GET_SIZE(args); i < n; ++i)
    if (shares_storage(self, PyTuple_GET_ITEM(args, i))) return true;
  Py_ssize_t pos = 0;
  PyObject *k, *v;
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v))
    if (shares_storage(self, v)) return true;
  return false;
}

// torch's overlap check of an in-place op (Python check_each_input, reached
// only when an argument shares the written tensor's storage). False with a
// Python error set when it raises.
bool check_self(PyObject* args, PyObject* kwargs) {
  if (!shares_self(args, kwargs)) return true;
  try {
    py::tuple t = py::reinterpret_borrow<py::tuple>(args);
    py::list inputs;
    for (size_t i = 1; i < t.size(); ++i) inputs.append(t[i]);
    if (kwargs)
      for (auto kv : py::reinterpret_borrow<py::dict>(kwargs)) inputs.append(kv.second);
    g_check_writes(t[0], inputs);
    return true;
  } catch (py::error_already_set& err) {
    err.restore();
    note_handler_error();
    return false;
  }
}

// __torch_dispatch__(func, types, args, kwargs)
PyObject* torch_dispatch(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n < 3 || !PyTuple_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "__torch_dispatch__(func, types, args, kwargs) expects an args tuple");
    return nullptr;
  }
  PyObject* args = argv[2];
  PyObject* kwargs = n > 3 && argv[3] != Py_None && PyDict_GET_SIZE(argv[3]) > 0 ? argv[3] : nullptr;
  Entry* e;
  try {
    e = &entry_of(argv[0]);
  } catch (py::error_already_set& err) {
    err.restore();
    return nullptr;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
  // An earlier op's error has been reported (or dropped) by now: don't keep
  // its traceback and tensors alive.
  if (t_last_error) Py_CLEAR(t_last_error);
  // Nodes built from here on name this overload as their origin (restored
  // after: handlers may dispatch further ops).
  struct OriginScope {
    uint32_t saved = t_origin;
    explicit OriginScope(uint32_t o) { t_origin = o; }
    ~OriginScope() { t_origin = saved; }
  } scope(e->origin);
  if (e->check_self && !check_self(args, kwargs)) return nullptr;
  if (e->mapping) return e->mapping->call(args, kwargs);
  return call_handler(e->handler.ptr(), args, kwargs);
}

PyMethodDef g_dispatch_def = {"torch_dispatch", (PyCFunction)(void (*)())torch_dispatch, METH_FASTCALL,
                              "The xla tensor's __torch_dispatch__(func, types, args, kwargs)."};

}  // namespace

// Calls a Python handler; its error is noted (and a device mix-up worded).
PyObject* call_handler(PyObject* handler, PyObject* args, PyObject* kwargs) {
  PyObject* r = PyObject_Call(handler, args, kwargs);
  if (!r) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (PyErr_GivenExceptionMatches(type, PyExc_AttributeError)) mixed_device(args, kwargs, type, value, tb);
    PyErr_Restore(type, value, tb);
    note_handler_error();
  }
  return r;
}

void note_handler_error() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb) PyException_SetTraceback(value, tb);
  Py_XINCREF(value);
  Py_XSETREF(t_last_error, value);
  PyErr_Restore(type, value, tb);
}

void bind_dispatch(py::module_& m) {
  m.add_object("torch_dispatch", py::reinterpret_steal<py::object>(PyCFunction_New(&g_dispatch_def, nullptr)));
  m.def("configure_dispatch", [](py::object resolver, py::object check_writes) {
          g_resolver = std::move(resolver);
          g_check_writes = std::move(check_writes);
          g_table.clear();
        },
        "Sets the resolver: aten overload -> (its handler (a Mapping or a function), whether args[0] gets the "
        "overlap check check_each_input(args[0], other args) first); clears the table.");
  m.def("dispatch_clear", [] { g_table.clear(); }, "Forgets resolved overloads (after handlers change).");
  m.def("take_handler_error", [] {
          PyObject* e = t_last_error;
          t_last_error = nullptr;
          return e ? py::reinterpret_steal<py::object>(e) : py::none();
        },
        "The last exception an op handler raised on this thread (then forgotten), or None.");
  m.def("dispatch_stats", [] { return std::make_pair(g_mapping_runs, g_mapping_declines); },
        "(calls a Mapping ran, calls it passed on to its check and rest handler) so far.");
}

}  // namespace txc

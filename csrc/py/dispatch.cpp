// The XlaTensor's __torch_dispatch__ in C++ (a staticmethod on the class).
// torch calls it for every aten op on xla tensors: it is the per-op hot path.
// The aten overload is looked up by identity in a table filled lazily from
// Python (the resolver: func -> (handler, recipe or None)). A recipe is a
// declared one-to-one mapping of the overload onto a core op (which args are
// operands, the attributes: constants or args, operand ranks, view or not),
// carried out here without entering Python. It is only a faster road to
// what its Python handler does: when a call does not fit it exactly (argument
// count, kwargs, operand kinds or ranks) or the core refuses it, the handler
// runs, with torch's own args tuple and kwargs dict, and has the last word
// (and the error messages).
#include <unordered_map>
#include <pybind11/stl.h>
#include "ops/registry.h"
#include "py/wrapper.h"

namespace txc {
namespace {

constexpr int kAny = -1;  // operand rank code: anything the core takes (tensors, numbers)
constexpr int kXla = -2;  // an xla tensor of any rank

struct Recipe {
  uint16_t op = 0;
  int nargs = 0;
  std::vector<int> operands;   // positional args that are operands, in core order
  std::vector<int> ranks;      // per operand: kAny, kXla or the required rank
  std::vector<int> layout;     // per attribute: the positional arg it is, or -1: the next constant
  Attrs constants;
  bool view = false;           // a view of operand 0 (shares its storage)
};

struct Entry {
  py::object func;     // keeps the key alive
  py::object handler;  // Python: handler(*args, **kwargs)
  bool has_recipe = false;
  Recipe recipe;
  uint32_t origin = 0;  // the overload's name as node provenance (origin_id)
};

// Never destroyed: their Python references must not be dropped after the
// interpreter has finalized.
auto& g_table = *new std::unordered_map<PyObject*, Entry>();
auto& g_resolver = *new py::object();  // Python: func -> (handler, recipe tuple or None)
uint64_t g_recipe_runs = 0, g_recipe_declines = 0;
// The last exception a handler raised on this thread (a new reference, or
// null). torch's Python device guard runs Python while autograd unwinds from
// a failed backward op and loses the pending exception on the way (the
// engine then reports "returned NULL without setting an exception");
// XlaTensor.backward re-raises this one instead.
thread_local PyObject* t_last_error = nullptr;

// A handler that read `_lt` of a CPU tensor (nn.Linear's CPU weight with an
// xla input) fails with AttributeError: report torch's device mismatch
// instead (error path only; _tensor.device_mismatch words it).
void mixed_device(PyObject* args, PyObject* kwargs, PyObject*& type, PyObject*& value, PyObject*& tb) {
  try {
    py::object err = py::module_::import("torch_xla_core._tensor")
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

PyObject* call_handler(PyObject* handler, PyObject* args, PyObject* kwargs) {
  PyObject* r = PyObject_Call(handler, args, kwargs);
  if (!r) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (PyErr_GivenExceptionMatches(type, PyExc_AttributeError)) mixed_device(args, kwargs, type, value, tb);
    if (tb) PyException_SetTraceback(value, tb);
    Py_XINCREF(value);
    Py_XSETREF(t_last_error, value);
    PyErr_Restore(type, value, tb);
  }
  return r;
}

Recipe parse_recipe(const py::tuple& t) {
  Recipe r;
  r.op = t[0].cast<uint16_t>();
  r.nargs = t[1].cast<int>();
  r.operands = t[2].cast<std::vector<int>>();
  r.ranks = t[3].cast<std::vector<int>>();
  r.layout = t[4].cast<std::vector<int>>();
  r.constants = to_attrs(t[5].cast<py::tuple>());
  r.view = t[6].cast<bool>();
  size_t nconst = 0;
  bool ok = r.ranks.size() == r.operands.size() && (!r.view || r.operands.size() == 1);
  for (int i : r.operands) ok = ok && i >= 0 && i < r.nargs;
  for (int i : r.layout) {
    ok = ok && i >= -1 && i < r.nargs;
    nconst += i == -1;
  }
  if (!ok || nconst != r.constants.size())
    throw std::invalid_argument("malformed direct recipe for core op " + op_def(r.op).name);
  return r;
}

Entry& entry_of(PyObject* func) {
  auto it = g_table.find(func);
  if (it != g_table.end()) return it->second;
  if (!g_resolver) throw std::runtime_error("torch_xla_core: the xla dispatcher is not configured");
  py::tuple res = g_resolver(py::handle(func));
  Entry e;
  e.func = py::reinterpret_borrow<py::object>(func);
  e.handler = res[0];
  e.origin = origin_id(py::str(py::handle(func)).cast<std::string>());
  if (!res[1].is_none()) {
    e.recipe = parse_recipe(res[1].cast<py::tuple>());
    e.has_recipe = true;
  }
  return g_table.emplace(func, std::move(e)).first->second;
}

// The recipe's result, or a null object when the call does not fit it.
py::object run_recipe(const Recipe& r, PyObject* args) {
  if (PyTuple_GET_SIZE(args) != r.nargs) return py::object();
  std::vector<NodePtr> xs;
  xs.reserve(r.operands.size());
  bool has_wrapped = false;
  LazyTensor* base = nullptr;
  for (size_t k = 0; k < r.operands.size(); ++k) {
    py::handle h = PyTuple_GET_ITEM(args, r.operands[k]);
    if (r.ranks[k] == kAny && !r.view) {
      xs.push_back(operand(h, has_wrapped));
      continue;
    }
    if (!is_wrapper(h)) return py::object();
    LazyTensor& lt = lazy_of_wrapper(h);
    const NodePtr& v = lt.value();
    if (r.ranks[k] >= 0 && v->dims.size() != size_t(r.ranks[k])) return py::object();
    xs.push_back(v);
    base = &lt;
  }
  Attrs attrs;
  attrs.reserve(r.layout.size());
  size_t c = 0;
  for (int i : r.layout) attrs.push_back(i < 0 ? r.constants[c++] : to_attr(PyTuple_GET_ITEM(args, i)));
  if (r.view) {
    NodePtr v = make_node(r.op, std::move(xs), std::move(attrs));
    LazyTensor t(*base, std::move(v));
    // A view torch's strides cannot express (the core made a copy): the
    // handler decides (aten.view raises torch's error, reshape copies).
    if (base->is_view() && !t.is_view()) return py::object();
    return wrap(std::move(t));
  }
  return wrap(make_from(r.op, std::move(xs), std::move(attrs), has_wrapped));
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
  if (e->has_recipe && !kwargs) {
    try {
      py::object r = run_recipe(e->recipe, args);
      if (r) {
        ++g_recipe_runs;
        return r.release().ptr();
      }
    } catch (py::error_already_set&) {
      // the handler decides (and words the error)
    } catch (const std::exception&) {
    }
    PyErr_Clear();
    ++g_recipe_declines;
  }
  return call_handler(e->handler.ptr(), args, kwargs);
}

PyMethodDef g_dispatch_def = {"torch_dispatch", (PyCFunction)(void (*)())torch_dispatch, METH_FASTCALL,
                              "The xla tensor's __torch_dispatch__(func, types, args, kwargs)."};

}  // namespace

void bind_dispatch(py::module_& m) {
  m.add_object("torch_dispatch", py::reinterpret_steal<py::object>(PyCFunction_New(&g_dispatch_def, nullptr)));
  m.def("configure_dispatch", [](py::object resolver) {
          g_resolver = std::move(resolver);
          g_table.clear();
        },
        "Sets the resolver: aten overload -> (handler, direct recipe tuple or None); clears the table.");
  m.def("dispatch_clear", [] { g_table.clear(); }, "Forgets resolved overloads (after handlers change).");
  m.def("take_handler_error", [] {
          PyObject* e = t_last_error;
          t_last_error = nullptr;
          return e ? py::reinterpret_steal<py::object>(e) : py::none();
        },
        "The last exception an op handler raised on this thread (then forgotten), or None.");
  m.def("dispatch_stats", [] { return std::make_pair(g_recipe_runs, g_recipe_declines); },
        "(calls run by a direct recipe, calls a recipe declined to its handler) so far.");
  m.def("dispatch_has_recipe", [](py::handle func) {
          auto it = g_table.find(func.ptr());
          return it != g_table.end() && it->second.has_recipe;
        },
        "Whether a resolved overload runs through a direct recipe.");
}

}  // namespace txc

// The walk of a replayed step's inputs (torch_xla_core/replay/_walk.py Walk),
// in one C++ pass instead of a few Python attribute reads per tensor: every
// module's parameters, grads, buffers, hooks and number attributes, and an
// optimizer's per-parameter state, appended to parallel lists.
//
//   replay_slot_kinds: the kind numbers of the walk's locations (Where)
//   replay_walk_module(m, seen, sig, kinds, owners, keys, tensors)   a module's part of the
//       walk (replay/_walk.py Walk.module): per submodule, its number/string
//       attributes, hooks, parameters (and grads) and buffers
//   replay_walk_state(params, state, sig, kinds, owners, keys, tensors, xla_type, other)
//       an optimizer's per-parameter state (replay/_walk.py Walk.optimizer)
#include "py/replay_walk.h"
#include <unordered_map>
#include <vector>
#include "py/wrapper.h"

namespace txc {
namespace {


struct Walk {
  py::list sig, kinds, owners, keys, tensors;
  void tensor(py::handle t, Where kind, py::handle owner, py::handle key) {
    static py::object ints[] = {py::int_(0), py::int_(1), py::int_(2), py::int_(3), py::int_(4), py::int_(5)};
    kinds.append(ints[kind]);
    owners.append(owner);
    keys.append(key);
    tensors.append(t);
  }
};

bool is_scalar(PyObject* v) {
  return v == Py_None || PyLong_Check(v) || PyFloat_Check(v) || PyUnicode_Check(v);
}

// d[key] of a module's __dict__ (borrowed); a missing one is an error naming it.
PyObject* dict_item(PyObject* d, PyObject* key) {
  PyObject* v = PyDict_GetItemWithError(d, key);
  if (!v && !PyErr_Occurred())
    PyErr_Format(PyExc_AttributeError, "replay: a module's __dict__ has no %R", key);
  if (!v) throw py::error_already_set();
  return v;
}

py::tuple keys(PyObject* d) {
  if (PyDict_Check(d) && PyDict_GET_SIZE(d) == 0) return py::tuple();
  return py::reinterpret_steal<py::tuple>(PySequence_Tuple(d));
}

// One module: what Walk.module appends for it (see replay/_walk.py).
void walk_one(Walk& w, PyObject* mod, py::handle d) {
  static PyObject *params = str("_parameters"), *buffers = str("_buffers"), *pre = str("_forward_pre_hooks"),
                  *fwd = str("_forward_hooks"), *bwd = str("_backward_hooks"), *grad = str("grad"),
                  *no_hooks = str("no hooks");
  // the attributes as a count and then name, value pairs, flat (no tuple per module: a walk over
  // hundreds of modules every call should not feed the garbage collector)
  size_t at = w.sig.size();
  w.sig.append(py::none());
  int64_t n = 0;
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(d.ptr(), &pos, &k, &v))
    if (PyUnicode_Check(k) && PyUnicode_GET_LENGTH(k) && PyUnicode_READ_CHAR(k, 0) != '_' && is_scalar(v)) {
      w.sig.append(k);
      w.sig.append(v);
      ++n;
    }
  w.sig[at] = py::int_(n);
  PyObject *hp = dict_item(d.ptr(), pre), *hf = dict_item(d.ptr(), fwd), *hb = dict_item(d.ptr(), bwd);
  if (PyDict_Check(hp) && PyDict_Check(hf) && PyDict_Check(hb) && !PyDict_GET_SIZE(hp) && !PyDict_GET_SIZE(hf) &&
      !PyDict_GET_SIZE(hb))
    w.sig.append(no_hooks);
  else
    w.sig.append(py::make_tuple(keys(hp), keys(hf), keys(hb)));
  py::handle m(mod);
  pos = 0;
  PyObject* ps = dict_item(d.ptr(), params);
  while (PyDict_Next(ps, &pos, &k, &v)) {
    w.sig.append(k);
    w.tensor(v, kParam, m, k);
    if (v != Py_None) {
      py::object g = py::reinterpret_steal<py::object>(PyObject_GetAttr(v, grad));
      if (!g) throw py::error_already_set();
      w.tensor(g, kGrad, v, Py_None);
    }
  }
  pos = 0;
  PyObject* bs = dict_item(d.ptr(), buffers);
  while (PyDict_Next(bs, &pos, &k, &v)) {
    w.sig.append(k);
    w.tensor(v, kBuffer, m, k);
  }
}

inline void prefetch(const void* p) {
  if (p) __builtin_prefetch(p);
}

py::object id_of(PyObject* o) { return py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(o)); }

// Pre-order over a module's submodules as Module.modules() yields them; a
// submodule already in `seen` (walked from another root) is skipped with
// its subtree.
void walk_tree(Walk& w, PyObject* mod, py::set& seen, bool root) {
  static PyObject* modules = str("_modules");
  if (!root) {
    py::object id = id_of(mod);
    if (seen.contains(id)) return;
    seen.add(id);
  }
  py::object d = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(mod, nullptr));
  if (!d) throw py::error_already_set();
  walk_one(w, mod, d);
  PyObject* subs = dict_item(d.ptr(), modules);
  py::list children;  // (a forward hook may not change _modules under us, but copy to be safe)
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(subs, &pos, &k, &v))
    if (v != Py_None) children.append(v);
  for (py::handle c : children) walk_tree(w, c.ptr(), seen, false);
}

void walk_module(py::handle m, py::set seen, py::list sig, py::list kinds, py::list owners, py::list keys,
                 py::list tensors) {
  Walk w{sig, kinds, owners, keys, tensors};
  py::object id = id_of(m.ptr());
  if (seen.contains(id)) {
    sig.append(py::make_tuple("seen", id));
    return;
  }
  seen.add(id);
  sig.append(py::make_tuple("module", id));
  walk_tree(w, m.ptr(), seen, true);
}

// The state dicts of `params` (one param group) in `state` (None where a parameter has none). A dict is read
// through one pass over its entries, matching keys by identity (a tensor's hash is its id, so a lookup
// finds the same entry), not a lookup per parameter: torch.Tensor.__hash__ is Python code (~0.3-1 µs
// a call, 256 calls a step in the MLP). Lookups where the group holds few of the state's parameters.
std::vector<py::object> states_of(py::handle params, py::handle state) {
  std::vector<PyObject*> params_v;
  for (py::handle p : params) params_v.push_back(p.ptr());
  std::vector<py::object> out;
  out.reserve(params_v.size());
  if (PyDict_Check(state.ptr()) && Py_TYPE(params.ptr()) == &PyList_Type &&
      4 * Py_ssize_t(params_v.size()) >= PyDict_GET_SIZE(state.ptr())) {
    std::unordered_map<PyObject*, PyObject*> by_id;
    by_id.reserve(size_t(PyDict_GET_SIZE(state.ptr())));
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(state.ptr(), &pos, &k, &v)) by_id.emplace(k, v);
    for (PyObject* p : params_v) {
      auto it = by_id.find(p);
      out.push_back(it == by_id.end() ? py::none() : py::reinterpret_borrow<py::object>(it->second));
      prefetch(out.back().ptr());
    }
    return out;
  }
  for (PyObject* p : params_v) {
    if (PyDict_Check(state.ptr())) {  // (a defaultdict too: this reads without inserting, as get() does)
      PyObject* v = PyDict_GetItemWithError(state.ptr(), p);
      if (!v && PyErr_Occurred()) throw py::error_already_set();
      out.push_back(v ? py::reinterpret_borrow<py::object>(v) : py::none());
    } else {
      PyObject* v = PyObject_CallMethod(state.ptr(), "get", "O", p);
      if (!v) throw py::error_already_set();
      out.push_back(py::reinterpret_steal<py::object>(v));
    }
  }
  return out;
}

// An optimizer's state, per parameter in `params` (one param group): 0 for
// none; else per entry its key, and an xla tensor as an input slot
// ("state", st, key), anything else as other(value) in the signature.
void walk_state(py::handle params, py::handle state, py::list sig, py::list kinds, py::list owners, py::list keys,
                py::list tensors, py::handle xla_type, py::handle other) {
  Walk w{sig, kinds, owners, keys, tensors};
  py::object zero = py::int_(0);
  std::vector<py::object> keep = states_of(params, state);  // (held for the walk's duration)
  for (const py::object& st : keep)  // the entries' values, loaded together before the walk reads them one by one
    if (PyDict_CheckExact(st.ptr())) {
      PyObject *k, *v;
      Py_ssize_t pos = 0;
      while (PyDict_Next(st.ptr(), &pos, &k, &v)) prefetch(v);
    }
  for (const py::object& st : keep) {
    int truth = PyObject_IsTrue(st.ptr());
    if (truth < 0) throw py::error_already_set();
    if (!truth) {
      sig.append(zero);
      continue;
    }
    if (!PyDict_Check(st.ptr())) {
      sig.append(other(st));
      continue;
    }
    py::dict entries = py::reinterpret_borrow<py::dict>(st);
    for (auto [k, v] : entries) {
      sig.append(k);
      int xla = is_wrapper(v) || PyObject_IsInstance(v.ptr(), xla_type.ptr());
      if (xla < 0) throw py::error_already_set();
      if (xla)
        w.tensor(v, kState, st, k);
      else
        sig.append(other(v));
    }
  }
}

}  // namespace

void bind_replay_walk(py::module_& m) {
  py::dict kinds;  // the Where values, for replay/_walk.py's own slots (arguments, optimizer group tensors)
  kinds["arg"] = int(kArg), kinds["param"] = int(kParam), kinds["grad"] = int(kGrad);
  kinds["buffer"] = int(kBuffer), kinds["state"] = int(kState), kinds["group"] = int(kGroup);
  m.attr("replay_slot_kinds") = kinds;
  m.def("replay_walk_module", &walk_module, py::arg("module"), py::arg("seen"), py::arg("sig"), py::arg("kinds"),
        py::arg("owners"), py::arg("keys"), py::arg("tensors"));
  m.def("replay_walk_state", &walk_state, py::arg("params"), py::arg("state"), py::arg("sig"), py::arg("kinds"),
        py::arg("owners"), py::arg("keys"), py::arg("tensors"), py::arg("xla_type"), py::arg("other"));
}

}  // namespace txc

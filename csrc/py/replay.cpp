// The per-tensor loops of a replayed step (torch_xla_core/replay.py), in one
// C++ pass each instead of a few Python attribute reads per tensor: a
// training step's inputs are every parameter, grad and optimizer state
// tensor (a 64-layer MLP with AdamW: ~1300), so these loops were most of a
// replay's host time.
//
//   replay_signature(tensors, xla_type) -> (bytes, -1) | (None, i)
//       the guard's tensor part: per slot None, or the value's dims and
//       dtype, requires_grad, the first slot holding the same buffer or
//       storage (aliasing among inputs), and for a view that shares its
//       storage its view ops, storage dims, strides and offset. (None, i)
//       when tensors[i] is not an xla tensor.
//   replay_ready(tensors) -> bool        every input is device data (or an
//       alias of a whole storage that is): nothing to compute before binding
//   replay_exclusive(tensors, slots) -> int   the first slot whose buffer is
//       held elsewhere (may not be donated), or -1
//   replay_params(tensors, binds, rng) -> list   the executable's arguments
//   replay_write(tensors, outs, writes, specs)   in-place writes of outputs
#include <pybind11/stl.h>
#include <unordered_map>
#include "ops/registry.h"
#include "py/data.h"
#include "py/lazy.h"

namespace txc {
namespace {

uint16_t data_op() {
  static const uint16_t id = op_id("data");
  return id;
}
uint16_t alias_op() {
  static const uint16_t id = op_id("alias");
  return id;
}

PyObject* lt_name() {
  static PyObject* s = PyUnicode_InternFromString("_lt");
  return s;
}

// The LazyTensor of an XlaTensor (its `_lt` slot).
LazyTensor& lazy_of(py::handle t) {
  py::object lt = py::reinterpret_steal<py::object>(PyObject_GetAttr(t.ptr(), lt_name()));
  if (!lt) throw py::error_already_set();
  return lazy_arg(lt);  // the tensor keeps it alive
}

bool is_data(const NodePtr& v) { return v->op == data_op(); }

// The buffer object of a data node (borrowed from the node), or nullptr.
PyObject* buffer_of(const NodePtr& v) { return py_data_ptr(*v); }

// An alias of its whole storage (x.detach()): view ops all "alias", same dims.
bool alias_only(LazyTensor& lt) {
  const NodePtr& root = lt.storage()->value;
  for (NodePtr n = lt.value(); n != root; n = n->operands.at(0))
    if (n->op != alias_op()) return false;
  return lt.value()->dims == root->dims;
}

// The buffer bound for a tensor: its own, or its storage's for a view.
PyObject* root_buffer(LazyTensor& lt) { return lt.is_view() ? buffer_of(lt.storage()->value) : buffer_of(lt.value()); }

void put(std::string& s, int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_dims(std::string& s, const Dims& d) {
  put(s, int64_t(d.size()));
  for (auto x : d) put(s, x);
}
void put_ints(std::string& s, py::handle seq) {
  py::sequence q = py::reinterpret_borrow<py::sequence>(seq);
  put(s, int64_t(q.size()));
  for (auto x : q) put(s, x.cast<int64_t>());
}

py::tuple signature(py::list tensors, py::handle xla_type) {
  static PyObject* requires_grad = PyUnicode_InternFromString("requires_grad");
  std::string sig;
  sig.reserve(tensors.size() * 48);
  std::unordered_map<const void*, int64_t> first;
  first.reserve(tensors.size());
  int64_t i = 0;
  for (py::handle t : tensors) {
    if (t.is_none()) {
      put(sig, -1);
      ++i;
      continue;
    }
    int ok = PyObject_IsInstance(t.ptr(), xla_type.ptr());
    if (ok < 0) throw py::error_already_set();
    if (!ok) return py::make_tuple(py::none(), i);
    LazyTensor& lt = lazy_of(t);
    const NodePtr& v = lt.value();
    const void* key;
    bool view_entry = false;
    std::vector<int64_t> ops;
    if (is_data(v)) {
      key = buffer_of(v);
    } else if (lt.is_view()) {
      bool lone = lt.storage().use_count() == 1 && py::cast<bool>(t.attr("is_contiguous")());
      const NodePtr& root = lt.storage()->value;
      key = is_data(root) ? static_cast<const void*>(buffer_of(root)) : static_cast<const void*>(lt.storage().get());
      for (NodePtr n = v; n != root; n = n->operands.at(0))  // the view ops, from t back to its storage
        if (n->op != alias_op()) ops.push_back(n->op);
      view_entry = (!ops.empty() || v->dims != root->dims) && !lone;
    } else {
      key = lt.storage().get();
    }
    put(sig, int64_t(v->dtype));
    put_dims(sig, v->dims);
    py::object rg = py::reinterpret_steal<py::object>(PyObject_GetAttr(t.ptr(), requires_grad));
    if (!rg) throw py::error_already_set();
    put(sig, rg.ptr() == Py_True ? 1 : 0);
    put(sig, first.emplace(key, i).first->second);
    if (view_entry) {
      const NodePtr& root = lt.storage()->value;
      put(sig, int64_t(ops.size()));
      for (auto it = ops.rbegin(); it != ops.rend(); ++it) put(sig, *it);
      put_dims(sig, root->dims);
      put_ints(sig, t.attr("stride")());
      put(sig, t.attr("storage_offset")().cast<int64_t>());
    } else {
      put(sig, -1);
    }
    ++i;
  }
  return py::make_tuple(py::bytes(sig), -1);
}

bool ready(py::list tensors) {
  for (py::handle t : tensors) {
    if (t.is_none()) continue;
    LazyTensor& lt = lazy_of(t);
    if (is_data(lt.value())) continue;
    if (lt.is_view() && alias_only(lt) && is_data(lt.storage()->value)) continue;
    return false;
  }
  return true;
}

int64_t first_shared(py::list tensors, const std::vector<int64_t>& slots) {
  for (int64_t i : slots)
    if (!data_exclusive(lazy_of(tensors[size_t(i)]))) return i;
  return -1;
}

// binds: (kind, v) per parameter: ("slot", i) the buffer of tensors[i];
// ("const", buffer); ("rng", None) the RNG state's buffer `rng`.
py::list params(py::list tensors, py::list binds, py::handle rng) {
  py::list out(binds.size());
  size_t j = 0;
  for (py::handle b : binds) {
    py::tuple kv = py::reinterpret_borrow<py::tuple>(b);
    std::string kind = kv[0].cast<std::string>();
    py::object p;
    if (kind == "slot") {
      LazyTensor& lt = lazy_of(tensors[kv[1].cast<size_t>()]);
      PyObject* buf = root_buffer(lt);
      if (!buf) throw std::runtime_error("replay: input slot " + std::to_string(kv[1].cast<int64_t>()) +
                                         " holds no device data");
      p = py::reinterpret_borrow<py::object>(buf);
    } else if (kind == "const") {
      p = kv[1];
    } else {
      p = py::reinterpret_borrow<py::object>(rng);
    }
    PyList_SET_ITEM(out.ptr(), j++, p.release().ptr());
  }
  return out;
}

// writes: (i, k) pairs: tensors[i] now holds output k, specs[k] = (dtype, dims).
void write(py::list tensors, py::sequence outs, const std::vector<std::pair<int64_t, int64_t>>& writes,
           py::sequence specs) {
  for (auto [i, k] : writes) {
    py::tuple spec = specs[size_t(k)];
    NodePtr v = make_py_data(outs[size_t(k)], DType(spec[0].cast<int>()), spec[1].cast<Dims>(), 0);
    lazy_of(tensors[size_t(i)]).assign(std::move(v));
  }
}

}  // namespace

void bind_replay(py::module_& m) {
  m.def("replay_signature", &signature, py::arg("tensors"), py::arg("xla_type"));
  m.def("replay_ready", &ready, py::arg("tensors"));
  m.def("replay_exclusive", &first_shared, py::arg("tensors"), py::arg("slots"));
  m.def("replay_params", &params, py::arg("tensors"), py::arg("binds"), py::arg("rng"));
  m.def("replay_write", &write, py::arg("tensors"), py::arg("outs"), py::arg("writes"), py::arg("specs"));
}

}  // namespace txc

// Device data as IR leaves: the runtime's buffer (a Python object from
// torch_xla_core/_runtime/runtime.py) wrapped as the opaque payload of a data node
// (ir/node.h: LeafData), so the IR itself holds no Python objects.
//
// A placeholder buffer (torch_xla_core/_execution/pending.py): a dynamo graph's
// replay whose outputs only the next graph's replay reads leaves its launch
// pending, and its outputs' data leaves hold placeholder objects of the type
// set_pending() registers. Reading such a buffer (py_data_ptr, py_data) first
// resolves it: the registered function launches what is pending (or takes
// the output of the fused launch that ran it) and the leaf holds the real
// buffer from then on (while a replay binds the placeholders it fuses, the
// function hands those back as they are). py_data_raw reads without
// resolving (identity only: signatures, refcounts of donation).
#pragma once
#include <pybind11/pybind11.h>
#include "ir/node.h"

namespace txc {
namespace py = pybind11;

inline PyTypeObject* pending_type = nullptr;  // the placeholders' type (nullptr: none registered)
inline PyObject* pending_resolver = nullptr;  // placeholder -> its buffer (a strong reference, kept)

struct PyData final : LeafData {
  mutable py::object buffer;  // (a placeholder is replaced by its buffer when read)
  explicit PyData(py::object b) : buffer(std::move(b)) {}
  // The node's reference is the only one (GraphCut::donations asks; the GIL is held).
  bool held_elsewhere() const override { return Py_REFCNT(buffer.ptr()) != 1; }
  ~PyData() override {
    py::gil_scoped_acquire gil;  // a node may be freed on a thread without the GIL
    buffer = py::object();
  }
};

// A data leaf holding `buffer` on xla device `device` (-1: any).
inline NodePtr make_py_data(py::object buffer, DType dtype, Dims dims, int16_t device, uint8_t memory = 0) {
  return make_data(dtype, std::move(dims), std::make_shared<PyData>(std::move(buffer)), device, memory);
}

// The buffer object of a data leaf as it is, a placeholder not resolved
// (nullptr for other nodes or a payload of another kind): for identity only.
inline PyObject* py_data_raw(const Node& n) {
  auto* d = dynamic_cast<const PyData*>(n.data.get());
  return d ? d->buffer.ptr() : nullptr;
}

// The buffer of a data leaf, borrowed from the node (nullptr for other nodes
// or a payload of another kind); a placeholder is resolved first (its pending
// launch runs).
inline PyObject* py_data_ptr(const Node& n) {
  auto* d = dynamic_cast<const PyData*>(n.data.get());
  if (!d) return nullptr;
  PyObject* b = d->buffer.ptr();
  if (b && Py_TYPE(b) == pending_type) {
    PyObject* r = PyObject_CallOneArg(pending_resolver, b);
    if (!r) throw py::error_already_set();
    d->buffer = py::reinterpret_steal<py::object>(r);
    b = r;
  }
  return b;
}

// The buffer of a data leaf (None for other nodes or a payload of another kind).
inline py::object py_data(const Node& n) {
  PyObject* b = py_data_ptr(n);
  return b ? py::reinterpret_borrow<py::object>(b) : py::none();
}

// Whether the node's reference is the only one to its buffer (no tensor,
// list or user variable holds it): what donating the buffer needs.
inline bool buffer_held_by_node_only(const Node& n) {
  PyObject* b = py_data_raw(n);  // (a placeholder only the node holds: its buffer will be the node's alone)
  return b && Py_REFCNT(b) == 1;
}

}  // namespace txc

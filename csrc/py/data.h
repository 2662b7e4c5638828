// Device data as IR leaves: the runtime's buffer (a Python object from
// torch_xla_core/_runtime/runtime.py) wrapped as the opaque payload of a data node
// (ir/node.h: LeafData), so the IR itself holds no Python objects.
#pragma once
#include <pybind11/pybind11.h>
#include "ir/node.h"

namespace txc {
namespace py = pybind11;

struct PyData final : LeafData {
  py::object buffer;
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

// The buffer of a data leaf, borrowed from the node (nullptr for other nodes
// or a payload of another kind).
inline PyObject* py_data_ptr(const Node& n) {
  auto* d = dynamic_cast<const PyData*>(n.data.get());
  return d ? d->buffer.ptr() : nullptr;
}

// The buffer of a data leaf (None for other nodes or a payload of another kind).
inline py::object py_data(const Node& n) {
  PyObject* b = py_data_ptr(n);
  return b ? py::reinterpret_borrow<py::object>(b) : py::none();
}

// Whether the node's reference is the only one to its buffer (no tensor,
// list or user variable holds it): what donating the buffer needs.
inline bool buffer_held_by_node_only(const Node& n) {
  PyObject* b = py_data_ptr(n);
  return b && Py_REFCNT(b) == 1;
}

}  // namespace txc

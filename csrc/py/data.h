// Device data as IR leaves: the runtime's buffer (a Python object from
// torch_xla_core/runtime.py) wrapped as the opaque payload of a data node
// (ir/node.h: LeafData), so the IR itself holds no Python objects.
#pragma once
#include <pybind11/pybind11.h>
#include "ir/node.h"

namespace txc {
namespace py = pybind11;

struct PyData final : LeafData {
  py::object buffer;
  explicit PyData(py::object b) : buffer(std::move(b)) {}
  ~PyData() override {
    py::gil_scoped_acquire gil;  // a node may be freed on a thread without the GIL
    buffer = py::object();
  }
};

// A data leaf holding `buffer` on xla device `device` (-1: any).
inline NodePtr make_py_data(py::object buffer, DType dtype, Dims dims, int16_t device, uint8_t memory = 0) {
  return make_data(dtype, std::move(dims), std::make_shared<const PyData>(std::move(buffer)), device, memory);
}

// The buffer of a data leaf (None for other nodes or a payload of another kind).
inline py::object py_data(const Node& n) {
  auto* d = dynamic_cast<const PyData*>(n.data.get());
  return d ? d->buffer : py::none();
}

}  // namespace txc

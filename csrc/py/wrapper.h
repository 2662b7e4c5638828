// Python-facing pieces shared by the bindings (module.cpp) and the C++
// __torch_dispatch__ (py/dispatch.cpp): core operands from Python objects,
// attributes from Python values, and the XlaTensor wrapper that carries a
// LazyTensor in its `_lt` attribute.
#pragma once
#include <pybind11/pybind11.h>
#include "ir/node.h"
#include "py/lazy.h"
#include "trace/tensor.h"

namespace txc {
namespace py = pybind11;

Attr to_attr(py::handle h);                  // int/bool, float, str, or a tuple/list of ints
Attrs to_attrs(const py::tuple& t);
bool is_wrapper(py::handle h);               // an XlaTensor (or subclass)
LazyTensor& lazy_of_wrapper(py::handle h);   // its LazyTensor (the wrapper keeps it alive)
// The `_lt` object of an XlaTensor h, read from its slot without checks (nullptr
// when h is no XlaTensor or the slot is not known): for prefetching.
PyObject* lazy_slot_unchecked(PyObject* h);
// The core operand for h: a wrapper's or LazyTensor's value, a Python number
// (a "wrapped" scalar: sets has_wrapped), or (number, dtype) for a 0-d host tensor.
NodePtr operand(py::handle h, bool& has_wrapped);
// Core op `op` over Python operands (see operand()) with Python attributes.
LazyTensor apply(uint16_t op, const py::tuple& operands, const py::tuple& attrs);
// A view of base (an XlaTensor or a LazyTensor) through view op `op`.
LazyTensor view_of(uint16_t op, py::handle base, const py::tuple& attrs);
py::object wrap(LazyTensor&& t);             // a new XlaTensor holding t (a view: with its strides, offset)
void set_lazy(py::handle w, LazyTensor&& t); // XlaTensor w now holds t (its `_lt`); w's sizes and strides stay
// Whether `a` (an arg of an op writing xla tensor w), or an element of a list
// or tuple `a`, is an xla tensor other than w that shares w's storage.
bool shares_storage(PyObject* w, PyObject* a);
void keep_thread_state();
void bind_wrapper(py::module_& m);           // configure_wrapper, op, view, wrap, shares_storage
}  // namespace txc

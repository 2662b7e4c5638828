// The Python object of a LazyTensor: a small CPython heap type holding the
// LazyTensor inline, and pybind11's caster for it. An op makes one per result
// (the XlaTensor's `_lt`), so it avoids pybind11's class machinery (instance
// registry, holder, type lookups): allocation, reads and frees are plain C.
// Every file that passes LazyTensors through pybind11 includes this header.
#pragma once
#include <pybind11/pybind11.h>
#include "trace/tensor.h"

namespace txc {
namespace py = pybind11;

struct PyLazy {
  PyObject_HEAD
  LazyTensor t;
};

extern PyTypeObject* g_lazy_type;  // set by bind_lazy()
inline bool is_lazy(PyObject* o) { return g_lazy_type && Py_TYPE(o) == g_lazy_type; }
inline LazyTensor& lazy_ref(PyObject* o) { return reinterpret_cast<PyLazy*>(o)->t; }
PyObject* new_lazy(LazyTensor&& t);  // a new reference
LazyTensor& lazy_arg(py::handle h);  // h's LazyTensor, or TypeError
// For donation (replay): may this tensor's buffer be overwritten in place?
// Device data held by its storage alone: no view, no other storage or view
// chain holding the node, no other Python reference to the buffer
// (GraphCut::donations() asks the same of a cut).
bool data_exclusive(LazyTensor& t);
// t's view chain applied to `base` (a tensor of t's storage's dims): a view of
// base's storage (ValueError when the dims differ).
LazyTensor rebase(LazyTensor& t, LazyTensor& base);
void bind_lazy(py::module_& m);      // the type, its properties and methods
}  // namespace txc

namespace pybind11::detail {
template <>
class type_caster<txc::LazyTensor> {
 public:
  static constexpr auto name = const_name("LazyTensor");
  bool load(handle src, bool) {
    if (!src || !txc::is_lazy(src.ptr())) return false;
    value_ = &txc::lazy_ref(src.ptr());
    return true;
  }
  static handle cast(txc::LazyTensor&& t, return_value_policy, handle) { return txc::new_lazy(std::move(t)); }
  static handle cast(const txc::LazyTensor& t, return_value_policy, handle) { return txc::new_lazy(t.alias()); }
  template <typename T>
  using cast_op_type = pybind11::detail::cast_op_type<T>;
  operator txc::LazyTensor*() { return value_; }
  operator txc::LazyTensor&() { return *value_; }

 private:
  txc::LazyTensor* value_ = nullptr;
};
}  // namespace pybind11::detail

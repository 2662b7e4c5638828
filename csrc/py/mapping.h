// A Mapping: the one declaration of an aten overload that is one core op
// (torch_xla_core/_ops/registry.py: mapping()). It says which positional
// args are operands (and what they must be), where each attribute comes
// from (a constant, a positional arg, a keyword arg; missing optional args
// take the schema's default), and whether the result is a view of operand 0.
// The C++ __torch_dispatch__ (py/dispatch.cpp) runs it without entering
// Python; called from Python (_C.Mapping.__call__) it runs the same code, so
// the fast path and the Python handler cannot differ.
//
// A call the mapping does not fit (an unexpected keyword, an operand of
// another kind or rank, an attribute of an unsupported type, a view torch's
// strides cannot express) goes to `check` (which raises torch's error where
// torch refuses the call) and then to `rest`: the overload's @impl handler,
// or torch's decomposition / the CPU fallback. When the core refuses a call
// the mapping fits, `check` may word the error; else the core's error (it
// names the core op) is raised.
#pragma once
#include <pybind11/pybind11.h>
#include <string>
#include <vector>
#include "ir/node.h"

namespace txc {
namespace py = pybind11;

struct Mapping {
  static constexpr int kAny = -1;  // operand: anything the core takes (tensors, numbers, 0-d CPU tensors)
  static constexpr int kXla = -2;  // operand: an xla tensor of any rank

  struct Operand {
    int arg;   // positional arg index
    int rank;  // kAny, kXla or the rank the xla tensor must have
  };
  enum class From : uint8_t { Constant, Positional, Keyword };
  struct AttrSpec {
    From from = From::Constant;
    int arg = -1;          // Positional: the arg index
    py::object name;       // Keyword: its name (an interned str)
    bool has_value = false;
    Attr value;            // Constant: the value; else the default when the arg is absent
  };

  uint16_t op = 0;
  std::string aten;        // the overload's name, for errors
  int min_args = 0, max_args = 0;
  std::vector<Operand> operands;
  std::vector<AttrSpec> attrs;
  bool view = false;       // the result is a view of operand 0 (shares its storage)
  py::object check;        // None, or check(*args, **kwargs): raises torch's error for a refused call
  py::object rest;         // handler for the calls the mapping does not fit

  // The mapping's result, or a null object when the call does not fit it.
  // Throws py::error_already_set for Python errors (an operand from another
  // device) and std::exception when the core refuses the call.
  py::object apply(PyObject* args, PyObject* kwargs) const;
  // apply(), with check and rest for what it does not take: a new reference,
  // or null with a Python error set.
  PyObject* call(PyObject* args, PyObject* kwargs) const;
};

bool is_mapping(py::handle h);
const Mapping& mapping_of(py::handle h);   // h must be a Mapping
// Counters: calls a mapping ran, calls it passed to check/rest.
extern uint64_t g_mapping_runs, g_mapping_declines;
// handler(*args, **kwargs) as the dispatcher calls handlers (dispatch.cpp).
PyObject* call_handler(PyObject* handler, PyObject* args, PyObject* kwargs);
// Records the pending Python error as the last handler error of this thread
// (see dispatch.cpp: the autograd engine hook, _ops/engine.py, re-raises it).
void note_handler_error();
void bind_mapping(py::module_& m);
}  // namespace txc

// torch's foreach ops, per element without Python where it can
// (torch_xla_core/_ops/foreach.py): an optimizer's step is a few foreach
// calls over every parameter, and running the per-tensor op's handler for
// each element cost 3-13 us of Python each.
//
//   foreach_key(args) -> bytes | None   what one element's call depends on
//       besides its tensors' values: per argument an xla tensor's dtype,
//       dims, device and view-ness (and which earlier argument holds the same
//       value), or a Python number's type and value; None where an argument is
//       of another kind (then the element runs its handler)
//   ForeachTemplate(args)   made before an element's handler runs: notes its
//       tensors' values. .set_result(r) after it: the nodes the handler built
//       for r, kept as a template (False where r is not one new value built
//       from them). .result(args) / .write(args) build the same nodes over
//       another element's tensors (one of the same foreach_key): its result,
//       or written into args[0] in place (False, nothing written, where an
//       argument shares args[0]'s storage: the caller checks and writes).
//       The graph gets the nodes the handler would have built: the same ops,
//       attributes and constants (a number the handler made is one shared
//       leaf instead of one per element).
//   write_result(written, result, args) -> bool   an in-place op's write in
//       C++ where there is nothing to cast, broadcast or check
#include <pybind11/stl.h>
#include <cstring>
#include <unordered_map>
#include "py/lazy.h"
#include "py/wrapper.h"

namespace txc {
namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

py::object foreach_key(py::tuple args) {
  std::string k;
  k.reserve(64);
  std::vector<const Node*> seen;
  for (py::handle h : args) {
    PyObject* a = h.ptr();
    if (is_wrapper(h)) {
      LazyTensor& lt = lazy_of_wrapper(h);
      const NodePtr& v = lt.value();
      put(k, 'T');
      put(k, int32_t(v->dtype));
      put(k, int16_t(v->device));
      put(k, uint8_t(lt.is_view()));
      put(k, uint8_t(lt.plain()));
      put(k, int32_t(v->dims.size()));
      for (int64_t d : v->dims) put(k, d);
      int32_t same = -1;  // the first earlier tensor argument holding the same value
      for (size_t j = 0; j < seen.size(); ++j)
        if (seen[j] == v.get()) {
          same = int32_t(j);
          break;
        }
      put(k, same);
      seen.push_back(v.get());
    } else if (a == Py_None) {
      put(k, 'N');
    } else if (PyBool_Check(a)) {
      put(k, 'B');
      put(k, uint8_t(a == Py_True));
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      long long x = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (overflow) return py::none();
      put(k, 'I');
      put(k, int64_t(x));
    } else if (PyFloat_CheckExact(a)) {
      double x = PyFloat_AS_DOUBLE(a);
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      put(k, 'F');
      put(k, bits);
    } else {
      return py::none();
    }
  }
  return py::bytes(k);
}

class ForeachTemplate {
 public:
  explicit ForeachTemplate(py::tuple args) {
    for (size_t i = 0; i < args.size(); ++i)
      if (is_wrapper(args[i])) {
        inputs_.push_back(lazy_of_wrapper(args[i]).value());
        arg_of_input_.push_back(i);
      }
    seq0_ = next_seq();  // every node the handler builds has a seq above this one
  }

  bool set_result(py::handle r) {
    if (!is_wrapper(r)) return false;
    LazyTensor& lt = lazy_of_wrapper(r);
    if (lt.is_view()) return false;
    const NodePtr& v = lt.value();
    if (v->seq <= seq0_) return false;  // not a value the handler built (an input as it is)
    std::unordered_map<const Node*, Ref> refs;
    if (!visit(v, refs)) {
      steps_.clear();
      return false;
    }
    ready_ = true;
    return true;
  }

  py::object result(py::tuple args) const { return wrap(LazyTensor(build(args))); }

  bool write(py::tuple args) const {
    py::handle w = args[0];
    for (size_t i = 1; i < args.size(); ++i)
      if (shares_storage(w.ptr(), args[i].ptr())) return false;
    NodePtr v = build(args);
    lazy_of_wrapper(w).assign(std::move(v));
    return true;
  }

 private:
  enum Kind : uint8_t { kInput, kStep, kFixed };
  struct Ref {
    Kind kind;
    size_t index;  // kInput: into inputs_; kStep: into steps_
    NodePtr fixed; // kFixed: a node that existed before the handler (and is no input)
  };
  struct Step {
    NodePtr node;  // the template's node
    std::vector<Ref> operands;
  };
  static constexpr size_t kMaxSteps = 64;  // more: not a template (the handler built a big graph)

  // Post-order: steps_ holds each new node after its operands.
  bool visit(const NodePtr& n, std::unordered_map<const Node*, Ref>& refs) {
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (inputs_[i].get() == n.get()) {
        refs.emplace(n.get(), Ref{kInput, i, nullptr});
        return true;
      }
    if (n->seq <= seq0_) {
      refs.emplace(n.get(), Ref{kFixed, 0, n});
      return true;
    }
    if (n->body || steps_.size() >= kMaxSteps) return false;
    Step s{n, {}};
    for (const NodePtr& o : n->operands) {
      auto it = refs.find(o.get());
      if (it == refs.end()) {
        if (!visit(o, refs)) return false;
        it = refs.find(o.get());
      }
      s.operands.push_back(it->second);
    }
    steps_.push_back(std::move(s));
    refs.emplace(n.get(), Ref{kStep, steps_.size() - 1, nullptr});
    return true;
  }

  NodePtr build(py::tuple args) const {
    if (!ready_) throw std::logic_error("ForeachTemplate: no result set");
    std::vector<NodePtr> in;
    in.reserve(inputs_.size());
    for (size_t i : arg_of_input_) in.push_back(lazy_of_wrapper(args[i]).value());
    std::vector<NodePtr> vals(steps_.size());
    for (size_t j = 0; j < steps_.size(); ++j) {
      const Step& s = steps_[j];
      std::vector<NodePtr> ops;
      ops.reserve(s.operands.size());
      bool same = true;  // no operand differs from the template's: the template's node itself
      for (size_t o = 0; o < s.operands.size(); ++o) {
        const Ref& r = s.operands[o];
        ops.push_back(r.kind == kInput ? in[r.index] : r.kind == kStep ? vals[r.index] : r.fixed);
        same = same && ops.back().get() == s.node->operands[o].get();
      }
      vals[j] = same ? s.node : copy_node(*s.node, std::move(ops));
    }
    return vals.back();
  }

  std::vector<NodePtr> inputs_;       // the template element's tensors' values
  std::vector<size_t> arg_of_input_;  // the argument each came from
  uint64_t seq0_ = 0;
  std::vector<Step> steps_;
  bool ready_ = false;
};

}  // namespace

void bind_foreach(py::module_& m) {
  m.def("foreach_key", &foreach_key, py::arg("args"),
        "What one foreach element's per-tensor call depends on besides its tensors' values (bytes), or None.");
  py::class_<ForeachTemplate>(m, "ForeachTemplate", "One foreach element's nodes, rebuilt over other elements "
                                                    "(csrc/py/foreach.cpp)")
      .def(py::init<py::tuple>(), py::arg("args"))
      .def("set_result", &ForeachTemplate::set_result, py::arg("result"))
      .def("result", &ForeachTemplate::result, py::arg("args"))
      .def("write", &ForeachTemplate::write, py::arg("args"));
  m.def("write_result", [](py::handle written, py::handle result, py::handle args) {
          if (!is_wrapper(written) || !is_wrapper(result)) return false;
          for (py::handle a : args)
            if (shares_storage(written.ptr(), a.ptr())) return false;
          LazyTensor& w = lazy_of_wrapper(written);
          const NodePtr& r = lazy_of_wrapper(result).value();
          const NodePtr& v = w.value();
          if (r->dtype != v->dtype || r->dims != v->dims) return false;
          w.assign(r);
          return true;
        },
        py::arg("written"), py::arg("result"), py::arg("args"),
        "written (an xla tensor) takes result's value in place when result is an xla tensor of its dtype and "
        "dims and no xla tensor in args shares written's storage; False (nothing written) otherwise: the "
        "caller checks and writes (_ops.assign).");
}

}  // namespace txc

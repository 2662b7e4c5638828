// torch's foreach ops, per element without Python where it can
// (torch_xla_core/_ops/foreach.py): an optimizer's step is a few foreach
// calls over every parameter, and running the per-tensor op's handler for
// each element cost 3-13 us of Python each.
//
//   foreach_loop(args, lists, inplace, base, kwargs, write, templated)   a
//       whole foreach call, its elements in order: element j's arguments are
//       args[i][j] for i in lists, the other args as they are. Each runs the
//       per-tensor handler `base`, except, for a templated op (foreach.py's
//       _TEMPLATED), the elements after the first of their key: those get the
//       nodes that first element's handler built, rebuilt over their own
//       tensors (ForeachTemplate). An in-place write that write_result cannot
//       make (a cast, a broadcast, a shared storage) goes through
//       `write(args, r)`. Returns the result list, or None in place.
//   Inside it:
//   key_of   what one element's call depends on besides its tensors' values:
//       per argument an xla tensor's dtype, dims, device and view-ness (and
//       which earlier argument holds the same value), or a Python number's
//       type and value; none where an argument is of another kind (then the
//       element runs its handler)
//   ForeachTemplate(args)   made before an element's handler runs: notes its
//       tensors' values. set_result(r) after it: the nodes the handler built
//       for r, kept as a template (false where r is not one new value built
//       from them). result(args) / write(args) build the same nodes over
//       another element's tensors (one of the same key): its result, or
//       written into args[0] in place (false, nothing written, where an
//       argument shares args[0]'s storage). The graph gets the nodes the
//       handler would have built: the same ops, attributes and constants (a
//       number the handler made is one shared leaf instead of one per element).
//   write_result   an in-place op's write where there is nothing to cast,
//       broadcast or check
#include <pybind11/stl.h>
#include <cstring>
#include <memory>
#include <unordered_map>
#include "py/lazy.h"
#include "py/wrapper.h"

namespace txc {
namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// One element's key into k; false where an argument is of another kind (no key).
bool key_of(py::tuple args, std::string& k) {
  k.clear();
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
      if (overflow) return false;
      put(k, 'I');
      put(k, int64_t(x));
    } else if (PyFloat_CheckExact(a)) {
      double x = PyFloat_AS_DOUBLE(a);
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      put(k, 'F');
      put(k, bits);
    } else {
      return false;
    }
  }
  return true;
}

bool write_result(py::handle written, py::handle result, py::tuple args, size_t from) {
  if (!is_wrapper(written) || !is_wrapper(result)) return false;
  for (size_t i = from; i < args.size(); ++i)
    if (shares_storage(written.ptr(), args[i].ptr())) return false;
  LazyTensor& w = lazy_of_wrapper(written);
  const NodePtr& r = lazy_of_wrapper(result).value();
  const NodePtr& v = w.value();
  if (r->dtype != v->dtype || r->dims != v->dims) return false;
  w.assign(r);
  return true;
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

// A foreach call's elements in order (see the top comment): per element its
// arguments (the lists' j-th items, the other arguments as they are), its
// key, and the key's template where one is made (templated: an op of
// foreach.py's _TEMPLATED); the handler (base) runs on the first element of
// each key and where no template applies. In place, a result that
// write_result cannot write goes through `write(args, r)`.
py::object foreach_loop(py::tuple args, const std::vector<size_t>& lists, bool inplace, py::handle base,
                        py::dict kwargs, py::handle write, bool templated) {
  size_t n = lists.empty() ? 0 : py::len(args[lists[0]]);
  std::vector<char> is_list(args.size(), 0);
  std::vector<py::sequence> seqs(args.size());
  for (size_t i : lists) {
    is_list.at(i) = 1;
    seqs[i] = py::reinterpret_borrow<py::sequence>(args[i]);
  }
  std::unordered_map<std::string, std::unique_ptr<ForeachTemplate>> made;  // null: no template for that key
  py::list out;
  std::string k;
  k.reserve(64);
  for (size_t j = 0; j < n; ++j) {
    py::tuple a(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      py::object x = is_list[i] ? py::object(seqs[i][j]) : py::reinterpret_borrow<py::object>(args[i]);
      PyTuple_SET_ITEM(a.ptr(), i, x.release().ptr());
    }
    bool keyed = templated && key_of(a, k);
    ForeachTemplate* t = nullptr;
    bool known = false;
    if (keyed) {
      auto it = made.find(k);
      known = it != made.end();
      t = known ? it->second.get() : nullptr;
    }
    if (t != nullptr) {
      if (!inplace) {
        out.append(t->result(a));
        continue;
      }
      if (t->write(a)) continue;
    }
    py::object r;
    ForeachTemplate* first = nullptr;  // the template this element's handler made
    if (keyed && !known) {
      auto made_t = std::make_unique<ForeachTemplate>(a);
      r = base(*a, **kwargs);
      if (!made_t->set_result(r)) made_t.reset();
      first = made_t.get();
      made.emplace(k, std::move(made_t));
    } else {
      r = base(*a, **kwargs);
    }
    if (!inplace) {
      out.append(r);
      continue;
    }
    if (write_result(a[0], r, a, 1)) continue;
    if (first != nullptr) made[k].reset();  // a write that casts or broadcasts: each element writes through `write`
    write(a, r);
  }
  if (inplace) return py::none();
  return std::move(out);
}

}  // namespace

void bind_foreach(py::module_& m) {
  m.def("foreach_loop", &foreach_loop, py::arg("args"), py::arg("lists"), py::arg("inplace"), py::arg("base"),
        py::arg("kwargs"), py::arg("write"), py::arg("templated"),
        "A foreach call's loop over its elements (the result list; None in place); templated: elements of one "
        "key after the first are built from its template (csrc/py/foreach.cpp).");
}

}  // namespace txc

// The per-tensor loops of a replayed step (torch_xla_core/replay/), in one
// C++ pass each instead of a few Python attribute reads per tensor: a
// training step's inputs are every parameter, grad and optimizer state
// tensor (a 64-layer MLP with AdamW: ~1300), so these loops were most of a
// replay's host time.
//
//   replay_signature(tensors, xla_type, views=False) -> (bytes, -1) | (None, i)
//       the guard's tensor part: per slot None, or the value's dims and
//       dtype, requires_grad, the first slot holding the same buffer or
//       storage (aliasing among inputs), and for a view that shares its
//       storage (views=True: any view) its view ops, storage dims, strides
//       and offset (from its view chain, LazyTensor::layout, where each op
//       has a strides rule; torch's otherwise). (None, i) when tensors[i] is
//       not an xla tensor.
//   replay_ready(tensors, views=False) -> bool   every input is device data
//       (or an alias of a whole storage that is; views=True: any view of a
//       storage that is): nothing to compute before binding
//   replay_unready(items, xla_type, views=False) -> [int]   the positions of the xla tensors among items
//       (other objects skipped) that replay_ready would refuse: what a dynamo graph's call looks at in
//       Python (its pending inputs), instead of a Python pass over all its inputs
//   replay_views(items, xla_type, slots) -> [int]   the slots whose item is an xla tensor holding a view
//   replay_exclusive(tensors, slots) -> int   the first slot whose buffer is
//       held elsewhere (may not be donated), or -1
//   ReplayPlan(binds, inplace, others, specs, ret=[], donated_grads=[])   a recording's bindings and
//       writes, converted once: .params(tensors, rng) the executable's
//       arguments; .returned(tensors, outs) the tensors the step returns; .release(tensors, kinds, grad_refs) before the launch, the last step's grads
//       that this one replaces let their buffers go, or hand over those the step's executable takes donated
//       (donated_grads: their slots) (.unrelease(tensors, kinds, owners) if the
//       launch fails); .write(tensors, outs) the in-place writes; .set(tensors, kinds, owners,
//       keys, outs) the outputs that are new tensors (a grad after zero_grad) put at their
//       locations, or held by the last step's grad tensor where nothing could tell
//   (the walk of modules and optimizer state that finds the inputs: py/replay_walk.cpp)
#include <pybind11/stl.h>
#include <algorithm>
#include <optional>
#include <unordered_map>
#include "ops/registry.h"
#include "py/data.h"
#include "py/lazy.h"
#include "py/replay_walk.h"
#include "py/wrapper.h"

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

// --- prefetching ---------------------------------------------------------------
//
// A replay's passes follow each input tensor's chain of objects: the
// XlaTensor, its `_lt` object holding the LazyTensor, the Storage, the value
// node, its payload and the buffer. The device step between the launch and
// the write evicts them from the caches (on a GPU host the launch alone runs
// ~10 ms of PJRT work), and then every link is a cache miss that waits on the
// one before it: measured in a 64-layer MLP step, the write pass took 2.5 ms
// cold against 0.15 ms warm. warm() loads the chains a level at a time over
// all the tensors, prefetching one level of every tensor before reading the
// next, so that the misses of different tensors overlap.
//
// The tensors warmed: tensors[i] for each i in `slots` (all when empty).

inline void prefetch(const void* p) {
  if (p) __builtin_prefetch(p);
}

void warm(py::list tensors, const std::vector<int64_t>& slots) {
  size_t n = slots.empty() ? tensors.size() : slots.size();
  PyObject** items = reinterpret_cast<PyListObject*>(tensors.ptr())->ob_item;
  size_t count = size_t(PyList_GET_SIZE(tensors.ptr()));
  std::vector<void*> at(n);  // per tensor, the object of the level being loaded
  for (size_t j = 0; j < n; ++j) {  // the XlaTensors
    size_t i = slots.empty() ? j : size_t(slots[j]);
    at[j] = i < count ? items[i] : nullptr;
    prefetch(at[j]);
  }
  for (auto& p : at) {  // their `_lt` objects (the LazyTensor inline)
    PyObject* lt = p ? lazy_slot_unchecked(static_cast<PyObject*>(p)) : nullptr;
    p = lt && is_lazy(lt) ? lt : nullptr;
    prefetch(p);
  }
  for (auto& p : at) {  // the storages (and their shared counts, before them)
    p = p ? lazy_ref(static_cast<PyObject*>(p)).storage().get() : nullptr;
    if (p) prefetch(static_cast<char*>(p) - 16);
    prefetch(p);
  }
  for (auto& p : at) {  // the value nodes (their shared counts, the line holding the payload)
    Node* v = p ? static_cast<Storage*>(p)->value.get() : nullptr;
    p = v;
    if (v) {
      prefetch(reinterpret_cast<char*>(v) - 16);
      prefetch(&v->data);
    }
  }
  for (auto& p : at) {  // the payloads and dims
    Node* v = static_cast<Node*>(p);
    p = v ? const_cast<LeafData*>(v->data.get()) : nullptr;
    if (v) prefetch(v->dims.data());
    prefetch(p);
  }
  for (void* p : at) {  // the buffers (a jax Array spans a few lines)
    auto* d = p ? dynamic_cast<PyData*>(static_cast<LeafData*>(p)) : nullptr;
    if (d)
      for (int line = 0; line < 4; ++line) prefetch(reinterpret_cast<char*>(d->buffer.ptr()) + 64 * line);
  }
}

// lt's storage now holds `buf` (an executable's output of lt's dtype and
// dims, on device 0) by changing the buffer of its data node in place, where
// that node is lt's alone: lt is no view, no other tensor or view shares its
// storage, no graph or tensor refers to the node or its payload (so nobody
// can tell a new node from this one). A replay writes ~1000 outputs per
// step; this spares a node and its payload made and freed per output.
// False where that does not hold: the caller makes a new node instead.
bool swap_buffer(LazyTensor& lt, PyObject* buf, DType dtype, const Dims& dims) {
  if (lt.is_view() || lt.storage().use_count() != 1) return false;
  const NodePtr& v = lt.storage()->value;
  if (v.use_count() != 1 || !is_data(v) || v->data.use_count() != 1 || v->dtype != dtype || v->dims != dims ||
      v->device != 0 || v->memory != 0)
    return false;
  auto* d = dynamic_cast<const PyData*>(v->data.get());
  if (!d) return false;
  // (make_py_data makes its payload non-const: writing it through this cast is defined)
  const_cast<PyData*>(d)->buffer = py::reinterpret_borrow<py::object>(buf);
  return true;
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

// The first slot holding each key (a buffer or storage): open addressing,
// sized once, where a std::unordered_map allocated a node per tensor.
class FirstSlot {
 public:
  explicit FirstSlot(size_t n) {
    size_t cap = 16;
    for (shift_ = 60; cap < 2 * n; cap <<= 1) --shift_;
    slots_.assign(cap, {nullptr, -1});
  }
  // The first slot seen with key k; i (recorded) when k is new.
  int64_t first(const void* k, int64_t i) {
    size_t mask = slots_.size() - 1;
    for (size_t h = size_t((uint64_t(reinterpret_cast<uintptr_t>(k)) * 0x9E3779B97F4A7C15ull) >> shift_);;
         h = (h + 1) & mask) {
      auto& e = slots_[h];
      if (e.second < 0) {
        e = {k, i};
        return i;
      }
      if (e.first == k) return e.second;
    }
  }

 private:
  std::vector<std::pair<const void*, int64_t>> slots_;
  int shift_;
};

py::tuple signature(py::list tensors, py::handle xla_type, bool views) {
  static PyObject* requires_grad = PyUnicode_InternFromString("requires_grad");
  std::string sig;
  sig.reserve(tensors.size() * 48);
  warm(tensors, {});
  FirstSlot first(tensors.size());
  int64_t i = 0;
  for (py::handle t : tensors) {
    if (t.is_none()) {
      put(sig, -1);
      ++i;
      continue;
    }
    int ok = is_wrapper(t) || PyObject_IsInstance(t.ptr(), xla_type.ptr());
    if (ok < 0) throw py::error_already_set();
    if (!ok) return py::make_tuple(py::none(), i);
    LazyTensor& lt = lazy_of_wrapper(t);
    const NodePtr& v = lt.value();
    const void* key;
    bool view_entry = false;
    std::vector<int64_t> ops;
    if (is_data(v)) {
      key = py_data_raw(*v);  // (identity: a placeholder is not resolved)
    } else if (lt.is_view()) {
      // a lone view gets a storage of its own before binding (replay/_recording.py own_storage), unless views are read
      // through their chains (a dynamo graph's inputs: the forward's saved views of its outputs)
      bool lone = !views && lt.storage().use_count() == 1 && py::cast<bool>(t.attr("is_contiguous")());
      const NodePtr& root = lt.storage()->value;
      key = is_data(root) ? static_cast<const void*>(py_data_raw(*root)) : static_cast<const void*>(lt.storage().get());
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
    put(sig, first.first(key, i));
    if (view_entry) {
      const NodePtr& root = lt.storage()->value;
      put(sig, int64_t(ops.size()));
      for (auto it = ops.rbegin(); it != ops.rend(); ++it) put(sig, *it);
      put_dims(sig, root->dims);
      // its layout from its chain (what the replayed graph reads) where every view op has a strides rule,
      // else torch's: two Python calls per view cost ~1 ms of a dynamo step's ~210 saved views
      Dims strides;
      int64_t offset;
      if (lt.layout(strides, offset)) {
        put_dims(sig, strides);
        put(sig, offset);
      } else {
        put(sig, -2);
        put_ints(sig, t.attr("stride")());
        put(sig, t.attr("storage_offset")().cast<int64_t>());
      }
    } else {
      put(sig, -1);
    }
    ++i;
  }
  return py::make_tuple(py::bytes(sig), -1);
}

bool ready_one(LazyTensor& lt, bool views) {
  if (is_data(lt.value())) return true;
  return lt.is_view() && (views || alias_only(lt)) && is_data(lt.storage()->value);
}

bool ready(py::list tensors, bool views) {
  for (py::handle t : tensors)
    if (!t.is_none() && !ready_one(lazy_of_wrapper(t), views)) return false;
  return true;
}

std::vector<int64_t> unready(py::list items, py::handle xla_type, bool views) {
  std::vector<int64_t> out;
  int64_t i = 0;
  for (py::handle t : items) {
    if (Py_TYPE(t.ptr()) == (PyTypeObject*)xla_type.ptr() && !ready_one(lazy_of_wrapper(t), views)) out.push_back(i);
    ++i;
  }
  return out;
}

std::vector<int64_t> views_among(py::list items, py::handle xla_type, const std::vector<int64_t>& slots) {
  std::vector<int64_t> out;
  for (int64_t i : slots) {
    if (i < 0 || i >= int64_t(items.size())) throw std::out_of_range("replay_views: slot " + std::to_string(i));
    py::handle t = PyList_GET_ITEM(items.ptr(), i);
    if (Py_TYPE(t.ptr()) == (PyTypeObject*)xla_type.ptr() && lazy_of_wrapper(t).is_view()) out.push_back(i);
  }
  return out;
}

// The first of `slots` whose tensor's buffer someone else holds (-1: none),
// not counting one reference per item of `held` (the parameters of a pending
// launch that the replay's own launch will run fused with: _execution/pending.py).
int64_t first_shared(py::list tensors, const std::vector<int64_t>& slots, py::list held) {
  for (int64_t i : slots) {
    LazyTensor& lt = lazy_of_wrapper(tensors[size_t(i)]);
    if (data_exclusive(lt)) continue;
    if (held.empty() || lt.is_view() || lt.storage()->value.use_count() != 1) return i;
    PyObject* b = py_data_raw(*lt.storage()->value);
    Py_ssize_t refs = 1;
    for (py::handle h : held) refs += h.ptr() == b;
    if (!b || Py_REFCNT(b) != refs) return i;
  }
  return -1;
}

// --- a recording's plan: what a replay binds and writes -----------------------

// The parts of a recording that a replay walks per tensor, converted once
// from a recording's lists (replay/_session.py, _compiled.py) into C++ vectors:
//   binds: (kind, v) per executable parameter: ("slot", i) the buffer of
//     tensors[i]; ("const", buffer); ("rng", None) the RNG state's buffer;
//     ("out", k) output k of the step's earlier segments (a step cut by a
//     host read runs as several executables: replay/_session.py)
//   inplace: (i, k): tensors[i] now holds output k
//   others: (i, k, mode): slot i gets a new tensor holding output k (mode
//     "new": a grad after zero_grad(set_to_none)) or None, at the slot's
//     location (see set)
//   specs[k] = (dtype, dims) of output k
//   ret: per tensor the step returns (replay/_compiled.py _capture): ("out",
//     k) output k; ("slot", i) the input tensors[i] itself; ("host", t) a
//     clone of CPU tensor t; ("view_out", k, template) / ("view_slot", i,
//     template) template's view chain on output k / on tensors[i]'s storage
class ReplayPlan {
 public:
  ReplayPlan(py::list binds, const std::vector<std::pair<int64_t, int64_t>>& inplace, py::list others,
             py::list specs, py::list ret, const std::vector<int64_t>& donated_grads) {
    for (py::handle b : binds) {
      py::tuple kv = py::reinterpret_borrow<py::tuple>(b);
      std::string kind = kv[0].cast<std::string>();
      if (kind == "slot") binds_.push_back({kSlot, kv[1].cast<int64_t>(), py::object()});
      else if (kind == "const") binds_.push_back({kConst, -1, py::reinterpret_borrow<py::object>(kv[1])});
      else if (kind == "rng") binds_.push_back({kRng, -1, py::object()});
      else if (kind == "out") binds_.push_back({kOut, kv[1].cast<int64_t>(), py::object()});
      else throw std::invalid_argument("replay: unknown parameter binding " + kind);
    }
    auto spec = [&](int64_t k, DType& t, Dims& d) {
      py::tuple sp = specs[size_t(k)];
      t = DType(sp[0].cast<int>());
      d = sp[1].cast<Dims>();
    };
    for (auto [i, k] : inplace) {
      Out o{i, k, true};
      spec(k, o.dtype, o.dims);
      inplace_.push_back(std::move(o));
    }
    for (py::handle h : others) {
      py::tuple ikm = py::reinterpret_borrow<py::tuple>(h);
      Out o{ikm[0].cast<int64_t>(), -1, ikm[2].cast<std::string>() == "new"};
      if (o.fresh) {
        o.k = ikm[1].cast<int64_t>();
        spec(o.k, o.dtype, o.dims);
      }
      others_.push_back(std::move(o));
    }
    for (Out& o : others_) o.donate = std::find(donated_grads.begin(), donated_grads.end(), o.i) != donated_grads.end();
    for (const Out& o : inplace_) inplace_slots_.push_back(o.i);
    for (const Out& o : others_) others_slots_.push_back(o.i);
    std::unordered_map<int64_t, int64_t> of_out;  // output k -> its entry in made_ (one per output returned)
    std::unordered_map<int64_t, int64_t> inplace_of;  // output k -> the input slot written with it
    for (auto [i, k] : inplace) inplace_of[k] = i;
    for (py::handle h : ret) {
      py::tuple r = py::reinterpret_borrow<py::tuple>(h);
      std::string kind = r[0].cast<std::string>();
      Ret e;
      if (kind == "slot" || kind == "view_slot") {
        e.kind = kind == "slot" ? Ret::kSlot : Ret::kViewSlot;
        e.v = r[1].cast<int64_t>();
      } else if (kind == "out" || kind == "view_out") {
        e.kind = kind == "out" ? Ret::kOut : Ret::kViewOut;
        int64_t k = r[1].cast<int64_t>();
        auto [it, fresh] = of_out.try_emplace(k, int64_t(made_.size()));
        if (fresh) {
          Made m{k, -1};
          auto in = inplace_of.find(k);
          if (in != inplace_of.end()) m.slot = in->second;
          else spec(k, m.dtype, m.dims);
          made_.push_back(std::move(m));
        }
        e.v = it->second;
      } else if (kind == "host") {
        e.kind = Ret::kHost;
        e.host = py::reinterpret_borrow<py::object>(r[1]);
      } else {
        throw std::invalid_argument("replay: unknown returned value " + kind);
      }
      if (e.kind == Ret::kViewSlot || e.kind == Ret::kViewOut) e.chain = lazy_arg(r[2]).alias();
      ret_.push_back(std::move(e));
    }
  }

  // The tensors the step returns, in ret's order, made from this call's inputs
  // and outputs: one output returned twice, or returned and viewed, is one
  // storage (as in the recorded call); an output written into an input is
  // that input's storage.
  py::list returned(py::list tensors, py::list outs) const {
    static PyObject* clone = str("clone");
    std::vector<std::optional<LazyTensor>> made(made_.size());
    auto out_lt = [&](int64_t j) -> LazyTensor& {
      std::optional<LazyTensor>& lt = made[size_t(j)];
      if (!lt) {
        const Made& m = made_[size_t(j)];
        if (m.slot >= 0) {
          lt = lazy_of_wrapper(tensors[size_t(m.slot)]).alias();
        } else {
          if (m.k >= PyList_GET_SIZE(outs.ptr()))
            throw std::runtime_error("replay: returned output " + std::to_string(m.k) + " is missing");
          py::object buf = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(outs.ptr(), m.k));
          lt = LazyTensor(make_py_data(std::move(buf), m.dtype, m.dims, 0));
        }
      }
      return *lt;
    };
    py::list leaves(ret_.size());
    size_t j = 0;
    for (const Ret& e : ret_) {
      py::object t;
      if (e.kind == Ret::kOut) {
        t = wrap(out_lt(e.v).alias());
      } else if (e.kind == Ret::kSlot) {
        t = tensors[size_t(e.v)];
      } else if (e.kind == Ret::kHost) {
        t = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(e.host.ptr(), clone));
        if (!t) throw py::error_already_set();
      } else {  // a view: its chain on the new value (the chain is from its root)
        LazyTensor& base = e.kind == Ret::kViewOut ? out_lt(e.v) : lazy_of_wrapper(tensors[size_t(e.v)]);
        LazyTensor root = base.is_view() ? base.root() : base.alias();
        t = wrap(rebase(*e.chain, root));
      }
      PyList_SET_ITEM(leaves.ptr(), j++, t.release().ptr());
    }
    return leaves;
  }

  // The executable's arguments (outs: the outputs of the step's earlier segments).
  py::list params(py::list tensors, py::handle rng, py::list outs) const {
    py::list out(binds_.size());
    size_t j = 0;
    for (const Bind& b : binds_) {
      PyObject* p;
      if (b.kind == kSlot) {
        p = root_buffer(lazy_of_wrapper(tensors[size_t(b.slot)]));
        if (!p) throw std::runtime_error("replay: input slot " + std::to_string(b.slot) + " holds no device data");
      } else if (b.kind == kOut) {
        if (b.slot >= PyList_GET_SIZE(outs.ptr()))
          throw std::runtime_error("replay: output " + std::to_string(b.slot) + " of an earlier segment is missing");
        p = PyList_GET_ITEM(outs.ptr(), b.slot);
      } else {
        p = b.kind == kConst ? b.buffer.ptr() : rng.ptr();
      }
      Py_INCREF(p);
      PyList_SET_ITEM(out.ptr(), j++, p);
    }
    return out;
  }

  // The in-place writes: each tensor's LazyTensor now holds its output.
  void write(py::list tensors, py::sequence outs) const {
    warm(tensors, inplace_slots_);
    for (const Out& o : inplace_) {
      LazyTensor& lt = lazy_of_wrapper(tensors[size_t(o.i)]);
      py::object out = outs[size_t(o.k)];
      if (!swap_buffer(lt, out.ptr(), o.dtype, o.dims)) lt.assign(make_py_data(out, o.dtype, o.dims, 0));
    }
  }

  // Before the launch: each grad that the last step left and that this step
  // replaces (zero_grad set it to None in the recorded call) lets its buffer
  // go, as zero_grad would have freed it before the backward, so that the
  // step does not hold two sets of grads at its peak. Where nothing could
  // tell it from a new tensor (reusable_grad; grad_refs is the reference
  // count that means nobody else holds it, or 0), the tensor itself is kept
  // to take the new grad (set), holding a placeholder meanwhile; a held grad
  // keeps its value, as it would in a traced step.
  // Returns the old buffers of the grads in donated_grads (in others' order),
  // which the step's donating executable takes as unread parameters aliased
  // to their new grads (nothing freed, nothing allocated), when each of them
  // can be donated: its tensor is kept as above and nothing else holds its
  // buffer (data_exclusive). Else None, and those buffers go here too.
  py::object release(py::list tensors, py::list kinds, Py_ssize_t grad_refs) const {
    warm(tensors, others_slots_);
    py::list given;
    bool all = true;
    for (const Out& o : others_) {
      if (!new_grad(o, kinds)) continue;
      PyObject* old = PyList_GET_ITEM(tensors.ptr(), size_t(o.i));
      bool reuse = reusable_grad(old, o, grad_refs);
      if (o.donate && all) {
        if (reuse && data_exclusive(lazy_of_wrapper(old)))
          given.append(py::handle(buffer_of(lazy_of_wrapper(old).value())));
        else all = false;
      }
      if (reuse && !swap_buffer(lazy_of_wrapper(old), Py_None, o.dtype, o.dims))
        set_lazy(old, LazyTensor(make_py_data(py::none(), o.dtype, o.dims, 0)));
    }
    if (!all) return py::none();
    return std::move(given);
  }

  // The launch failed: the grads that release() emptied become None (as after
  // zero_grad), none is left holding a placeholder.
  void unrelease(py::list tensors, py::list kinds, py::list owners) const {
    static PyObject* grad = str("grad");
    for (const Out& o : others_) {
      size_t i = size_t(o.i);
      if (new_grad(o, kinds) && released(PyList_GET_ITEM(tensors.ptr(), i)) &&
          PyObject_SetAttr(PyList_GET_ITEM(owners.ptr(), i), grad, Py_None) < 0)
        throw py::error_already_set();
    }
  }

  // The other outputs: new tensors (or None) put at their locations (the
  // walk's kinds / owners / keys): a grad owner.grad, a buffer
  // owner._buffers[key], optimizer state or group owner[key]. A grad tensor
  // that release() kept takes its new value instead.
  void set(py::list tensors, py::list kinds, py::list owners, py::list keys, py::sequence outs) const {
    static PyObject *grad = str("grad"), *buffers = str("_buffers");
    for (const Out& o : others_) {
      size_t i = size_t(o.i);
      int kind = kinds[i].cast<int>();
      PyObject* old = PyList_GET_ITEM(tensors.ptr(), i);
      if (new_grad(o, kinds) && released(old)) {
        py::object out = outs[size_t(o.k)];
        if (!swap_buffer(lazy_of_wrapper(old), out.ptr(), o.dtype, o.dims))
          set_lazy(old, LazyTensor(make_py_data(out, o.dtype, o.dims, 0)));
        continue;
      }
      py::object t = o.fresh ? wrap(LazyTensor(make_py_data(outs[size_t(o.k)], o.dtype, o.dims, 0))) : py::none();
      PyObject *owner = PyList_GET_ITEM(owners.ptr(), i), *key = PyList_GET_ITEM(keys.ptr(), i);
      int rc;
      if (kind == kGrad) {
        rc = PyObject_SetAttr(owner, grad, t.ptr());
      } else if (kind == kBuffer) {
        py::object bs = py::reinterpret_steal<py::object>(PyObject_GetAttr(owner, buffers));
        if (!bs) throw py::error_already_set();
        rc = PyObject_SetItem(bs.ptr(), key, t.ptr());
      } else if (kind == kState || kind == kGroup) {
        rc = PyObject_SetItem(owner, key, t.ptr());
      } else {  // parameters and arguments are only written in place
        throw std::logic_error("replay: output written to an input slot of kind " + std::to_string(kind));
      }
      if (rc < 0) throw py::error_already_set();
    }
  }

 private:
  struct Out;
  // Output o is a new grad (a grad slot's new tensor after zero_grad).
  static bool new_grad(const Out& o, py::list kinds) { return o.fresh && kinds[size_t(o.i)].cast<int>() == kGrad; }
  // A grad tensor that release() emptied: its value a data node without a buffer.
  static bool released(PyObject* t) {
    if (t == Py_None || !is_wrapper(t)) return false;
    const NodePtr& v = lazy_of_wrapper(t).value();
    return is_data(v) && py_data_raw(*v) == Py_None;
  }
  // Whether the grad tensor `old` that the last step left can hold this
  // step's grad (output o) in place of a new tensor, because nothing could
  // tell the two apart: nobody but its parameter and the walk references it
  // (Py_REFCNT == refs), it has no weak references and no attributes, and it
  // is a contiguous non-view xla tensor of o's dtype and dims that does not
  // require grad. Making a tensor and freeing the old one costs ~10 µs
  // (torch's wrapper subclass), most of a replay's per-grad time.
  static bool reusable_grad(PyObject* old, const Out& o, Py_ssize_t refs) {
    static PyObject *requires_grad = str("requires_grad"), *is_contiguous = str("is_contiguous");
    if (refs <= 0 || old == Py_None || Py_REFCNT(old) != refs || !is_wrapper(old)) return false;
    PyTypeObject* tp = Py_TYPE(old);
    if (tp->tp_weaklistoffset > 0 &&
        *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(old) + tp->tp_weaklistoffset))
      return false;
    LazyTensor& lt = lazy_of_wrapper(old);
    if (lt.is_view() || !lt.plain() || lt.value()->dtype != o.dtype || lt.value()->dims != o.dims) return false;
    py::object d = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(old, nullptr));
    if (!d) throw py::error_already_set();
    if (PyDict_GET_SIZE(d.ptr())) return false;
    py::object rg = py::reinterpret_steal<py::object>(PyObject_GetAttr(old, requires_grad));
    if (!rg) throw py::error_already_set();
    if (rg.ptr() != Py_False) return false;
    py::object c = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(old, is_contiguous));
    if (!c) throw py::error_already_set();
    return c.ptr() == Py_True;
  }
  enum Kind { kSlot, kConst, kRng, kOut };
  struct Bind {
    Kind kind;
    int64_t slot;
    py::object buffer;
  };
  struct Out {
    int64_t i, k;
    bool fresh;  // others_: a new tensor holding output k (else None); always true in inplace_
    bool donate = false;  // others_: a grad whose old buffer the donating executable takes (release)
    DType dtype = DType::F32;
    Dims dims;
  };
  struct Made {  // an output that a returned tensor or view holds
    int64_t k;     // the output
    int64_t slot;  // the input slot written with it (its tensor's storage holds it), or -1: a new storage
    DType dtype = DType::F32;
    Dims dims;
  };
  struct Ret {
    enum Kind { kOut, kSlot, kHost, kViewOut, kViewSlot } kind;
    int64_t v = -1;                   // kOut/kViewOut: the entry in made_; kSlot/kViewSlot: the input slot
    py::object host;                  // kHost: the CPU tensor cloned per call
    mutable std::optional<LazyTensor> chain;  // views: the view chain, on a shape-only placeholder of its root
  };
  std::vector<Bind> binds_;
  std::vector<Made> made_;
  std::vector<Ret> ret_;
  std::vector<Out> inplace_, others_;
  std::vector<int64_t> inplace_slots_, others_slots_;  // their tensors' slots (warm())
};

}  // namespace

void bind_replay(py::module_& m) {
  m.def("replay_signature", &signature, py::arg("tensors"), py::arg("xla_type"), py::arg("views") = false);
  m.def("replay_ready", &ready, py::arg("tensors"), py::arg("views") = false);
  m.def("replay_unready", &unready, py::arg("items"), py::arg("xla_type"), py::arg("views") = false);
  m.def("replay_views", &views_among, py::arg("items"), py::arg("xla_type"), py::arg("slots"));
  m.def("replay_exclusive", &first_shared, py::arg("tensors"), py::arg("slots"), py::arg("held") = py::list());
  py::class_<ReplayPlan>(m, "ReplayPlan", "What a replay binds and writes (csrc/py/replay.cpp)")
      .def(py::init<py::list, const std::vector<std::pair<int64_t, int64_t>>&, py::list, py::list, py::list,
                    const std::vector<int64_t>&>(),
           py::arg("binds"), py::arg("inplace"), py::arg("others"), py::arg("specs"), py::arg("ret") = py::list(),
           py::arg("donated_grads") = std::vector<int64_t>{})
      .def("returned", &ReplayPlan::returned, py::arg("tensors"), py::arg("outs"))
      .def("params", &ReplayPlan::params, py::arg("tensors"), py::arg("rng"), py::arg("outs") = py::list())
      .def("write", &ReplayPlan::write, py::arg("tensors"), py::arg("outs"))
      .def("release", &ReplayPlan::release, py::arg("tensors"), py::arg("kinds"), py::arg("grad_refs"))
      .def("unrelease", &ReplayPlan::unrelease, py::arg("tensors"), py::arg("kinds"), py::arg("owners"))
      .def("set", &ReplayPlan::set, py::arg("tensors"), py::arg("kinds"), py::arg("owners"), py::arg("keys"),
           py::arg("outs"));
  bind_replay_walk(m);  // py/replay_walk.cpp
}

}  // namespace txc

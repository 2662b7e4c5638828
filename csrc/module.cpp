// pybind11 bindings of the core: torch_xla_core._C. Python passes core op ids
// (from op_ids()), operands (LazyTensors, Python numbers, or (number, dtype)
// pairs for 0-d host tensors) and attributes (ints, floats, strings, int
// lists); everything about shapes, dtypes, hashing and lowering happens here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "build_info.h"
#include "lower/emitter.h"
#include "ops/registry.h"
#include "trace/tensor.h"
#include "py/lazy.h"
#include "py/data.h"
#include "py/mapping.h"
#include "py/wrapper.h"

namespace py = pybind11;

namespace txc {
void bind_dispatch(py::module_& m);              // py/dispatch.cpp: the C++ __torch_dispatch__
namespace ext { void bind_ext_api(py::module_& m); }  // ext/api.cpp: C++ API for extensions
void bind_graph(py::module_& m);                // py/graph.cpp: GraphCut, the executor's view of a cut
void bind_scan(py::module_& m);                 // py/scan.cpp: scan loops' bodies
void bind_replay(py::module_& m);               // py/replay.cpp: replay's per-tensor loops
void bind_foreach(py::module_& m);              // py/foreach.cpp: foreach ops' per-element nodes

}  // namespace txc

PYBIND11_MODULE(_C, m) {
  using namespace txc;
  m.doc() = "torch_xla_core's C++ lazy-tensor core";
  bind_build_info(m);
  // A dtype an op has no kernel for (ops/registry.h): NotImplementedError, as torch's kernels raise.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const DtypeNotImplemented& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  ext::bind_ext_api(m);

  m.def("op_ids", [] {
    py::dict d;
    const auto& ops = all_ops();
    for (size_t i = 0; i < ops.size(); ++i) d[py::str(ops[i].name)] = i;
    return d;
  });

  bind_lazy(m);
  bind_wrapper(m);
  bind_dispatch(m);
  bind_mapping(m);
  m.def("from_data", [](py::object data, int dtype, const Dims& dims, int device) {
          return LazyTensor(make_py_data(std::move(data), DType(dtype), dims, int16_t(device)));
        },
        py::arg("data"), py::arg("dtype"), py::arg("dims"), py::arg("device") = 0,
        "A LazyTensor holding device data (a runtime buffer object) on xla device `device` (-1: any).");
  m.def("set_pending",
        [](py::object type, py::object resolver) {
          if (!PyType_Check(type.ptr())) throw py::type_error("set_pending: a type");
          pending_type = reinterpret_cast<PyTypeObject*>(type.release().ptr());  // (kept for the process)
          pending_resolver = resolver.release().ptr();
        },
        py::arg("type"), py::arg("resolver"),
        "Registers the placeholder buffers of pending launches (py/data.h): a data leaf holding an object of "
        "`type` is read as resolver(placeholder).");
  m.def("place_on", [](LazyTensor& t, int device) {
          // a copy of the storage's value with the device (same hash); a view
          // rebuilds its chain on it
          Storage& st = *t.storage();
          if (st.value->device >= 0 && st.value->device != device)
            throw std::runtime_error("place_on: the value is on xla:" + std::to_string(st.value->device));
          st.value = placed_on(st.value, int16_t(device));
          if (t.is_view()) {
            ++st.version;
            t.value();
          }
        },
        "Puts a fresh value made without a device (a factory's) on xla device `device`.");
  m.def("pending_devices", [] {
          static const uint16_t data = op_id("data");
          std::vector<int> r;
          for (Storage* s = live_storages_head(); s; s = s->next)
            if (s->value->op != data && !is_error(*s->value)) {
              int d = std::max<int>(s->value->device, 0);
              if (std::find(r.begin(), r.end(), d) == r.end()) r.push_back(d);
            }
          std::sort(r.begin(), r.end());
          return r;
        },
        "The devices (a value without one counts as 0) of the live storages a sync would compute.");
  m.def("live_count", &live_storage_count, "Number of live storages.");

  bind_graph(m);
  bind_scan(m);
  bind_replay(m);
  bind_foreach(m);
}

// torch_xla_core._C.GraphCut: the Python face of a graph cut (trace/graph.h).
// The executor (torch_xla_core/_execution/executor.py) reads a cut's parameters as
// runtime buffer objects and (number, dtype code) pairs, hands its outputs
// back as runtime buffers, and describes failing nodes as dicts; the
// conversions live here, so the cut itself is plain C++.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "ir/memory.h"
#include "ir/op.h"
#include "py/data.h"
#include "py/lazy.h"
#include "trace/graph.h"

namespace txc {

namespace {

// Node k: {"op", "origin" (aten overload or ""), "dtype", "shape", "bytes"}.
py::dict node_info(const GraphCut& c, int k) {
  const Node& n = c.node(k);
  py::dict d;
  d["op"] = op_def(n.op).name;
  d["origin"] = origin_name(n.origin);
  d["dtype"] = dtype_name(n.dtype);
  d["shape"] = py::cast(n.dims);
  d["bytes"] = GraphCut::bytes(n);
  return d;
}

py::tuple kinds(const std::vector<std::pair<int, int>>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::make_tuple(v[i].first, memory_kind_name(v[i].second));
  return t;
}

}  // namespace

void bind_graph(py::module_& m) {
  m.attr("ANY_DEVICE") = int(kAnyDevice);
  m.attr("ALL_DEVICES") = kAllDevices;
  py::class_<GraphCut>(m, "GraphCut")
      .def(py::init([](py::object tensors, int device) {
             if (tensors.is_none()) return GraphCut({}, true, device);
             std::vector<std::shared_ptr<Storage>> roots;
             for (auto h : tensors) roots.push_back(lazy_arg(h).storage());
             return GraphCut(std::move(roots), false, device);
           }),
           py::arg("tensors") = py::none(), py::arg("device") = kAllDevices,
           "Cuts the pending graph of `tensors` (default: every live tensor); with device >= 0, only the "
           "values on that device (a value without one counts as 0).")
      .def_property_readonly("device", &GraphCut::device)
      .def("param_devices", &GraphCut::param_devices)
      .def("annotations",
           [](const GraphCut& c) {
             py::list r;
             for (const Node* n : c.annotations())
               r.append(py::make_tuple(n->attr_str(0), n->attr_dims(1), n->attr_dims(2), n->attr_str(3)));
             return r;
           },
           "The SPMD sharding annotations, scan bodies included: (hlo sharding, mesh device ids, mesh shape, "
           "axis names) each.")
      .def("collectives",
           [](const GraphCut& c) {
             std::vector<uint16_t> ops;
             for (size_t op = 0; op < all_ops().size(); ++op)
               if (all_ops()[op].ordered) ops.push_back(uint16_t(op));
             return c.nodes_of(ops).size();
           },
           "How many collectives across replicas (ops/collective.cpp) the cut holds, scan bodies included.")
      .def_property_readonly("hash", &GraphCut::hash)
      .def_property_readonly("num_outputs", &GraphCut::num_outputs)
      .def_property_readonly("num_nodes", &GraphCut::num_nodes)
      .def("lower",
           [](const GraphCut& c, const std::string& precision, const std::vector<std::pair<int, int>>& aliases,
              int num_partitions, const std::vector<std::string>& param_shardings, int num_replicas,
              const std::vector<int>& unread) {
             return c.lower(LowerOptions{precision, aliases, num_partitions, param_shardings, num_replicas, unread});
           },
           py::arg("precision") = "highest", py::arg("aliases") = std::vector<std::pair<int, int>>{},
           py::arg("num_partitions") = 1, py::arg("param_shardings") = std::vector<std::string>{},
           py::arg("num_replicas") = 1, py::arg("unread") = std::vector<int>{},
           "StableHLO text of the cut: matmul precision (torch's name), donated (parameter, output) pairs, "
           "for SPMD the partition count and each parameter's mhlo.sharding (torch_xla_core/_execution/spmd.py), for "
           "collectives across processes the replica count, and the outputs that an extra parameter read by "
           "nothing is donated to (appended after the cut's parameters: a replay's old grads).")
      .def("text", &GraphCut::text, "The graph, one node per line, for people.")
      .def("donations", &GraphCut::donations)
      .def("params",
           [](const GraphCut& c) {
             static const uint16_t data = op_id("data");
             py::list l;
             for (const Node* p : c.params()) {
               if (p->op == data) {
                 l.append(py_data(*p));
               } else if (is_complex(p->dtype)) {
                 l.append(py::make_tuple(
                     py::reinterpret_steal<py::object>(PyComplex_FromDoubles(p->scalar, p->scalar_imag)),
                     int(p->dtype)));
               } else if (is_floating(p->dtype)) {
                 l.append(py::make_tuple(p->scalar, int(p->dtype)));
               } else {
                 l.append(py::make_tuple(int64_t(p->scalar), int(p->dtype)));
               }
             }
             return l;
           },
           "Parameters in order: a device buffer object, or (number, dtype code) for a Python number (one per "
           "distinct number: equal ones share it).")
      .def("output_specs",
           [](const GraphCut& c) {
             py::list l;
             for (const auto& o : c.outputs()) l.append(py::make_tuple(int(o->dtype), py::tuple(py::cast(o->dims))));
             return l;
           },
           "Each output's dtype code and dims, for the runtime.")
      .def("memory_kinds",
           [](const GraphCut& c) -> py::tuple {
             auto ins = c.param_memory_kinds(), outs = c.output_memory_kinds();
             if (ins.empty() && outs.empty()) return py::tuple();
             return py::make_tuple(kinds(ins), kinds(outs));
           },
           "The parameters and outputs that live outside device memory, as ((param index, kind), ...), "
           "((output index, kind), ...); () when all are on the device. Part of the executor's cache key.")
      .def("assign",
           [](GraphCut& c, const py::list& outs) {
             if (outs.size() != c.num_outputs()) throw std::runtime_error("GraphCut.assign: wrong number of outputs");
             std::vector<std::shared_ptr<const LeafData>> data;
             data.reserve(outs.size());
             for (auto o : outs) data.push_back(std::make_shared<PyData>(py::reinterpret_borrow<py::object>(o)));
             c.assign(std::move(data));
           },
           "Makes each root storage hold the computed buffer outs[k] (runtime buffer objects, one per output).")
      .def_property_readonly("num_roots", &GraphCut::num_roots)
      .def("node_at_line", &GraphCut::node_at_line)
      .def("node_info", &node_info)
      .def("largest",
           [](const GraphCut& c, int count) {
             py::list l;
             for (int k : c.largest(count)) l.append(node_info(c, k));
             return l;
           },
           "Nodes by size (bytes), largest first: up to `count` node_info dicts.")
      .def("roots_using", &GraphCut::roots_using)
      .def("subset", &GraphCut::subset)
      .def("poison", &GraphCut::poison)
      .def("poison_assigned",
           [](GraphCut& c, const py::list& outs, const std::string& message) {
             if (outs.size() != c.num_outputs())
               throw std::runtime_error("GraphCut.poison_assigned: wrong number of outputs");
             c.poison_assigned([&](const Node& v, size_t k) { return py_data_ptr(v) == outs[k].ptr(); }, message);
           },
           "Makes every root still holding the buffer assign(outs) gave it hold a failed value raising `message`.");
}

}  // namespace txc

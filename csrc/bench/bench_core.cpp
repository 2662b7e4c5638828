// torch_xla_core._bench_core: the core-only microbenchmark that
// bench/flavors.py compares across the C++-ABI flavors. A module of its own,
// built as an extension of the core (ext/extension.h: the core's functions
// through its API table, the flavor checked at import), so _C holds no
// benchmark code. One graph, built through the real op registry exactly as
// tracing builds it: per layer, like one block of
// an MLP, dot(h, W) (dims attributes) + bias (broadcast), gelu (a string
// attribute, "none"/"tanh" alternating), reshape to 1-d and back (dims
// attributes), a gate mul(., h) and a residual add(h, .). n counts op nodes
// (make_node calls); the data leaves (W, bias, input) come on top.
//
//   bench_core("build", n, repeats)  make_node of n ops: shape rules, attrs, node hashes
//   bench_core("hash",  n, repeats)  the graph's cut as a sync makes it: post-order walk + graph hash
//   bench_core("lower", n, repeats)  the cut's StableHLO text
//
// Each returns seconds of the calling thread's CPU time per repeat (one
// repeat = the whole graph once). Each core call goes through the API
// table: one indirect call more per node than inside _C, the same for both
// flavors.
#include <pybind11/stl.h>
#include <time.h>
#include <stdexcept>
#include <string>
#include <vector>
#include "ext/extension.h"

namespace py = pybind11;

namespace txc {
namespace {

constexpr int64_t kBatch = 8, kWidth = 64;

struct Ids {
  uint16_t data = op_id("data"), dot = op_id("dot"), add = op_id("add"), mul = op_id("mul"),
           gelu = op_id("gelu"), reshape = op_id("reshape");
};
const Ids& ids() {
  static const Ids i;
  return i;
}

NodePtr leaf(const Dims& d) { return make_data(DType::F32, d, nullptr, 0); }

// The graph's output after exactly n op nodes.
NodePtr build_graph(int64_t n) {
  const Ids& id = ids();
  int64_t count = 0;
  NodePtr last;
  auto op = [&](uint16_t o, std::vector<NodePtr> xs, Attrs a) {
    last = make_node(o, std::move(xs), std::move(a));
    ++count;
    return last;
  };
#define TXC_BENCH_STEP(stmt) \
  stmt;                      \
  if (count >= n) break
  NodePtr h = leaf({kBatch, kWidth});
  for (int64_t layer = 0; count < n; ++layer) {
    TXC_BENCH_STEP(NodePtr t = op(id.dot, {h, leaf({kWidth, kWidth})}, {Dims{}, Dims{}, Dims{1}, Dims{0}}));
    TXC_BENCH_STEP(NodePtr b = op(id.add, {t, leaf({kWidth})}, {}));
    TXC_BENCH_STEP(NodePtr g = op(id.gelu, {b}, {std::string(layer % 2 ? "tanh" : "none")}));
    TXC_BENCH_STEP(NodePtr r = op(id.reshape, {g}, {Dims{kBatch * kWidth}}));
    TXC_BENCH_STEP(NodePtr r2 = op(id.reshape, {r}, {Dims{kBatch, kWidth}}));
    TXC_BENCH_STEP(NodePtr m = op(id.mul, {r2, h}, {}));
    TXC_BENCH_STEP(h = op(id.add, {h, m}, {}));
  }
#undef TXC_BENCH_STEP
  return last;
}

// The calling thread's CPU time: the C++ work alone, without the time other
// processes held the core (the machine this runs on is often shared).
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
};
double secs(double a, double b) { return b - a; }

std::vector<double> bench_core(const std::string& kind, int64_t n, int64_t repeats) {
  if (n < 1 || n > 1000000) throw py::value_error("bench_core: n must be in [1, 1000000], got " + std::to_string(n));
  if (repeats < 1) throw py::value_error("bench_core: repeats must be >= 1, got " + std::to_string(repeats));
  std::vector<double> out;
  out.reserve(size_t(repeats));
  if (kind == "build") {
    for (int64_t i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      NodePtr g = build_graph(n);
      auto t1 = Clock::now();
      out.push_back(secs(t0, t1));
      // freed here, outside the timed region
    }
  } else if (kind == "hash") {
    std::vector<NodePtr> g = {build_graph(n)};
    uint64_t h0 = 0;
    for (int64_t i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      uint64_t h = ext::graph_hash(g);
      auto t1 = Clock::now();
      out.push_back(secs(t0, t1));
      if (i == 0) h0 = h;
      else if (h != h0) throw std::runtime_error("bench_core: graph hash is not stable");
    }
  } else if (kind == "lower") {
    std::vector<NodePtr> g = {build_graph(n)};
    size_t len = 0;
    for (int64_t i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      std::string text = ext::graph_stablehlo(g);
      auto t1 = Clock::now();
      out.push_back(secs(t0, t1));
      if (i == 0) len = text.size();
      else if (text.size() != len) throw std::runtime_error("bench_core: lowering is not deterministic");
    }
  } else {
    throw py::value_error("bench_core: kind must be 'build', 'hash' or 'lower', got '" + kind + "'");
  }
  return out;
}

}  // namespace
}  // namespace txc

TXC_EXTENSION_MODULE(_bench_core, m) {
  using namespace txc;
  m.doc() = "Core-only microbenchmarks of torch_xla_core (bench/flavors.py), an extension of the core";
  m.def("bench_core", &bench_core, py::arg("kind"), py::arg("n"), py::arg("repeats"),
        "Core-only microbenchmark over a graph of n op nodes (dot/add/gelu/reshape/mul through the\n"
        "op registry): kind 'build' (make_node), 'hash' (GraphCut walk + hash) or 'lower'\n"
        "(StableHLO text). Returns seconds of thread CPU time per repeat.");
  m.def("bench_core_text", [](int64_t n) {
          if (n < 1 || n > 1000000) throw py::value_error("bench_core_text: n must be in [1, 1000000]");
          return ext::graph_stablehlo({build_graph(n)});
        },
        py::arg("n"), "The StableHLO text that bench_core('lower', n, ...) emits.");
}

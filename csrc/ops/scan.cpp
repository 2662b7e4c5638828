// Scan loops: a body (a sub-graph over placeholders, see Body in ir/node.h)
// run once per slice of stacked inputs, lowered as ONE stablehlo.while, so
// the compiled graph does not grow with the number of iterations.
//
//   placeholder(; index)       a body parameter (shape given); lowered only as
//                              a block argument of its body
//   scan(init..., xs..., invariants...; n_carry, n_xs, length, reverse)
//                              the loop (several results; the body in n.body)
//   scan_result(loop; k)       result k of a loop: k < n_carry is the final
//                              carry k, else the stacked y (k - n_carry)
//
// Body params: [carry (n_carry), x slices (n_xs), invariants]; body outputs:
// [new carry (n_carry), y...]. The invariants are the tensors the body's
// function closed over (captures, given by the caller), then the leaves the
// body read that are neither (Body::consts: device data, Python numbers).
// The while loop carries (i, carry..., xs..., ys..., invariants...): x slices
// are dynamic_slice(xs, i), y stacks are dynamic_update_slice(ys, y, i); with
// reverse, i runs from length-1 down to 0 (ys[i] still belongs to xs[i]).
//
// Python builds these through py/scan.cpp (torch_xla_core._C.build_body,
// scan_loop, ...), the plain C++ interface being ops/scan.h.
#include "ops/scan.h"
#include <unordered_map>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

uint16_t ph_op() {
  static const uint16_t id = op_id("placeholder");
  return id;
}

std::string shape_str(DType t, const Dims& d) { return std::string(dtype_name(t)) + dims_str(d); }

}  // namespace

NodePtr placeholder(int64_t index, DType t, const Dims& d) {
  return make_node_shaped(ph_op(), {}, {index}, t, d);
}

namespace {

TXC_OP("placeholder", 0, [](Node&) {},
       [](LowerCtx&, const Node& n) -> std::string {
         throw std::runtime_error("placeholder " + std::to_string(n.attr_int(0)) +
                                  ": a value computed inside a scan body was used outside of it (return it from "
                                  "fn as part of the carry or ys instead)");
       });

}  // namespace

// Every node reachable from outs is copied into the body (so the body holds
// no outer IR), except params, captures and leaves (device data, Python
// numbers, placeholders of an enclosing body), which become params; the
// leaves are kept in Body::consts.
std::shared_ptr<Body> build_body(const std::vector<NodePtr>& params, const std::vector<NodePtr>& outs,
                                 const std::vector<NodePtr>& caps) {
  static const uint16_t data = op_id("data"), scalar = op_id("scalar");
  auto b = std::make_shared<Body>();
  std::unordered_map<const Node*, NodePtr> m;
  for (size_t i = 0; i < params.size(); ++i) {
    const NodePtr& p = params[i];
    if (p->op != ph_op() || p->attr_int(0) != int64_t(i))
      throw std::runtime_error("build_body: parameter " + std::to_string(i) + " is not placeholder " +
                               std::to_string(i));
    m.emplace(p.get(), p);
    b->params.push_back(p);
  }
  for (size_t j = 0; j < caps.size(); ++j) {
    NodePtr ph = placeholder(int64_t(b->params.size()), caps[j]->dtype, caps[j]->dims);
    b->params.push_back(ph);
    m.emplace(caps[j].get(), ph);  // a value captured twice maps to its first param
  }
  std::vector<NodePtr> computed;
  std::vector<std::pair<NodePtr, size_t>> stack;
  for (const NodePtr& out : outs) {
    if (m.count(out.get())) continue;
    stack.emplace_back(out, 0);
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (m.count(n.get())) {
        stack.pop_back();
        continue;
      }
      if (n->op == data || n->op == scalar || n->op == ph_op()) {
        NodePtr ph = placeholder(int64_t(b->params.size()), n->dtype, n->dims);
        b->params.push_back(ph);
        b->consts.push_back(n);
        m.emplace(n.get(), ph);
        stack.pop_back();
        continue;
      }
      if (i < n->operands.size()) {
        NodePtr c = n->operands[i++];
        if (!m.count(c.get())) stack.emplace_back(std::move(c), 0);
        continue;
      }
      std::vector<NodePtr> xs;
      xs.reserve(n->operands.size());
      for (const auto& o : n->operands) xs.push_back(m.at(o.get()));
      NodePtr c = copy_node(*n, std::move(xs));
      m.emplace(n.get(), c);
      computed.push_back(c);
      stack.pop_back();
    }
  }
  for (const NodePtr& out : outs) b->outputs.push_back(m.at(out.get()));
  std::unordered_map<const Node*, uint64_t> pos;
  for (const auto& p : b->params) {
    pos.emplace(p.get(), pos.size());
    b->order.push_back(p.get());
  }
  for (const auto& c : computed) {
    pos.emplace(c.get(), pos.size());
    b->order.push_back(c.get());
  }
  // Structural hash: each node's own hash and which earlier positions its
  // operands are (so a+a and a+b differ), then the outputs' positions.
  uint64_t h = hash_mix(0x626f6479ULL, b->params.size());
  for (const Node* n : b->order) {
    h = hash_mix(h, n->hash);
    for (const auto& o : n->operands) h = hash_mix(h, pos.at(o.get()));
  }
  for (const auto& o : b->outputs) h = hash_mix(h, pos.at(o.get()));
  b->hash = hash_mix(h, b->outputs.size());
  b->consts.shrink_to_fit();
  // Keep the computed nodes alive: order holds raw pointers, outputs hold
  // only what they reach (all of it), params hold themselves.
  return b;
}

namespace {

void check_same(const Node& n, const Node& a, const Node& b, const std::string& what) {
  if (a.dtype != b.dtype || a.dims != b.dims)
    op_error(n, what + ": " + shape_str(a.dtype, a.dims) + " vs " + shape_str(b.dtype, b.dims));
}

void infer_scan(Node& n) {
  if (!n.body) op_error(n, "a scan node needs a body");
  const Body& b = *n.body;
  int64_t nc = n.attr_int(0), nx = n.attr_int(1), len = n.attr_int(2);
  if (b.params.size() != n.operands.size())
    op_error(n, "the body takes " + std::to_string(b.params.size()) + " inputs, the loop has " +
                    std::to_string(n.operands.size()) + " operands");
  if (int64_t(b.outputs.size()) < nc) op_error(n, "the body returns fewer values than the carry has");
  for (int64_t i = 0; i < nc; ++i) {
    check_same(n, *n.operands[i], *b.params[i], "carry " + std::to_string(i) + " (init vs body input)");
    check_same(n, *b.params[i], *b.outputs[i], "carry " + std::to_string(i) + " (body input vs body output)");
  }
  for (int64_t j = nc; j < nc + nx; ++j) {
    const Node& xs = *n.operands[j];
    if (xs.rank() < 1 || xs.dims[0] != len)
      op_error(n, "xs " + std::to_string(j - nc) + " has shape " + dims_str(xs.dims) + ", expected a leading dim of " +
                      std::to_string(len));
    Dims sl(xs.dims.begin() + 1, xs.dims.end());
    if (xs.dtype != b.params[j]->dtype || sl != b.params[j]->dims)
      op_error(n, "xs " + std::to_string(j - nc) + ": a slice is " + shape_str(xs.dtype, sl) + ", the body takes " +
                      shape_str(b.params[j]->dtype, b.params[j]->dims));
  }
  for (size_t k = nc + nx; k < n.operands.size(); ++k)
    check_same(n, *n.operands[k], *b.params[k], "invariant " + std::to_string(k - nc - nx));
  n.dtype = DType::I64;
  n.dims = {};
}

std::string lower_scan(LowerCtx& cx, const Node& n) {
  const Body& b = *n.body;
  const int64_t nc = n.attr_int(0), nx = n.attr_int(1), len = n.attr_int(2);
  const bool rev = n.attr_int(3) != 0;
  const size_t ny = b.outputs.size() - nc, nops = n.operands.size();
  const std::string it = "tensor<i64>";
  std::vector<std::string> types{it}, inits{cx.constant(0, DType::I64)};
  for (int64_t i = 0; i < nc + nx; ++i) {
    types.push_back(LowerCtx::type(*n.operands[i]));
    inits.push_back(cx.in(n, i));
  }
  std::vector<Dims> ydims;
  for (size_t k = 0; k < ny; ++k) {
    const Node& y = *b.outputs[nc + k];
    Dims d{len};
    d.insert(d.end(), y.dims.begin(), y.dims.end());
    ydims.push_back(d);
    types.push_back(LowerCtx::type(y.dtype, d));
    inits.push_back(cx.constant(0, y.dtype, d));
  }
  for (size_t k = nc + nx; k < nops; ++k) {
    types.push_back(LowerCtx::type(*n.operands[k]));
    inits.push_back(cx.in(n, k));
  }
  auto fresh_args = [&] {
    std::vector<std::string> a;
    for (size_t i = 0; i < types.size(); ++i) a.push_back(cx.fresh());
    return a;
  };
  std::vector<std::string> ca = fresh_args();
  std::string cond = cx.region_text(ca, types, [&] {
    std::string lim = cx.constant(double(len), DType::I64);
    cx.region_return({cx.compare(ca[0], lim, DType::I64, {}, "LT")}, {"tensor<i1>"});
  });
  std::vector<std::string> ba = fresh_args();
  std::string body = cx.region_text(ba, types, [&] {
    std::string idx = ba[0];
    if (rev) idx = cx.op("stablehlo.subtract", {cx.constant(double(len - 1), DType::I64), ba[0]}, {it, it}, it);
    std::string zero = cx.constant(0, DType::I64);
    std::vector<std::string> args;
    for (int64_t i = 0; i < nc; ++i) args.push_back(ba[1 + i]);
    for (int64_t j = 0; j < nx; ++j) {
      const Node& xs = *n.operands[nc + j];
      Dims one = xs.dims;
      one[0] = 1;
      std::vector<std::string> opnds{ba[1 + nc + j], idx}, otys{types[1 + nc + j], it};
      for (int r = 1; r < xs.rank(); ++r) {
        opnds.push_back(zero);
        otys.push_back(it);
      }
      std::string s = cx.op("stablehlo.dynamic_slice", opnds, otys, LowerCtx::type(xs.dtype, one),
                            "slice_sizes = " + LowerCtx::i64_array(one));
      args.push_back(cx.reshape(s, xs.dtype, one, b.params[nc + j]->dims));
    }
    const size_t inv0 = 1 + nc + nx + ny;
    for (size_t k = inv0; k < ba.size(); ++k) args.push_back(ba[k]);
    std::vector<std::string> outs = cx.lower_body(b, args);
    std::vector<std::string> next{cx.op("stablehlo.add", {ba[0], cx.constant(1, DType::I64)}, {it, it}, it)};
    for (int64_t i = 0; i < nc; ++i) next.push_back(outs[i]);
    for (int64_t j = 0; j < nx; ++j) next.push_back(ba[1 + nc + j]);
    for (size_t k = 0; k < ny; ++k) {
      const Node& y = *b.outputs[nc + k];
      Dims one{1};
      one.insert(one.end(), y.dims.begin(), y.dims.end());
      std::string u = cx.reshape(outs[nc + k], y.dtype, y.dims, one);
      std::vector<std::string> opnds{ba[1 + nc + nx + k], u, idx}, otys{types[1 + nc + nx + k], LowerCtx::type(y.dtype, one), it};
      for (size_t r = 0; r < y.dims.size(); ++r) {
        opnds.push_back(zero);
        otys.push_back(it);
      }
      next.push_back(cx.op("stablehlo.dynamic_update_slice", opnds, otys, types[1 + nc + nx + k]));
    }
    for (size_t k = inv0; k < ba.size(); ++k) next.push_back(ba[k]);
    cx.region_return(next, types);
  });
  return cx.op_multi("stablehlo.while", inits, types, types, "", "(" + cond + ", " + body + ")");
}

TXC_OP("scan", -1, infer_scan, lower_scan);

TXC_OP("scan_result", 1,
       [](Node& n) {
         const Node& L = *n.operands[0];
         if (!L.body || op_def(L.op).name != "scan") op_error(n, "the operand is not a scan loop");
         int64_t nc = L.attr_int(0), k = n.attr_int(0);
         if (k < 0 || k >= int64_t(L.body->outputs.size())) op_error(n, "result " + std::to_string(k) + " out of range");
         const Node& o = *L.body->outputs[k];
         n.dtype = o.dtype;
         n.dims = o.dims;
         if (k >= nc) n.dims.insert(n.dims.begin(), L.attr_int(2));
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& L = *n.operands[0];
         int64_t nc = L.attr_int(0), nx = L.attr_int(1), k = n.attr_int(0);
         int64_t r = k < nc ? 1 + k : 1 + nc + nx + (k - nc);
         return cx.in(n, 0) + "#" + std::to_string(r);
       });

}  // namespace

std::vector<bool> depends_on(const std::vector<NodePtr>& vals, const std::vector<NodePtr>& params) {
  std::unordered_map<const Node*, bool> memo;
  for (const auto& p : params) memo[p.get()] = true;
  std::vector<bool> out;
  std::vector<std::pair<const Node*, size_t>> stack;
  for (const auto& v : vals) {
    if (!memo.count(v.get())) {
      stack.emplace_back(v.get(), 0);
      while (!stack.empty()) {
        auto& [n, i] = stack.back();
        if (i < n->operands.size()) {
          const Node* c = n->operands[i++].get();
          if (!memo.count(c)) stack.emplace_back(c, 0);
          continue;
        }
        bool d = false;
        for (const auto& o : n->operands) d = d || memo.at(o.get());
        memo[n] = d;
        stack.pop_back();
      }
    }
    out.push_back(memo.at(v.get()));
  }
  return out;
}

std::vector<NodePtr> scan_loop(std::shared_ptr<const Body> b, std::vector<NodePtr> operands, int64_t n_carry,
                               int64_t n_xs, int64_t length, bool reverse) {
  static const uint16_t scan = op_id("scan"), result = op_id("scan_result");
  for (const auto& c : b->consts) operands.push_back(c);
  NodePtr n = make_node(scan, std::move(operands), {n_carry, n_xs, length, int64_t(reverse)}, b);
  std::vector<NodePtr> out;
  out.reserve(b->outputs.size());
  for (size_t k = 0; k < b->outputs.size(); ++k) out.push_back(make_node(result, {n}, {int64_t(k)}));
  return out;
}

}  // namespace txc

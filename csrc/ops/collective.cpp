// Collectives across replicas (torch_xla's xm.all_reduce & co., the "xla"
// torch.distributed backend, torch's functional collectives): one core op
// each, lowered to the StableHLO collective inside the step's graph. A
// graph holding one runs in replica mode, one replica per process
// (executor.Key.replicas); replica ids are process ranks. Attributes:
//   all_reduce(x; reduce, groups, group_size)
//   all_gather(x; dim, groups, group_size)
//   reduce_scatter(x; reduce, dim, groups, group_size)
//   all_to_all(x; split_dim, concat_dim, groups, group_size)
//   collective_permute(x; pairs)
// `groups` is the replica groups flattened (group_size ids per group), `pairs`
// the (source, target) pairs flattened; `reduce` is torch_xla's name: sum,
// mul, min, max, and, or. All are part of the node's hash. Each is an
// ordered op (OpDef::ordered): the lowering chains a graph's collectives in
// trace order, as torch_xla threads a token through them, so processes
// whose graphs differ elsewhere (shapes, per-rank ops) still meet in the
// order their programs called them (gloo and NCCL match collectives by order:
// two processes taking them in different orders wait on each other forever).
#include <string>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

const char* reduce_op(const Node& n, const std::string& reduce) {
  if (reduce == "sum") return "stablehlo.add";
  if (reduce == "mul") return "stablehlo.multiply";
  if (reduce == "min") return "stablehlo.minimum";
  if (reduce == "max") return "stablehlo.maximum";
  if (reduce == "and") return "stablehlo.and";
  if (reduce == "or") return "stablehlo.or";
  op_error(n, "unknown reduce type '" + reduce + "' (sum, mul, min, max, and, or)");
}

// dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>: `flat` as rows of `width`.
std::string i64_matrix(const Dims& flat, int64_t width) {
  std::string s = "dense<[";
  for (size_t i = 0; i < flat.size(); ++i) {
    if (i % size_t(width) == 0) s += (i ? "], [" : "[");
    else s += ", ";
    s += std::to_string(flat[i]);
  }
  return s + "]]> : tensor<" + std::to_string(flat.size() / size_t(width)) + "x" + std::to_string(width) + "xi64>";
}

void check_groups(const Node& n, const Dims& groups, int64_t size) {
  if (size < 1 || groups.empty() || groups.size() % size_t(size) != 0)
    op_error(n, "replica groups must be non-empty and of equal size " + std::to_string(size));
  for (auto r : groups)
    if (r < 0) op_error(n, "replica ids must be >= 0, got " + std::to_string(r));
}

std::string replica_groups(const Node& n, size_t groups_attr) {
  return "replica_groups = " + i64_matrix(n.attr_dims(groups_attr), n.attr_int(groups_attr + 1));
}

// The dimension attribute `attr` of operand x normalized in place (a negative
// dim counts from the end), checked to split into k equal parts; returns it.
int64_t split_dim(Node& n, size_t attr, int64_t k, const std::string& what) {
  const Node& x = *n.operands[0];
  int64_t d = norm_dim(n, n.attr_int(attr), x.rank());
  std::get<int64_t>(n.attrs[attr]) = d;
  if (x.dims[size_t(d)] % k != 0)
    op_error(n, what + " " + std::to_string(d) + " of size " + std::to_string(x.dims[size_t(d)]) +
                    " does not split into " + std::to_string(k) + " equal parts");
  return d;
}

// A collective's row: one operand, ordered.
OpDef collective(const char* name, InferFn infer, LowerFn lower) {
  OpDef d{name, 1, std::move(infer), std::move(lower)};
  d.ordered = true;
  return d;
}

void same_shape(Node& n) {
  n.dtype = n.operands[0]->dtype;
  n.dims = n.operands[0]->dims;
}

}  // namespace

TXC_OP(collective("all_reduce",
    [](Node& n) {
      reduce_op(n, n.attr_str(0));
      check_groups(n, n.attr_dims(1), n.attr_int(2));
      same_shape(n);
    },
    [](LowerCtx& cx, const Node& n) {
      std::string ty = LowerCtx::type(n);
      return cx.op("stablehlo.all_reduce", {cx.ordered_in(n, 0)}, {ty}, ty, replica_groups(n, 1),
                   cx.combiner(n.dtype, reduce_op(n, n.attr_str(0))));
    }));

TXC_OP(collective("all_gather",
    [](Node& n) {
      const Node& x = *n.operands[0];
      check_groups(n, n.attr_dims(1), n.attr_int(2));
      int64_t d = norm_dim(n, n.attr_int(0), x.rank());
      std::get<int64_t>(n.attrs[0]) = d;
      same_shape(n);
      n.dims[size_t(d)] *= n.attr_int(2);
    },
    [](LowerCtx& cx, const Node& n) {
      return cx.op("stablehlo.all_gather", {cx.ordered_in(n, 0)}, {LowerCtx::type(*n.operands[0])}, LowerCtx::type(n),
                   "all_gather_dim = " + std::to_string(n.attr_int(0)) + " : i64, " + replica_groups(n, 1));
    }));

TXC_OP(collective("reduce_scatter",
    [](Node& n) {
      reduce_op(n, n.attr_str(0));
      check_groups(n, n.attr_dims(2), n.attr_int(3));
      int64_t k = n.attr_int(3), d = split_dim(n, 1, k, "scatter dimension");
      same_shape(n);
      n.dims[size_t(d)] /= k;
    },
    [](LowerCtx& cx, const Node& n) {
      return cx.op("stablehlo.reduce_scatter", {cx.ordered_in(n, 0)}, {LowerCtx::type(*n.operands[0])}, LowerCtx::type(n),
                   "scatter_dimension = " + std::to_string(n.attr_int(1)) + " : i64, " + replica_groups(n, 2),
                   cx.combiner(n.dtype, reduce_op(n, n.attr_str(0))));
    }));

TXC_OP(collective("all_to_all",
    [](Node& n) {
      check_groups(n, n.attr_dims(2), n.attr_int(3));
      int64_t k = n.attr_int(3), s = split_dim(n, 0, k, "split dimension");
      int64_t c = norm_dim(n, n.attr_int(1), n.operands[0]->rank());
      std::get<int64_t>(n.attrs[1]) = c;
      same_shape(n);
      n.dims[size_t(s)] /= k;
      n.dims[size_t(c)] *= k;
    },
    [](LowerCtx& cx, const Node& n) {
      return cx.op("stablehlo.all_to_all", {cx.ordered_in(n, 0)}, {LowerCtx::type(*n.operands[0])}, LowerCtx::type(n),
                   "split_dimension = " + std::to_string(n.attr_int(0)) + " : i64, concat_dimension = " +
                       std::to_string(n.attr_int(1)) + " : i64, split_count = " + std::to_string(n.attr_int(3)) +
                       " : i64, " + replica_groups(n, 2));
    }));

TXC_OP(collective("collective_permute",
    [](Node& n) {
      const Dims& pairs = n.attr_dims(0);
      if (pairs.size() % 2 != 0) op_error(n, "pairs must be (source, target) pairs");
      for (auto r : pairs)
        if (r < 0) op_error(n, "replica ids must be >= 0, got " + std::to_string(r));
      same_shape(n);
    },
    [](LowerCtx& cx, const Node& n) {
      std::string ty = LowerCtx::type(n);
      const Dims& pairs = n.attr_dims(0);
      std::string props = "source_target_pairs = " +
                          (pairs.empty() ? std::string("dense<> : tensor<0x2xi64>") : i64_matrix(pairs, 2));
      return cx.op("stablehlo.collective_permute", {cx.ordered_in(n, 0)}, {ty}, ty, props);
    }));

}  // namespace txc

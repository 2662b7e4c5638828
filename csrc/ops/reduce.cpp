// Reductions over a set of axes (sum, mean, amax, amin, prod, any, all, var)
// and arg-reductions (argmax, argmin). Attributes: axes (sorted, non-empty),
// keepdim, and for sum/mean/prod an explicit result dtype (-1: torch's default).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include "lower/emitter.h"
#include "ops/arith.h"
#include "ops/registry.h"

namespace txc {
namespace {

Dims reduced_dims(const Node& n, const Dims& in, const Dims& axes, bool keep) {
  Dims out;
  for (int i = 0; i < int(in.size()); ++i) {
    bool r = false;
    for (auto a : axes) {
      if (a < 0 || a >= int64_t(in.size()) ) op_error(n, "dimension " + std::to_string(a) + " out of range");
      r |= a == i;
    }
    if (!r) out.push_back(in[i]);
    else if (keep) out.push_back(1);
  }
  return out;
}

int64_t count(const Dims& in, const Dims& axes) {
  int64_t c = 1;
  for (auto a : axes) c *= in[a];
  return c;
}

enum class RK { Sum, Mean, Max, Min, Prod, Any, All, Var };

DType result_dtype(const Node& n, RK k) {
  DType x = n.operands[0]->dtype;
  int64_t want = (k == RK::Sum || k == RK::Mean || k == RK::Prod) ? n.attr_int(2) : -1;
  if (want >= 0) {
    // a mean in an integer dtype: torch refuses it (and XLA:CPU's integer 0 / 0 of an empty mean kills the process)
    if (k == RK::Mean && !is_floating(DType(want)) && !is_complex(DType(want)))
      op_error(n, std::string("could not infer output dtype: the requested dtype must be floating point or complex, "
                              "got ") + dtype_name(DType(want)));
    return DType(want);
  }
  switch (k) {
    case RK::Sum:
    case RK::Prod: return (is_integral(x) || is_bool(x)) ? DType::I64 : x;
    case RK::Mean:
    case RK::Var:
      if (!is_floating(x) && !is_complex(x))
        op_error(n, std::string("could not infer output dtype: input dtype must be floating point, got ") +
                        dtype_name(x));
      return k == RK::Var ? real_part_dtype(x) : x;  // the variance of complex values is real
    case RK::Max:
    case RK::Min:
      if (is_complex(x)) op_dtype_not_implemented(n, std::string("not supported for complex tensors (got ") + dtype_name(x) + "), as in torch");
      return x;
    case RK::Any:
    case RK::All: return DType::Bool;
    default: return x;
  }
}


// Canonical axes (in place, before the node is hashed): an empty list means
// every dim; negative dims wrap; sorted, without repeats. A 0-d input
// accepts dim 0 or -1 and reduces nothing.
void normalize_axes(Node& n, int rank) {
  Dims& axes = std::get<Dims>(n.attrs.at(0));
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
    return;
  }
  Dims out;
  for (auto a : axes) {
    int64_t d = norm_dim(n, a, rank);
    if (rank == 0) continue;
    if (std::find(out.begin(), out.end(), d) != out.end())
      op_error(n, "dim " + std::to_string(d) + " appears multiple times in the list of dims");
    out.push_back(d);
  }
  std::sort(out.begin(), out.end());
  axes = out;
}

// amax/amin of floats: NaN where the reduced slice holds one, as torch.
// XLA:CPU's vectorized max/min reductions may drop NaN (fast min/max).
std::string nan_wins(LowerCtx& cx, const std::string& v, DType t, const Dims& in, const Dims& axes,
                     const std::string& r) {
  if (!is_floating(t) || axes.empty()) return r;
  Dims flat;
  for (size_t i = 0; i < in.size(); ++i)
    if (std::find(axes.begin(), axes.end(), int64_t(i)) == axes.end()) flat.push_back(in[i]);
  std::string isnan = cx.compare(v, v, t, in, "NE");
  std::string any = cx.reduce(isnan, DType::Bool, in, axes, "stablehlo.or", 0);
  return cx.select(any, cx.constant(NAN, t, flat), r, t, flat);
}

OpDef reduction(const char* name, RK k) {
  return OpDef{
      name, 1,
      [k](Node& n) {
        const Node& x = *n.operands[0];
        normalize_axes(n, x.rank());
        n.dtype = result_dtype(n, k);
        n.dims = reduced_dims(n, x.dims, n.attr_dims(0), n.attr_int(1) != 0);
      },
      [k](LowerCtx& cx, const Node& n) {
        const Node& x = *n.operands[0];
        const Dims& axes = n.attr_dims(0);
        DType t = n.dtype;  // the type the reduction computes in
        Dims flat = reduced_dims(n, x.dims, axes, false);
        if (k == RK::Var && is_complex(x.dtype)) t = x.dtype;  // computed in complex, |x - mean|^2 is real
        // Half-precision sums, means, products and variances accumulate in
        // float32 and round once, as torch's CPU and CUDA kernels do (a bf16
        // accumulator loses bits at every add: the mean of 1e5 values came
        // out 2 ulps off, the variance 6x further from float64 than CPU's).
        if (k == RK::Sum || k == RK::Mean || k == RK::Prod || k == RK::Var) t = arith::float_compute_dtype(t);
        std::string v = cx.convert(cx.in(n, 0), x.dtype, t, x.dims);
        std::string r;
        switch (k) {
          case RK::Sum: r = cx.reduce(v, t, x.dims, axes, "stablehlo.add", 0); break;
          case RK::Prod: r = cx.reduce(v, t, x.dims, axes, "stablehlo.multiply", 1); break;
          case RK::Max: r = nan_wins(cx, v, t, x.dims, axes, cx.reduce(v, t, x.dims, axes, "stablehlo.maximum", lowest_value(t))); break;
          case RK::Min: r = nan_wins(cx, v, t, x.dims, axes, cx.reduce(v, t, x.dims, axes, "stablehlo.minimum", highest_value(t))); break;
          case RK::Any: r = cx.reduce(v, t, x.dims, axes, "stablehlo.or", 0); break;
          case RK::All: r = cx.reduce(v, t, x.dims, axes, "stablehlo.and", 1); break;
          case RK::Mean: {
            std::string s = cx.reduce(v, t, x.dims, axes, "stablehlo.add", 0);
            std::string ty = LowerCtx::type(t, flat);
            r = cx.binary("stablehlo.divide", s, cx.constant(double(count(x.dims, axes)), t, flat), t, flat);
            break;
          }
          case RK::Var: {
            // sum((x - mean)^2) / max(N - correction, 0)
            std::string ty = LowerCtx::type(t, flat), xt = LowerCtx::type(t, x.dims);
            double N = double(count(x.dims, axes));
            std::string s = cx.reduce(v, t, x.dims, axes, "stablehlo.add", 0);
            std::string m = cx.binary("stablehlo.divide", s, cx.constant(N, t, flat), t, flat);
            Dims keep = reduced_dims(n, x.dims, axes, true);
            std::string mk = cx.broadcast(cx.reshape(m, t, flat, keep), t, keep, x.dims);
            std::string d = cx.binary("stablehlo.subtract", v, mk, t, x.dims);
            if (is_complex(t)) {  // |d|^2
              t = n.dtype;
              d = cx.op("stablehlo.abs", {d}, {LowerCtx::type(x.dtype, x.dims)}, LowerCtx::type(t, x.dims));
            }
            std::string d2 = cx.binary("stablehlo.multiply", d, d, t, x.dims);
            std::string ss = cx.reduce(d2, t, x.dims, axes, "stablehlo.add", 0);
            double denom = std::max(N - n.attr_float(2), 0.0);
            r = cx.binary("stablehlo.divide", ss, cx.constant(denom, t, flat), t, flat);
            break;
          }
        }
        return cx.reshape(cx.convert(r, t, n.dtype, flat), n.dtype, flat, n.dims);
      }};
}

TXC_OP(reduction("sum", RK::Sum));    // (x; axes, keepdim, dtype)
TXC_OP(reduction("mean", RK::Mean));  // (x; axes, keepdim, dtype)
TXC_OP(reduction("prod", RK::Prod));  // (x; axes, keepdim, dtype)
TXC_OP(reduction("amax", RK::Max));   // (x; axes, keepdim)
TXC_OP(reduction("amin", RK::Min));   // (x; axes, keepdim)
TXC_OP(reduction("any", RK::Any));    // (x; axes, keepdim)
TXC_OP(reduction("all", RK::All));    // (x; axes, keepdim)
TXC_OP(reduction("var", RK::Var));    // (x; axes, keepdim, correction: float)

// argmax/argmin(x; dim, keepdim) -> int64; NaN wins, ties (equal values or
// both NaN) pick the smaller index.
OpDef arg_reduction(const char* name, bool is_max) {
  return OpDef{
      name, 1,
      [name](Node& n) {
        const Node& x = *n.operands[0];
        if (is_complex(x.dtype)) op_error(n, std::string("not supported for complex tensors (got ") + dtype_name(x.dtype) + ")");
        n.dtype = DType::I64;
        n.dims = reduced_dims(n, x.dims, {n.attr_int(0)}, n.attr_int(1) != 0);
        if (x.dims[n.attr_int(0)] == 0)  // no index to return; torch raises IndexError
          throw std::out_of_range(std::string(name) + "(): Expected reduction dim " + std::to_string(n.attr_int(0)) +
                                  " to have non-zero size.");
      },
      [is_max](LowerCtx& cx, const Node& n) {
        const Node& x = *n.operands[0];
        int64_t dim = n.attr_int(0);
        DType t = x.dtype;
        Dims flat = reduced_dims(n, x.dims, {dim}, false);
        std::string idx = cx.op("stablehlo.iota", {}, {}, LowerCtx::type(DType::I64, x.dims),
                                "iota_dimension = " + std::to_string(dim) + " : i64");
        std::string init_v = cx.constant(is_max ? lowest_value(t) : highest_value(t), t);
        std::string init_i = cx.constant(0, DType::I64);
        std::string st = LowerCtx::type(t, {}), it = LowerCtx::type(DType::I64, {});
        // Arguments (a, a's index, b, b's index). a wins outright when it is
        // better, or (floating) NaN against a number; a and b tie when equal
        // or both NaN. A tie goes to the smaller index, so the result does not
        // depend on the order in which XLA combines partial results (torch:
        // the first max/min, first NaN).
        std::string region = cx.scalar_region(
            {t, DType::I64, t, DType::I64}, {t, DType::I64}, [&](const std::vector<std::string>& args) {
              const std::string &a = args[0], &ai = args[1], &b = args[2], &bi = args[3];
              auto logic = [&](const char* op, const std::string& l, const std::string& r) {
                return cx.binary(op, l, r, DType::Bool, {});
              };
              std::string take = cx.compare(a, b, t, {}, is_max ? "GT" : "LT");
              std::string tie = cx.compare(a, b, t, {}, "EQ");
              std::string index_first = cx.compare(ai, bi, DType::I64, {}, "LT");
              if (is_floating(t)) {
                std::string a_nan = cx.compare(a, a, t, {}, "NE");
                std::string b_num = cx.compare(b, b, t, {}, "EQ");
                std::string b_nan = cx.compare(b, b, t, {}, "NE");
                take = logic("stablehlo.or", take, logic("stablehlo.and", a_nan, b_num));
                tie = logic("stablehlo.or", tie, logic("stablehlo.and", a_nan, b_nan));
              }
              std::string take_a = logic("stablehlo.or", take, logic("stablehlo.and", tie, index_first));
              return std::vector<std::string>{cx.select(take_a, a, b, t, {}), cx.select(take_a, ai, bi, DType::I64, {})};
            });
        std::string r = cx.op_multi("stablehlo.reduce", {cx.in(n, 0), idx, init_v, init_i},
                                    {LowerCtx::type(x), LowerCtx::type(DType::I64, x.dims), st, it},
                                    {LowerCtx::type(t, flat), LowerCtx::type(DType::I64, flat)},
                                    "dimensions = array<i64: " + std::to_string(dim) + ">", region);
        return cx.reshape(r + "#1", DType::I64, flat, n.dims);
      }};
}
TXC_OP(arg_reduction("argmax", true));
TXC_OP(arg_reduction("argmin", false));

}  // namespace
}  // namespace txc

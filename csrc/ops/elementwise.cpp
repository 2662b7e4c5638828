// Elementwise ops with PyTorch's broadcasting and type promotion. Operands
// may be wrapped Python numbers (weakly typed). Each op is one row below:
// its name, how its result dtype follows from the promoted dtype, the
// StableHLO op (or a short emitter) that computes it, and its flags: which
// dtypes beyond the Kind's it takes (COMPLEX) and how it computes (OPMATH).
// Special functions use CHLO ops where XLA has them (legalized by PJRT's
// compile).
#include <cmath>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

enum class Kind {
  Same,     // result = promoted dtype
  Float,    // result = promoted, integers/bools become float32
  Compare,  // computed in the promoted dtype, result bool
  Logical,  // operands as bool, result bool
  Integral, // integers and bools only
  ToReal,   // result = the real counterpart of the promoted dtype (abs of complex64 is float32)
};

// A row's flags.
// COMPLEX: the op is defined on complex operands (StableHLO and torch agree
// on its complex meaning); a row without it refuses complex tensors at trace
// time, as torch does.
// OPMATH: see "opmath" below (mul, div and its rounding modes).
// NO_BOOL: torch has no bool kernel for the op ("fmod_cpu" not implemented
// for 'Bool'): a bool compute dtype is refused at trace time (StableHLO's
// remainder, negate and shifts refuse i1 only when compiling).
// NO_BOOL_OPERAND: any bool operand is refused, as torch's sub_check does
// (int - bool raises too).
enum Flag : unsigned { COMPLEX = 1u, OPMATH = 2u, NO_BOOL = 4u, NO_BOOL_OPERAND = 8u, COMPLEX_CHECKED = 16u };

DType promoted(const Node& n) { return promoted_dtype(n.operands); }

DType compute_dtype(const Node& n, Kind k) {
  DType p = promoted(n);
  if (k == Kind::Float && (is_integral(p) || is_bool(p))) return DType::F32;
  if (k == Kind::Logical) return DType::Bool;
  return p;
}

void infer(Node& n, Kind k, unsigned flags) {
  Dims d = n.operands[0]->dims;
  for (size_t i = 1; i < n.operands.size(); ++i) d = broadcast_dims(n, d, n.operands[i]->dims);
  DType c = compute_dtype(n, k);
  if (k == Kind::Integral && (is_floating(c) || is_complex(c)))
    op_dtype_not_implemented(n, std::string("not defined for floating-point or complex tensors (got ") + dtype_name(c) + ")");
  // complex: torch has no kernel (NotImplementedError), or refuses it with a check (COMPLEX_CHECKED: RuntimeError)
  if (is_complex(c) && !(flags & COMPLEX)) {
    auto msg = std::string("not supported for complex tensors (got ") + dtype_name(c) + "), as in torch";
    if (flags & COMPLEX_CHECKED) op_error(n, msg);
    op_dtype_not_implemented(n, msg);
  }
  if ((flags & NO_BOOL) && is_bool(c))
    op_dtype_not_implemented(n, "not implemented for bool tensors, as in torch; cast the operands to an integer or floating dtype first");
  if (flags & NO_BOOL_OPERAND)
    for (const auto& o : n.operands)
      if (is_bool(o->dtype))
        op_error(n, "not supported with a bool operand, as in torch; use logical_xor (^) or logical_not (~) on masks");
  n.dims = std::move(d);
  n.dtype = (k == Kind::Compare || k == Kind::Logical) ? DType::Bool : k == Kind::ToReal ? real_part_dtype(c) : c;
}

std::vector<std::string> coerced(LowerCtx& cx, const Node& n, DType c) {
  std::vector<std::string> v;
  for (size_t i = 0; i < n.operands.size(); ++i) v.push_back(cx.coerce(n, i, c, n.dims));
  return v;
}

// "opmath" ops (mul, div and its rounding modes): on f16/bf16 tensors
// torch's CPU and CUDA kernels take a host scalar operand (a Python number,
// a 0-d CPU tensor) at float32 precision and compute in float32, rounding
// once (ATen's opmath_t and original_scalar_value): `bf16 * 4.775` is not
// `bf16 * bf16(4.775)`. (add, sub, pow, fmod and comparisons do round the
// scalar to the tensor's dtype first, as TensorIterator's cast does.) So a
// Python number keeps float32 (number_dtype below), and the op computes in
// float32 when a float host scalar meets a half-precision promoted dtype.
// (div's rounding modes too; between two half tensors they compute in the
// half dtype, as ATen's kernels do.)
bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

DType opmath_number_dtype(const std::vector<NodePtr>& xs) {
  DType p = promoted_dtype(xs);
  return is_half(p) ? DType::F32 : p;
}

// Ops whose result is floating for integer operands (Kind::Float) take a
// Python number as TensorIterator's cast to the float compute dtype does:
// `uint8_tensor / -1` divides by -1.0, not by uint8(-1) = 255 (case 1:17271).
DType float_number_dtype(const std::vector<NodePtr>& xs) {
  DType p = promoted_dtype(xs);
  return is_integral(p) || is_bool(p) ? DType::F32 : p;
}

// div: the above, and half dtypes as opmath (opmath_number_dtype)
DType opmath_float_number_dtype(const std::vector<NodePtr>& xs) {
  DType t = float_number_dtype(xs);
  return is_half(t) ? DType::F32 : t;
}

DType opmath_dtype(const Node& n, DType c, unsigned flags) {
  static const uint16_t scalar = op_id("scalar");
  if (!(flags & OPMATH) || !is_half(c)) return c;
  for (const auto& o : n.operands)
    if (o->op == scalar && (o->dtype == DType::F32 || o->dtype == DType::F64)) return DType::F32;
  return c;
}

// Row builders (each row registers with TXC_OP, as every core op does).
using Emit = std::function<std::string(LowerCtx&, const Node&, const std::vector<std::string>&, DType)>;

// Op `name` computing `emit` over its operands coerced to the compute dtype.
OpDef custom(const char* name, int arity, Kind k, Emit emit, unsigned flags = 0) {
  OpDef d;
  d.name = name;
  d.arity = arity;
  d.infer = [k, flags](Node& n) { infer(n, k, flags); };
  d.lower = [k, emit, flags](LowerCtx& cx, const Node& n) {
    DType c = compute_dtype(n, k);
    DType m = opmath_dtype(n, c, flags);
    std::string r = emit(cx, n, coerced(cx, n, m), m);
    return m == c ? r : cx.convert(r, m, n.dtype, n.dims);
  };
  if (flags & OPMATH) d.number_dtype = k == Kind::Float ? &opmath_float_number_dtype : &opmath_number_dtype;
  else if (k == Kind::Float) d.number_dtype = &float_number_dtype;
  return d;
}

// Op `name` lowering to the StableHLO op `hlo` over coerced operands.
OpDef simple(const char* name, int arity, Kind k, const char* hlo, unsigned flags = 0) {
  std::string h = hlo;
  return custom(
      name, arity, k,
      [h](LowerCtx& cx, const Node& n, const std::vector<std::string>& a, DType m) {
        return cx.op(h, a, std::vector<std::string>(a.size(), LowerCtx::type(m, n.dims)), LowerCtx::type(m, n.dims));
      },
      flags);
}

OpDef comparison(const char* name, const char* dir, unsigned flags = 0) {
  return custom(
      name, 2, Kind::Compare,
      [dir](LowerCtx& cx, const Node& n, const auto& a, DType c) { return cx.compare(a[0], a[1], c, n.dims, dir); },
      flags);
}

// complex(real, imag): both real, promoted; the result is the complex dtype
// of their promoted type (float64 -> complex128, others -> complex64).
TXC_OP(
    "complex", 2,
    [](Node& n) {
      infer(n, Kind::Float, 0);
      if (is_complex(n.dtype)) op_error(n, "expects real (floating-point) parts, got complex ones");
      n.dtype = complex_dtype_of(n.dtype);
    },
    [](LowerCtx& cx, const Node& n) {
      DType part = real_part_dtype(n.dtype);
      auto re = cx.coerce(n, 0, part, n.dims), im = cx.coerce(n, 1, part, n.dims);
      auto pty = LowerCtx::type(part, n.dims);
      return cx.op("stablehlo.complex", {re, im}, {pty, pty}, LowerCtx::type(n));
    });

// Rounds floats toward zero: sign(v) * floor(|v|).
std::string round_toward_zero(LowerCtx& cx, const std::string& v, DType t, const Dims& d) {
  auto magnitude = cx.unary("stablehlo.floor", cx.unary("stablehlo.abs", v, t, d), t, d);
  return cx.binary("stablehlo.multiply", cx.unary("stablehlo.sign", v, t, d), magnitude, t, d);
}

// Where a truncating remainder r of a / b must move one divisor toward
// rounding down: r is nonzero and its sign differs from b's.
std::string remainder_needs_floor(LowerCtx& cx, const std::string& r, const std::string& b, DType t, const Dims& d) {
  auto zero = cx.constant(0, t, d);
  auto nonzero = cx.compare(r, zero, t, d, "NE");
  auto signs_differ = cx.binary("stablehlo.xor", cx.compare(r, zero, t, d, "LT"), cx.compare(b, zero, t, d, "LT"),
                                DType::Bool, d);
  return cx.binary("stablehlo.and", nonzero, signs_differ, DType::Bool, d);
}

// A rounding op: the identity on integers and bools (as torch's).
Emit on_floats(const char* hlo) {
  std::string h = hlo;
  return [h](LowerCtx& cx, const Node& n, const std::vector<std::string>& a, DType c) {
    return is_floating(c) ? cx.unary(h, a[0], c, n.dims) : a[0];
  };
}

// The signed integer type as wide as float type t (to read t's sign bit).
DType same_width_int(DType t) {
  return t == DType::F64 ? DType::I64 : t == DType::F32 ? DType::I32 : DType::I16;
}

// Whether v's sign bit is set: -0.0 and NaNs with the bit set count, as
// std::signbit; integers: v < 0; bools never.
std::string sign_bit(LowerCtx& cx, const std::string& v, DType t, const Dims& d) {
  if (is_bool(t)) return cx.constant(0, DType::Bool, d);
  if (!is_floating(t)) return cx.compare(v, cx.constant(0, t, d), t, d, "LT");
  DType it = same_width_int(t);
  auto bits = cx.op("stablehlo.bitcast_convert", {v}, {LowerCtx::type(t, d)}, LowerCtx::type(it, d));
  return cx.compare(bits, cx.constant(0, it, d), it, d, "LT");
}

std::string is_inf(LowerCtx& cx, const std::string& v, DType t, const Dims& d) {
  return cx.compare(cx.unary("stablehlo.abs", v, t, d), cx.constant(INFINITY, t, d), t, d, "EQ");
}

std::string is_nan(LowerCtx& cx, const std::string& v, DType t, const Dims& d) { return cx.compare(v, v, t, d, "NE"); }

// floor(a / b) of floats as ATen's div_floor_floating (Python's //): from
// the exact remainder, not a rounded quotient — (a - fmod(a, b)) / b, one
// less where the remainder's sign differs from b's, then the nearest
// integer; a signed zero where that is 0; IEEE a / b where b is 0.
std::string floor_divide_floats(LowerCtx& cx, const std::string& a, const std::string& b, DType t, const Dims& d) {
  auto one = cx.constant(1, t, d), zero = cx.constant(0, t, d);
  auto mod = cx.binary("stablehlo.remainder", a, b, t, d);
  auto div = cx.binary("stablehlo.divide", cx.binary("stablehlo.subtract", a, mod, t, d), b, t, d);
  div = cx.select(remainder_needs_floor(cx, mod, b, t, d), cx.binary("stablehlo.subtract", div, one, t, d), div, t, d);
  auto fl = cx.unary("stablehlo.floor", div, t, d);
  auto up = cx.compare(cx.binary("stablehlo.subtract", div, fl, t, d), cx.constant(0.5, t, d), t, d, "GT");
  fl = cx.select(up, cx.binary("stablehlo.add", fl, one, t, d), fl, t, d);
  auto q = cx.binary("stablehlo.divide", a, b, t, d);
  auto signed_zero = cx.select(sign_bit(cx, q, t, d), cx.unary("stablehlo.negate", zero, t, d), zero, t, d);
  fl = cx.select(cx.compare(div, zero, t, d, "EQ"), signed_zero, fl, t, d);
  return cx.select(cx.compare(b, zero, t, d, "EQ"), q, fl, t, d);
}

// Complex v (dtype t) with each part put through `hlo` with the real k, as
// std::complex's operators with a real operand do (a complex product or
// quotient with k + 0i would make inf * 0 = NaN of an infinite part).
std::string complex_parts_with(LowerCtx& cx, const char* hlo, const std::string& v, double k, DType t, const Dims& d) {
  DType part = real_part_dtype(t);
  auto ty = LowerCtx::type(t, d), pty = LowerCtx::type(part, d);
  auto kc = cx.constant(k, part, d);
  auto re = cx.binary(hlo, cx.op("stablehlo.real", {v}, {ty}, pty), kc, part, d);
  auto im = cx.binary(hlo, cx.op("stablehlo.imag", {v}, {ty}, pty), kc, part, d);
  return cx.op("stablehlo.complex", {re, im}, {pty, pty}, ty);
}

// log(v) / log(base), as jnp.log2/log10 (within an ulp or two of ATen's);
// complex: each part divided.
Emit log_base(double base) {
  return [base](LowerCtx& cx, const Node& n, const auto& a, DType c) {
    auto l = cx.unary("stablehlo.log", a[0], c, n.dims);
    if (is_complex(c)) return complex_parts_with(cx, "stablehlo.divide", l, std::log(base), c, n.dims);
    return cx.binary("stablehlo.divide", l, cx.constant(std::log(base), c, n.dims), c, n.dims);
  };
}

// fmax/fmin: maximum/minimum that ignores a NaN operand (NaN only if both are).
Emit nan_ignoring(const char* hlo) {
  return [hlo](LowerCtx& cx, const Node& n, const auto& a, DType c) {
    auto m = cx.binary(hlo, a[0], a[1], c, n.dims);
    if (!is_floating(c)) return m;
    return cx.select(is_nan(cx, a[0], c, n.dims), a[1], cx.select(is_nan(cx, a[1], c, n.dims), a[0], m, c, n.dims), c,
                     n.dims);
  };
}
}  // namespace

// floor(a / b) as torch's div(rounding_mode='floor') in dtype t: floats as
// ATen's div_floor_floating, integers from the truncating quotient, one less
// where the remainder's sign differs from b's (also used by ops/index.cpp:
// scatter_reduce's integer mean).
std::string floor_divide(LowerCtx& cx, const std::string& a, const std::string& b, DType t, const Dims& d) {
  if (is_floating(t)) return floor_divide_floats(cx, a, b, t, d);
  auto q = cx.binary("stablehlo.divide", a, b, t, d);
  auto r = cx.binary("stablehlo.remainder", a, b, t, d);
  auto q_minus_1 = cx.binary("stablehlo.subtract", q, cx.constant(1, t, d), t, d);
  return cx.select(remainder_needs_floor(cx, r, b, t, d), q_minus_1, q, t, d);
}

// The complex conjugate of v (dtype t); v itself for real t (also used by ops/complex.cpp).
std::string complex_conj(LowerCtx& cx, const std::string& v, DType t, const Dims& d) {
  if (!is_complex(t)) return v;
  DType part = real_part_dtype(t);
  auto ty = LowerCtx::type(t, d), pty = LowerCtx::type(part, d);
  auto re = cx.op("stablehlo.real", {v}, {ty}, pty);
  auto im = cx.unary("stablehlo.negate", cx.op("stablehlo.imag", {v}, {ty}, pty), part, d);
  return cx.op("stablehlo.complex", {re, im}, {pty, pty}, ty);
}

namespace {

// -- unary --------------------------------------------------------------
TXC_OP(simple("neg", 1, Kind::Same, "stablehlo.negate", COMPLEX | NO_BOOL));
// abs of an unsigned integer is itself (stablehlo.abs takes signless integers only)
TXC_OP(custom("abs", 1, Kind::ToReal,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                return is_unsigned(c) ? a[0] : cx.op("stablehlo.abs", {a[0]}, {LowerCtx::type(c, n.dims)}, LowerCtx::type(n));
              }, COMPLEX | NO_BOOL));
// sign of NaN is 0, as torch's kernels ((0 < x) - (x < 0)); stablehlo.sign gives NaN
TXC_OP(custom("sign", 1, Kind::Same, [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
  if (is_bool(c)) return a[0];
  if (is_unsigned(c))  // stablehlo.sign takes signless integers only: 1 where nonzero (case 1:1240, sgn of uint8)
    return cx.select(cx.compare(a[0], cx.constant(0, c, n.dims), c, n.dims, "EQ"), cx.constant(0, c, n.dims),
                     cx.constant(1, c, n.dims), c, n.dims);
  auto s = cx.unary("stablehlo.sign", a[0], c, n.dims);
  return is_floating(c) ? cx.select(is_nan(cx, a[0], c, n.dims), cx.constant(0, c, n.dims), s, c, n.dims) : s;
}));
TXC_OP(simple("exp", 1, Kind::Float, "stablehlo.exponential", COMPLEX));
TXC_OP(simple("expm1", 1, Kind::Float, "stablehlo.exponential_minus_one", COMPLEX));
TXC_OP(simple("log", 1, Kind::Float, "stablehlo.log", COMPLEX));
TXC_OP(simple("log1p", 1, Kind::Float, "stablehlo.log_plus_one", COMPLEX));
TXC_OP(simple("sqrt", 1, Kind::Float, "stablehlo.sqrt", COMPLEX));
TXC_OP(simple("rsqrt", 1, Kind::Float, "stablehlo.rsqrt", COMPLEX));
TXC_OP(simple("tanh", 1, Kind::Float, "stablehlo.tanh", COMPLEX));
TXC_OP(simple("sigmoid", 1, Kind::Float, "stablehlo.logistic", COMPLEX));
TXC_OP(simple("sin", 1, Kind::Float, "stablehlo.sine", COMPLEX));
TXC_OP(simple("cos", 1, Kind::Float, "stablehlo.cosine", COMPLEX));
TXC_OP(simple("tan", 1, Kind::Float, "stablehlo.tan", COMPLEX));
TXC_OP(simple("erf", 1, Kind::Float, "chlo.erf"));
TXC_OP(simple("erfinv", 1, Kind::Float, "chlo.erf_inv"));
TXC_OP(simple("atan", 1, Kind::Float, "chlo.atan", COMPLEX));
TXC_OP(simple("asin", 1, Kind::Float, "chlo.asin", COMPLEX));
TXC_OP(simple("acos", 1, Kind::Float, "chlo.acos", COMPLEX));
TXC_OP(simple("sinh", 1, Kind::Float, "chlo.sinh", COMPLEX));
TXC_OP(simple("cosh", 1, Kind::Float, "chlo.cosh", COMPLEX));
// bool: no kernel in torch (CPU's floor_vml_cpu etc. raise NotImplementedError); abs of bool failed to compile
TXC_OP(custom("floor", 1, Kind::Same, on_floats("stablehlo.floor"), NO_BOOL));
TXC_OP(custom("ceil", 1, Kind::Same, on_floats("stablehlo.ceil"), NO_BOOL));
TXC_OP(custom("round", 1, Kind::Same, on_floats("stablehlo.round_nearest_even"), NO_BOOL));
TXC_OP(simple("bitwise_not", 1, Kind::Integral, "stablehlo.not"));
TXC_OP(custom("logical_not", 1, Kind::Logical,
              [](LowerCtx& cx, const Node& n, const auto& a, DType) { return cx.unary("stablehlo.not", a[0], DType::Bool, n.dims); }, COMPLEX));
TXC_OP(custom("reciprocal", 1, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                return cx.binary("stablehlo.divide", cx.constant(1, c, n.dims), a[0], c, n.dims);
              }, COMPLEX));
TXC_OP(custom("trunc", 1, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                return is_floating(c) ? round_toward_zero(cx, a[0], c, n.dims) : a[0];
              }, NO_BOOL));
// Complex parts and conjugate; on real tensors real/conj are the identity.
TXC_OP(custom("real", 1, Kind::ToReal,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                return is_complex(c) ? cx.op("stablehlo.real", {a[0]}, {LowerCtx::type(c, n.dims)}, LowerCtx::type(n))
                                     : a[0];
              }, COMPLEX));
TXC_OP(custom("imag", 1, Kind::ToReal,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                return is_complex(c) ? cx.op("stablehlo.imag", {a[0]}, {LowerCtx::type(c, n.dims)}, LowerCtx::type(n))
                                     : cx.constant(0, c, n.dims);
              }, COMPLEX));
TXC_OP(custom("conj", 1, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) { return complex_conj(cx, a[0], c, n.dims); }, COMPLEX));
// angle: atan2(imag, real); for real x, pi where x < 0, else 0 (NaN stays NaN), as torch.
TXC_OP(custom("angle", 1, Kind::ToReal,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                DType r = n.dtype;
                if (is_complex(c)) {
                  auto re = cx.op("stablehlo.real", {a[0]}, {LowerCtx::type(c, n.dims)}, LowerCtx::type(n));
                  auto im = cx.op("stablehlo.imag", {a[0]}, {LowerCtx::type(c, n.dims)}, LowerCtx::type(n));
                  return cx.binary("stablehlo.atan2", im, re, r, n.dims);
                }
                auto x = cx.convert(a[0], c, r, n.dims);
                auto neg = cx.compare(x, cx.constant(0, r, n.dims), r, n.dims, "LT");
                auto v = cx.select(neg, cx.constant(M_PI, r, n.dims), cx.constant(0, r, n.dims), r, n.dims);
                return cx.select(cx.compare(x, x, r, n.dims, "NE"), x, v, r, n.dims);
              }, COMPLEX));
TXC_OP(custom("isnan", 1, Kind::Compare,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) { return cx.compare(a[0], a[0], c, n.dims, "NE"); }, COMPLEX));

// -- binary -------------------------------------------------------------
TXC_OP(simple("add", 2, Kind::Same, "stablehlo.add", COMPLEX));
TXC_OP(simple("sub", 2, Kind::Same, "stablehlo.subtract", COMPLEX | NO_BOOL_OPERAND));
TXC_OP(simple("mul", 2, Kind::Same, "stablehlo.multiply", COMPLEX | OPMATH));
TXC_OP(simple("div", 2, Kind::Float, "stablehlo.divide", COMPLEX | OPMATH));
TXC_OP(simple("maximum", 2, Kind::Same, "stablehlo.maximum", COMPLEX_CHECKED));
TXC_OP(simple("minimum", 2, Kind::Same, "stablehlo.minimum", COMPLEX_CHECKED));
// Integer powers wrap around as torch's kernels do. XLA's integer power
// reads only the exponent's low 6 bits (3 ** 67 came out as 3 ** 3, case
// 1:8633), so integers square and multiply over every bit of the exponent;
// a negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise,
// as torch's integer pow.
namespace {
std::string integer_pow(LowerCtx& cx, const std::string& base, const std::string& e, DType c, const Dims& d) {
  auto one = cx.constant(1, c, d), zero = cx.constant(0, c, d);
  std::string r = one, b = base, rest = e;
  int bits = is_unsigned(c) ? bit_width(c) : bit_width(c) - 1;
  for (int i = 0; i < bits; ++i) {
    auto odd = cx.compare(cx.binary("stablehlo.and", rest, one, c, d), one, c, d, "EQ");
    r = cx.select(odd, cx.binary("stablehlo.multiply", r, b, c, d), r, c, d);
    if (i + 1 == bits) break;
    b = cx.binary("stablehlo.multiply", b, b, c, d);
    rest = cx.binary("stablehlo.shift_right_logical", rest, one, c, d);
  }
  if (is_unsigned(c)) return r;
  // e < 0: 1 ** e = 1; (-1) ** e = -1 where e is odd, else 1; other bases 0
  auto minus_one = cx.constant(-1, c, d);
  auto e_odd = cx.compare(cx.binary("stablehlo.and", e, one, c, d), one, c, d, "EQ");
  auto at_minus_one = cx.select(e_odd, minus_one, one, c, d);
  auto negative = cx.select(cx.compare(base, one, c, d, "EQ"), one,
                            cx.select(cx.compare(base, minus_one, c, d, "EQ"), at_minus_one, zero, c, d), c, d);
  return cx.select(cx.compare(e, zero, c, d, "LT"), negative, r, c, d);
}
}  // namespace
TXC_OP(custom("pow", 2, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                if (is_integral(c)) return integer_pow(cx, a[0], a[1], c, n.dims);
                return cx.binary("stablehlo.power", a[0], a[1], c, n.dims);
              }, COMPLEX));
TXC_OP(simple("atan2", 2, Kind::Float, "stablehlo.atan2"));
TXC_OP(simple("bitwise_and", 2, Kind::Integral, "stablehlo.and"));
TXC_OP(simple("bitwise_or", 2, Kind::Integral, "stablehlo.or"));
TXC_OP(simple("bitwise_xor", 2, Kind::Integral, "stablehlo.xor"));
// Shifts as torch's kernels: a shift by a negative amount or by at least
// the bit width gives 0 (left, and right on unsigned) or the sign fill
// (right on signed), which is what StableHLO's shifts do with the
// amount read as unsigned.
TXC_OP(simple("bitwise_left_shift", 2, Kind::Integral, "stablehlo.shift_left", NO_BOOL));
TXC_OP(custom("bitwise_right_shift", 2, Kind::Integral,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                const char* op = is_unsigned(c) ? "stablehlo.shift_right_logical" : "stablehlo.shift_right_arithmetic";
                return cx.binary(op, a[0], a[1], c, n.dims);
              }, NO_BOOL));
TXC_OP(simple("logical_and", 2, Kind::Logical, "stablehlo.and", COMPLEX));
TXC_OP(simple("logical_or", 2, Kind::Logical, "stablehlo.or", COMPLEX));
TXC_OP(simple("logical_xor", 2, Kind::Logical, "stablehlo.xor", COMPLEX));
TXC_OP(comparison("eq", "EQ", COMPLEX));
TXC_OP(comparison("ne", "NE", COMPLEX));
TXC_OP(comparison("lt", "LT"));
TXC_OP(comparison("le", "LE"));
TXC_OP(comparison("gt", "GT"));
TXC_OP(comparison("ge", "GE"));
// Integer division rounding toward zero (torch's rounding_mode='trunc').
TXC_OP(custom("div_trunc", 2, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                auto q = cx.binary("stablehlo.divide", a[0], a[1], c, n.dims);
                return is_floating(c) ? round_toward_zero(cx, q, c, n.dims) : q;
              }, OPMATH | NO_BOOL));
// Division rounding down (rounding_mode='floor', floor_divide).
TXC_OP(custom("div_floor", 2, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) { return floor_divide(cx, a[0], a[1], c, n.dims); },
              OPMATH | NO_BOOL));
// Python-style modulus: result has the sign of the divisor (torch.remainder).
TXC_OP(custom("remainder", 2, Kind::Same,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                auto r = cx.binary("stablehlo.remainder", a[0], a[1], c, n.dims);
                auto r_plus_b = cx.binary("stablehlo.add", r, a[1], c, n.dims);
                return cx.select(remainder_needs_floor(cx, r, a[1], c, n.dims), r_plus_b, r, c, n.dims);
              }, NO_BOOL));
TXC_OP(simple("fmod", 2, Kind::Same, "stablehlo.remainder", NO_BOOL));

// -- special functions (aten ops that torch's decompositions turn into
// prims; the Python side is torch_xla_core/_ops/special.py) --------------
TXC_OP(simple("acosh", 1, Kind::Float, "chlo.acosh", COMPLEX));
TXC_OP(simple("asinh", 1, Kind::Float, "chlo.asinh", COMPLEX));
TXC_OP(simple("atanh", 1, Kind::Float, "chlo.atanh", COMPLEX));
TXC_OP(simple("erfc", 1, Kind::Float, "chlo.erfc"));
TXC_OP(simple("lgamma", 1, Kind::Float, "chlo.lgamma"));
// digamma(+-0) = -+inf, as ATen (chlo.digamma gives NaN there)
TXC_OP(custom("digamma", 1, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                const Dims& d = n.dims;
                auto pole = cx.select(sign_bit(cx, a[0], c, d), cx.constant(INFINITY, c, d), cx.constant(-INFINITY, c, d), c, d);
                return cx.select(cx.compare(a[0], cx.constant(0, c, d), c, d, "EQ"), pole, cx.unary("chlo.digamma", a[0], c, d),
                                 c, d);
              }));
TXC_OP(simple("bessel_i1e", 1, Kind::Float, "chlo.bessel_i1e"));
TXC_OP(custom("log2", 1, Kind::Float, log_base(2.0), COMPLEX));
TXC_OP(custom("log10", 1, Kind::Float, log_base(10.0), COMPLEX));
// 2^x through power, exact at integer x (exp(x ln 2) is not)
TXC_OP(custom("exp2", 1, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                if (!is_complex(c)) return cx.binary("stablehlo.power", cx.constant(2, c, n.dims), a[0], c, n.dims);
                // complex: exp(z ln 2), each part scaled (as ATen; power(2, z) gave NaN at an infinite real part)
                auto scaled = complex_parts_with(cx, "stablehlo.multiply", a[0], std::log(2.0), c, n.dims);
                return cx.unary("stablehlo.exponential", scaled, c, n.dims);
              }, COMPLEX));
TXC_OP(custom("signbit", 1, Kind::Compare,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) { return sign_bit(cx, a[0], c, n.dims); }));
// i1(x) = exp(|x|) i1e(x) (NaN at +-inf, as ATen's)
TXC_OP(custom("bessel_i1", 1, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                auto e = cx.unary("stablehlo.exponential", cx.unary("stablehlo.abs", a[0], c, n.dims), c, n.dims);
                return cx.binary("stablehlo.multiply", e, cx.unary("chlo.bessel_i1e", a[0], c, n.dims), c, n.dims);
              }));
// sin(x)/x; its Taylor series 1 - x^2/3! + x^4/5! - x^6/7! + x^8/9! near 0; 0 at +-inf
TXC_OP(custom("spherical_bessel_j0", 1, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                const Dims& d = n.dims;
                auto mul = [&](const std::string& x, const std::string& y) { return cx.binary("stablehlo.multiply", x, y, c, d); };
                auto add = [&](const std::string& x, double k) { return cx.binary("stablehlo.add", x, cx.constant(k, c, d), c, d); };
                auto x2 = mul(a[0], a[0]);
                auto s = cx.constant(1.0 / 362880, c, d);
                for (double k : {-1.0 / 5040, 1.0 / 120, -1.0 / 6, 1.0}) s = add(mul(x2, s), k);
                auto q = cx.binary("stablehlo.divide", cx.unary("stablehlo.sine", a[0], c, d), a[0], c, d);
                auto small = cx.compare(cx.unary("stablehlo.abs", a[0], c, d), cx.constant(0.5, c, d), c, d, "LT");
                return cx.select(is_inf(cx, a[0], c, d), cx.constant(0, c, d), cx.select(small, s, q, c, d), c, d);
              }));
TXC_OP(custom("fmax", 2, Kind::Same, nan_ignoring("stablehlo.maximum"), COMPLEX_CHECKED));
TXC_OP(custom("fmin", 2, Kind::Same, nan_ignoring("stablehlo.minimum"), COMPLEX_CHECKED));
// |a| with b's sign bit
TXC_OP(custom("copysign", 2, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                auto m = cx.unary("stablehlo.abs", a[0], c, n.dims);
                return cx.select(sign_bit(cx, a[1], c, n.dims), cx.unary("stablehlo.negate", m, c, n.dims), m, c, n.dims);
              }));
// sqrt(a^2 + b^2) without overflow: m sqrt(1 + (s/m)^2), m = max(|a|,|b|),
// s = min; 0 when both are 0; inf when either is inf (even with a NaN)
TXC_OP(custom("hypot", 2, Kind::Float,
              [](LowerCtx& cx, const Node& n, const auto& a, DType c) {
                const Dims& d = n.dims;
                auto x = cx.unary("stablehlo.abs", a[0], c, d), y = cx.unary("stablehlo.abs", a[1], c, d);
                auto m = cx.binary("stablehlo.maximum", x, y, c, d), s = cx.binary("stablehlo.minimum", x, y, c, d);
                auto r = cx.binary("stablehlo.divide", s, m, c, d);
                auto one_plus = cx.binary("stablehlo.add", cx.constant(1, c, d), cx.binary("stablehlo.multiply", r, r, c, d), c, d);
                auto h = cx.binary("stablehlo.multiply", m, cx.unary("stablehlo.sqrt", one_plus, c, d), c, d);
                auto zero = cx.constant(0, c, d);
                h = cx.select(cx.compare(m, zero, c, d, "EQ"), zero, h, c, d);
                auto inf = cx.binary("stablehlo.or", is_inf(cx, x, c, d), is_inf(cx, y, c, d), DType::Bool, d);
                return cx.select(inf, cx.constant(INFINITY, c, d), h, c, d);
              }));
TXC_OP(simple("nextafter", 2, Kind::Float, "chlo.next_after"));

// where(cond, x, y): x and y promote; cond is bool (so are Python numbers
// among x and y: cond takes no part in their dtype).
DType where_dtype(const std::vector<NodePtr>& xs) {
  ResultType rt;
  for (size_t i = 1; i < xs.size(); ++i) rt.add(xs[i]->dtype, xs[i]->rank(), xs[i]->wrapped);
  return rt.result();
}

TXC_OP(
    "where", 3,
    [](Node& n) {
      Dims d = broadcast_dims(n, n.operands[0]->dims, n.operands[1]->dims);
      n.dims = broadcast_dims(n, d, n.operands[2]->dims);
      n.dtype = where_dtype(n.operands);
    },
    [](LowerCtx& cx, const Node& n) {
      auto c = cx.coerce(n, 0, DType::Bool, n.dims);
      auto x = cx.coerce(n, 1, n.dtype, n.dims);
      auto y = cx.coerce(n, 2, n.dtype, n.dims);
      return cx.select(c, x, y, n.dtype, n.dims);
    },
    nullptr, nullptr, 0, &where_dtype);

}  // namespace
}  // namespace txc

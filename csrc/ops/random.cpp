// Random numbers. The device RNG state is an ordinary tensor, i64[2] =
// [seed, counter], held by torch_xla_core/_tracing/random.py as a graph parameter
// (device data), never a constant, so a new seed doesn't recompile.
//
// Every draw takes two operands: a state and its stream within the state,
// a Python number (a scalar graph parameter): the draw at offset c from the
// state passes stream(c) = (c * 2^40) * G mod 2^64 (as an i64 bit pattern;
// torch_xla_core/_tracing/random.py computes it on the host, so the device adds one
// scalar per draw instead of computing it). The
// draws of one graph share one state (the one at the start of the graph)
// and differ by their offsets 0, 1, 2, ..., so no draw depends on a chain
// of state updates, and every draw of one shape lowers to the same ops
// with different parameters. (A chain of `state + 1` ops, or a constant
// per draw, makes XLA fold each draw's key into a different constant: a
// kernel of its own per draw, and the chain duplicated into each kernel,
// so compile time grew superlinearly with the number of draws.)
//
// The bits are counter-based (SplitMix64 over a per-graph key, G the 64-bit
// golden ratio, mix its finalizer): element i of the draw at offset c is
// mix(key + (c * 2^40 + i) * G): a few elementwise integer ops per draw,
// the same bits on every backend (see draw_bits).
//
// Ops (operands; attributes after ';'):
//   rng_advance(state, count)                          -> state + [0, count]
//   rng(state, stream; kind, dtype, dims, a, b)        -> floats: kind 0 uniform [a, b),
//        1 normal (mean a, std b), 2 log-normal, 3 exponential (rate a),
//        4 cauchy (median a, sigma b)
//   rng_int(state, stream; dtype, dims, low, range - 1) -> low + (bits mod range); range is
//        an unsigned 64-bit count (range - 1 given as its i64 bit pattern)
//   rng_bernoulli(state, stream[, p]; dtype, dims, p)  -> uniform < p (p: tensor or number)
//   rng_perm(state, stream; dtype, n)                  -> a random permutation of 0..n-1
//   masked_scale(x, mask; scale)                       -> x * mask * scale (dropout fwd/bwd)
#include <cmath>
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
namespace {

std::string tstr(const Dims& d, const char* elem) {
  std::string s = "tensor<";
  for (auto x : d) s += std::to_string(x) + "x";
  return s + elem + ">";
}

// An unsigned constant of dims d, emitted once per lowering (and region):
// the draws of a graph share their constants, so a graph of many draws
// hands XLA fewer instructions to parse and deduplicate.
std::string ucon(LowerCtx& cx, const std::string& value, const Dims& d, const char* elem = "ui64") {
  std::string ty = tstr(d, elem);
  return cx.memo("rng_const " + value + " " + ty, [&] {
    std::string c = tstr({}, elem);
    std::string k = cx.op("stablehlo.constant", {}, {}, c, "value = dense<" + value + "> : " + c);
    if (d.empty()) return k;
    return cx.op("stablehlo.broadcast_in_dim", {k}, {c}, ty, "broadcast_dimensions = array<i64>");
  });
}

std::string ushift(LowerCtx& cx, const std::string& v, const Dims& d, const char* elem, int bits) {
  std::string ty = tstr(d, elem);
  return cx.op("stablehlo.shift_right_logical", {v, ucon(cx, std::to_string(bits), d, elem)}, {ty, ty}, ty);
}

const char* kGolden = "11400714819323198485";  // 2^64 / golden ratio, odd

// SplitMix64's finalizer (a bijection of 64-bit words) on tensor<d x ui64>.
std::string mix64(LowerCtx& cx, std::string z, const Dims& d) {
  std::string ty = tstr(d, "ui64");
  auto bin = [&](const char* op, const std::string& a, const std::string& b) { return cx.op(op, {a, b}, {ty, ty}, ty); };
  z = bin("stablehlo.xor", z, ushift(cx, z, d, "ui64", 30));
  z = bin("stablehlo.multiply", z, ucon(cx, "13787848793156543929", d));
  z = bin("stablehlo.xor", z, ushift(cx, z, d, "ui64", 27));
  z = bin("stablehlo.multiply", z, ucon(cx, "10723151780598845931", d));
  return bin("stablehlo.xor", z, ushift(cx, z, d, "ui64", 31));
}

// The bits of one draw: tensor<dims x elem> (elem "ui32" or "ui64") from
// operands 0 (the state, i64[2] = [seed, counter]) and 1 (the stream, an
// i64 scalar: stream(c) for the draw at offset c), counter-based, as
// SplitMix64: element i of the draw at offset c is
// mix(key + (c * 2^40 + i) * G) = mix(key + stream(c) + i * G), where key = (mix(seed +
// counter * G) + G) mod (2^64 - 1) is the same for every draw of a graph
// (computed once, see below) and draws never share a counter (a draw has
// fewer than 2^40 elements); ui32 takes the high half. Plain integer
// arithmetic on the device: the same bits on every backend, elementwise
// ops that XLA fuses into the draw's consumer. (One stablehlo.rng_bit_generator per draw,
// before, expanded into a Philox computation per draw: a graph of 500
// randn compiled 3x slower than the same graph with its random inputs
// uploaded, and superlinearly in the draws.)
constexpr int kOffsetShift = 40;  // a draw has fewer than 2^40 elements

std::string draw_bits(LowerCtx& cx, const Node& n, const Dims& d, const char* elem) {
  const std::string u1 = tstr({1}, "ui64"), u2 = tstr({2}, "ui64"), s0 = tstr({}, "ui64");
  auto bin = [&](const char* op, const std::string& a, const std::string& b, const std::string& ty) {
    return cx.op(op, {a, b}, {ty, ty}, ty);
  };
  std::string g = ucon(cx, kGolden, {});
  // The graph's key, emitted once per state value (and region), and kept
  // out of the draws' fusions: XLA copies cheap scalar ops into every
  // consumer's fusion, so its ~20 ops were compiled once per draw. A
  // remainder is one of the ops XLA's fusion does not duplicate (an
  // optimization barrier would be removed on CPU); key mod (2^64 - 1)
  // differs from key only for key = 2^64 - 1 (it becomes 0).
  std::string key = cx.memo("rng_key " + cx.in(n, 0), [&] {
    std::string s = cx.op("stablehlo.bitcast_convert", {cx.in(n, 0)}, {"tensor<2xi64>"}, u2);
    auto part = [&](int i) {
      std::string p = cx.op("stablehlo.slice", {s}, {u2}, u1,
                            "start_indices = array<i64: " + std::to_string(i) + ">, limit_indices = array<i64: " +
                                std::to_string(i + 1) + ">, strides = array<i64: 1>");
      return cx.op("stablehlo.reshape", {p}, {u1}, s0);
    };
    std::string k = mix64(cx, bin("stablehlo.add", part(0), bin("stablehlo.multiply", part(1), g, s0), s0), {});
    k = bin("stablehlo.add", k, g, s0);
    return bin("stablehlo.remainder", k, ucon(cx, "18446744073709551615", {}), s0);
  });
  int64_t numel = n.numel();  // d is the draw's shape or its flat form
  if (numel >= (int64_t(1) << kOffsetShift))
    op_error(n, "a random draw of " + std::to_string(numel) + " elements is too large (at most 2^40 - 1)");
  // z = base + i * G over the draw's elements, i = 0 .. numel - 1 in
  // row-major order, base = key + stream (one scalar per draw)
  std::string stream = cx.op("stablehlo.bitcast_convert", {cx.in(n, 1)}, {"tensor<i64>"}, s0);
  std::string base = bin("stablehlo.add", key, stream, s0);
  // computed over the flat draw, reshaped at the end: XLA then counts one
  // iota, not one per dimension combined by multiply-adds
  Dims fd{numel};
  std::string flat = tstr(fd, "ui64");
  std::string ig = cx.memo("rng_iota_g " + flat, [&] {  // i * G, shared by the draws of one size
    std::string i = cx.op("stablehlo.iota", {}, {}, flat, "iota_dimension = 0 : i64");
    return bin("stablehlo.multiply", i, ucon(cx, kGolden, fd), flat);
  });
  std::string b = cx.op("stablehlo.broadcast_in_dim", {base}, {s0}, flat, "broadcast_dimensions = array<i64>");
  std::string bits = mix64(cx, bin("stablehlo.add", b, ig, flat), fd);
  if (std::string(elem) == "ui32")
    bits = cx.op("stablehlo.convert", {ushift(cx, bits, fd, "ui64", 32)}, {flat}, tstr(fd, "ui32"));
  if (d == fd) return bits;
  return cx.op("stablehlo.reshape", {bits}, {tstr(fd, elem)}, tstr(d, elem));
}

// Uniform floats of type c (F32 or F64) from m random bits k (m <= 24 for
// F32, <= 53 for F64): k * 2^-m in [0, 1), exact in a dtype with m mantissa
// bits, never 1. With open=true: (2k + 1) * 2^-m - 1 = k * 2^(1-m) + (2^-m - 1),
// in the open interval (-1, 1), symmetric around 0, computed exactly.
std::string uniform_bits(LowerCtx& cx, const Node& n, const Dims& d, DType c, int m, bool open) {
  // the top m of the 64 bits (for F32 the same value as the top m of the
  // high 32-bit half), converted exactly, through a signed integer of the
  // float's width (k < 2^m fits): CPUs convert signed integers to floats in
  // one vector instruction, unsigned 64-bit ones in a long sequence that
  // XLA:CPU compiled into every draw
  std::string k = ushift(cx, draw_bits(cx, n, d, "ui64"), d, "ui64", 64 - m);
  std::string ty = LowerCtx::type(c, d);
  std::string ity = tstr(d, c == DType::F64 ? "i64" : "i32");
  std::string ki = cx.op("stablehlo.convert", {k}, {tstr(d, "ui64")}, ity);
  std::string kf = cx.op("stablehlo.convert", {ki}, {ity}, ty);
  if (!open) return cx.op("stablehlo.multiply", {kf, cx.constant(std::ldexp(1.0, -m), c, d)}, {ty, ty}, ty);
  std::string s = cx.op("stablehlo.multiply", {kf, cx.constant(std::ldexp(1.0, 1 - m), c, d)}, {ty, ty}, ty);
  return cx.op("stablehlo.add", {s, cx.constant(std::ldexp(1.0, -m) - 1.0, c, d)}, {ty, ty}, ty);
}

int mantissa_bits(DType t) {
  switch (t) {
    case DType::F16: return 11;
    case DType::BF16: return 8;
    case DType::F64: return 53;
    default: return 24;
  }
}

DType compute_t(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// A draw is computed over its elements in a flat vector (Dims{n.numel()})
// and reshaped at the end: a reshape in the middle of the draw's
// elementwise ops made XLA's simplifier move it past them one op per round,
// and its fix-point pipeline ran extra rounds over the whole graph
// (RNG-heavy graphs then compiled ~1.5x the instructions of the same graph
// without RNG).

// Operands 0 (the state) and 1 (a stream or count: an int64 scalar).
void check_state(const Node& n) {
  if (n.operands.size() < 2) op_error(n, "expected (state, stream) operands");
  const Node& s = *n.operands[0];
  if (s.dtype != DType::I64 || s.dims != Dims{2})
    op_error(n, "the RNG state must be an int64 tensor of shape [2], got " + std::string(dtype_name(s.dtype)) +
                    " " + dims_str(s.dims));
  const Node& o = *n.operands[1];
  if (o.dtype != DType::I64 || !o.dims.empty())
    op_error(n, "the RNG stream (or count) must be an int64 scalar, got " + std::string(dtype_name(o.dtype)) + " " +
                    dims_str(o.dims));
}

TXC_OP("rng_advance", 2,
       [](Node& n) {
         check_state(n);
         n.dtype = DType::I64;
         n.dims = {2};
       },
       [](LowerCtx& cx, const Node& n) {  // state + [0, count]
         std::string ty = "tensor<2xi64>";
         std::string zero = cx.op("stablehlo.constant", {}, {}, "tensor<1xi64>", "value = dense<0> : tensor<1xi64>");
         std::string k = cx.op("stablehlo.reshape", {cx.in(n, 1)}, {"tensor<i64>"}, "tensor<1xi64>");
         k = cx.op("stablehlo.concatenate", {zero, k}, {"tensor<1xi64>", "tensor<1xi64>"}, ty, "dimension = 0 : i64");
         return cx.op("stablehlo.add", {cx.in(n, 0), k}, {ty, ty}, ty);
       });

enum Kind { kUniform, kNormal, kLogNormal, kExponential, kCauchy };

TXC_OP("rng", 2,
       [](Node& n) {
         check_state(n);
         n.dtype = DType(n.attr_int(1));
         n.dims = n.attr_dims(2);
         if (!is_floating(n.dtype))
           op_error(n, std::string("expected a floating-point dtype, got ") + dtype_name(n.dtype));
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims d{n.numel()};
         DType c = compute_t(n.dtype);
         std::string ty = LowerCtx::type(c, d);
         double a = n.attr_float(3), b = n.attr_float(4);
         auto bin = [&](const char* op, const std::string& x, const std::string& y) {
           return cx.op(op, {x, y}, {ty, ty}, ty);
         };
         auto un = [&](const char* op, const std::string& x) { return cx.op(op, {x}, {ty}, ty); };
         auto k = [&](double v) { return cx.constant(v, c, d); };
         std::string r;
         switch (Kind(n.attr_int(0))) {
           case kUniform: {
             r = uniform_bits(cx, n, d, c, mantissa_bits(n.dtype), false);
             if (a != 0 || b != 1) r = bin("stablehlo.add", bin("stablehlo.multiply", r, k(b - a)), k(a));
             break;
           }
           case kNormal:
           case kLogNormal: {
             std::string v = uniform_bits(cx, n, d, c, c == DType::F64 ? 53 : 24, true);
             r = bin("stablehlo.multiply", un("chlo.erf_inv", v), k(M_SQRT2));
             if (b != 1) r = bin("stablehlo.multiply", r, k(b));
             if (a != 0) r = bin("stablehlo.add", r, k(a));
             if (n.attr_int(0) == kLogNormal) r = un("stablehlo.exponential", r);
             break;
           }
           case kExponential: {  // -log(1 - u) / rate
             std::string u = uniform_bits(cx, n, d, c, c == DType::F64 ? 53 : 24, false);
             r = bin("stablehlo.divide", un("stablehlo.negate", un("stablehlo.log_plus_one", un("stablehlo.negate", u))),
                     k(a));
             break;
           }
           case kCauchy: {  // median + sigma * tan(pi * (u - 1/2)), u in (0, 1)
             std::string v = uniform_bits(cx, n, d, c, c == DType::F64 ? 53 : 24, true);  // (-1, 1)
             r = un("stablehlo.tan", bin("stablehlo.multiply", v, k(M_PI / 2)));
             r = bin("stablehlo.add", bin("stablehlo.multiply", r, k(b)), k(a));
             break;
           }
           default: op_error(n, "unknown distribution kind " + std::to_string(n.attr_int(0)));
         }
         return cx.reshape(cx.convert(r, c, n.dtype, d), n.dtype, d, n.dims);
       });

TXC_OP("rng_int", 2,
       [](Node& n) {
         check_state(n);
         n.dtype = DType(n.attr_int(0));
         n.dims = n.attr_dims(1);
         if (is_complex(n.dtype)) op_error(n, "complex dtypes are not supported");
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims d{n.numel()};
         uint64_t range = uint64_t(n.attr_int(3)) + 1;  // 0: all 2^64 values
         int64_t low = n.attr_int(2);
         bool wide = range == 0 || range >= (uint64_t(1) << 32);
         const char* elem = wide ? "ui64" : "ui32";
         std::string uty = tstr(d, elem), ity = LowerCtx::type(DType::I64, d);
         std::string r = draw_bits(cx, n, d, elem);
         if (range != 0) {
           std::string c = tstr({}, elem);
           std::string m = cx.op("stablehlo.constant", {}, {}, c,
                                 "value = dense<" + std::to_string(range) + "> : " + c);
           if (!d.empty()) m = cx.op("stablehlo.broadcast_in_dim", {m}, {c}, uty, "broadcast_dimensions = array<i64>");
           r = cx.op("stablehlo.remainder", {r, m}, {uty, uty}, uty);
         }
         r = wide ? cx.op("stablehlo.bitcast_convert", {r}, {uty}, ity) : cx.op("stablehlo.convert", {r}, {uty}, ity);
         if (low != 0) {
           std::string lc = cx.op("stablehlo.constant", {}, {}, "tensor<i64>",
                                  "value = dense<" + std::to_string(low) + "> : tensor<i64>");
           lc = cx.broadcast(lc, DType::I64, {}, d);
           r = cx.op("stablehlo.add", {r, lc}, {ity, ity}, ity);
         }
         return cx.reshape(cx.convert(r, DType::I64, n.dtype, d), n.dtype, d, n.dims);
       });

TXC_OP("rng_bernoulli", -1,
       [](Node& n) {
         if (n.operands.size() != 2 && n.operands.size() != 3) op_error(n, "expected (state, stream[, p]) operands");
         check_state(n);
         n.dtype = DType(n.attr_int(0));
         n.dims = n.attr_dims(1);
         if (n.operands.size() == 3) {
           const Node& p = *n.operands[2];
           if (!is_floating(p.dtype))
             op_error(n, std::string("expected a floating-point probability tensor, got ") + dtype_name(p.dtype));
           if (broadcast_dims(n, p.dims, n.dims) != n.dims)
             op_error(n, "probability of shape " + dims_str(p.dims) + " doesn't broadcast to " + dims_str(n.dims));
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims& d = n.dims;
         bool has_p = n.operands.size() == 3;
         DType c = has_p && n.operands[2]->dtype == DType::F64 ? DType::F64 : DType::F32;
         const Dims fd{n.numel()};
         std::string u = uniform_bits(cx, n, fd, c, c == DType::F64 ? 53 : 24, false);
         std::string p = has_p ? cx.reshape(cx.coerce(n, 2, c, d), c, d, fd) : cx.constant(n.attr_float(2), c, fd);
         std::string r = cx.compare(u, p, c, fd, "LT");
         if (n.dtype != DType::Bool)
           r = cx.op("stablehlo.convert", {r}, {LowerCtx::type(DType::Bool, fd)}, LowerCtx::type(n.dtype, fd));
         return cx.reshape(r, n.dtype, fd, d);
       });

TXC_OP("rng_perm", 2,
       [](Node& n) {
         check_state(n);
         n.dtype = DType(n.attr_int(0));
         n.dims = {n.attr_int(1)};
       },
       [](LowerCtx& cx, const Node& n) {
         const Dims& d = n.dims;
         std::string keys = draw_bits(cx, n, d, "ui64");
         std::string ity = LowerCtx::type(DType::I64, d), kty = tstr(d, "ui64");
         std::string idx = cx.op("stablehlo.iota", {}, {}, ity, "iota_dimension = 0 : i64");
         // the sort's region: (key a, key b, index, index) -> a < b on the unsigned keys
         std::string su = tstr({}, "ui64"), si = "tensor<i64>", bt = "tensor<i1>";
         std::vector<std::string> args{cx.fresh(), cx.fresh(), cx.fresh(), cx.fresh()};
         std::string region = "(" + cx.region_text(args, {su, su, si, si}, [&] {
           std::string lt = cx.op("stablehlo.compare", {args[0], args[1]}, {su, su}, bt,
                                  LowerCtx::compare_props(DType::I64, "LT", "UNSIGNED"));
           cx.region_return({lt}, {bt});
         }) + ")";
         std::string r = cx.op_multi("stablehlo.sort", {keys, idx}, {kty, ity}, {kty, ity},
                                     "dimension = 0 : i64, is_stable = true", region);
         return cx.convert(r + "#1", DType::I64, n.dtype, d);
       });

// x * mask * scale, computed in f32 for 16-bit floats (as torch's dropout does).
TXC_OP("masked_scale", 2,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const Node& m = *n.operands[1];
         if (!is_floating(x.dtype)) op_error(n, std::string("expected a floating-point tensor, got ") + dtype_name(x.dtype));
         if (m.dims != x.dims) op_error(n, "mask shape " + dims_str(m.dims) + " differs from " + dims_str(x.dims));
         n.dtype = x.dtype;
         n.dims = x.dims;
       },
       [](LowerCtx& cx, const Node& n) {
         DType c = compute_t(n.dtype);
         const Dims& d = n.dims;
         std::string ty = LowerCtx::type(c, d);
         std::string x = cx.coerce(n, 0, c, d), m = cx.coerce(n, 1, c, d);
         std::string r = cx.op("stablehlo.multiply", {x, m}, {ty, ty}, ty);
         r = cx.op("stablehlo.multiply", {r, cx.constant(n.attr_float(0), c, d)}, {ty, ty}, ty);
         return cx.convert(r, c, n.dtype, d);
       });

}  // namespace
}  // namespace txc

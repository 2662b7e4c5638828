// Element types and PyTorch's type-promotion rules (c10/core/ScalarType.h,
// ATen/native/TypeProperties.cpp), restated for the core's dtypes.
#include "ir/dtype.h"
#include <cmath>
#include <stdexcept>

namespace txc {

const char* mlir_name(DType t) {
  static const char* n[] = {"i1", "ui8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "complex<f32>", "complex<f64>"};
  return n[int(t)];
}
const char* dtype_name(DType t) {
  static const char* n[] = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"};
  return n[int(t)];
}
int bit_width(DType t) {
  static const int w[] = {1, 8, 8, 16, 32, 64, 16, 16, 32, 64, 64, 128};
  return w[int(t)];
}

double lowest_value(DType t) {
  if (is_floating(t)) return -INFINITY;
  if (t == DType::Bool || t == DType::U8) return 0;
  return -std::ldexp(1.0, bit_width(t) - 1);
}

double highest_value(DType t) {
  if (is_floating(t)) return INFINITY;
  if (t == DType::Bool) return 1;
  if (t == DType::U8) return 255;
  return std::ldexp(1.0, bit_width(t) - 1) - 1;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  using D = DType;
  // Table from c10's promoteTypes, restricted to our types.
  static const D B = D::Bool, U1 = D::U8, I1 = D::I8, I2 = D::I16, I4 = D::I32, I8 = D::I64,
                 F2 = D::F16, BF = D::BF16, F4 = D::F32, F8 = D::F64, C8 = D::C64, CG = D::C128;
  static const D table[12][12] = {
      /*        b   u1  i1  i2  i4  i8  f2  bf  f4  f8  c8  c16 */
      /* b  */ {B, U1, I1, I2, I4, I8, F2, BF, F4, F8, C8, CG},
      /* u1 */ {U1, U1, I2, I2, I4, I8, F2, BF, F4, F8, C8, CG},
      /* i1 */ {I1, I2, I1, I2, I4, I8, F2, BF, F4, F8, C8, CG},
      /* i2 */ {I2, I2, I2, I2, I4, I8, F2, BF, F4, F8, C8, CG},
      /* i4 */ {I4, I4, I4, I4, I4, I8, F2, BF, F4, F8, C8, CG},
      /* i8 */ {I8, I8, I8, I8, I8, I8, F2, BF, F4, F8, C8, CG},
      /* f2 */ {F2, F2, F2, F2, F2, F2, F2, F4, F4, F8, C8, CG},
      /* bf */ {BF, BF, BF, BF, BF, BF, F4, BF, F4, F8, C8, CG},
      /* f4 */ {F4, F4, F4, F4, F4, F4, F4, F4, F4, F8, C8, CG},
      /* f8 */ {F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, CG, CG},
      /* c8 */ {C8, C8, C8, C8, C8, C8, C8, C8, C8, CG, C8, CG},
      /* c16*/ {CG, CG, CG, CG, CG, CG, CG, CG, CG, CG, CG, CG},
  };
  return table[int(a)][int(b)];
}

static int category(DType t) { return is_bool(t) ? 0 : is_integral(t) ? 1 : is_floating(t) ? 2 : 3; }

// c10's combine_categories: the higher-priority class wins unless the lower
// one is of a higher category (int < float < complex).
static int combine(int higher, int lower) {
  if (higher < 0) return lower;
  if (lower < 0) return higher;
  DType h = DType(higher), l = DType(lower);
  if (is_complex(h)) return higher;
  if (is_floating(h) && !is_complex(l)) return higher;
  if (is_bool(h) || category(l) > category(h)) {
    if (is_complex(l) && is_floating(h)) return int(complex_dtype_of(h));  // c10: toComplexType(higher)
    return int(promote_types(h, l));
  }
  return higher;
}

void ResultType::add(DType t, int rank, bool wrapped_number) {
  if (wrapped_number) {
    // Python numbers take the default dtype of their category.
    DType d = is_bool(t) ? DType::Bool : is_integral(t) ? DType::I64 : is_floating(t) ? DType::F32 : DType::C64;
    wrapped = wrapped < 0 ? int(d) : int(promote_types(DType(wrapped), d));
  } else if (rank == 0) {
    zero = zero < 0 ? int(t) : int(promote_types(DType(zero), t));
  } else {
    dim = dim < 0 ? int(t) : int(promote_types(DType(dim), t));
  }
}

DType ResultType::result() const {
  int r = combine(dim, combine(zero, wrapped));
  if (r < 0) throw std::runtime_error("result_type: no operands");
  return DType(r);
}

}  // namespace txc

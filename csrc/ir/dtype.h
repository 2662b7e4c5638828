// Element types of the core and PyTorch's type-promotion rules over them.
#pragma once
#include <cstdint>
#include <string>

namespace txc {

// Codes are shared with Python (torch_xla_core/_runtime/dtypes.py); keep them in sync.
enum class DType : uint8_t { Bool, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64, C128, kCount };

const char* mlir_name(DType t);   // "i1", "f32", ...
const char* dtype_name(DType t);  // "bool", "float32", ... (for errors)
int bit_width(DType t);
inline bool is_bool(DType t) { return t == DType::Bool; }
inline bool is_unsigned(DType t) { return t == DType::U8; }
inline bool is_integral(DType t) { return t >= DType::U8 && t <= DType::I64; }
inline bool is_floating(DType t) { return t >= DType::F16 && t <= DType::F64; }
inline bool is_complex(DType t) { return t == DType::C64 || t == DType::C128; }
// A complex dtype's component type (f32 for complex64); other dtypes as they are.
inline DType real_part_dtype(DType t) { return t == DType::C64 ? DType::F32 : t == DType::C128 ? DType::F64 : t; }
// The complex dtype whose components are t (float64 -> complex128; other
// floating types -> complex64: there is no complex32 on XLA).
inline DType complex_dtype_of(DType t) { return t == DType::F64 || t == DType::C128 ? DType::C128 : DType::C64; }

// The smallest and largest values of a dtype (-inf/inf for floating types):
// the identities of max and min reductions.
double lowest_value(DType t);
double highest_value(DType t);

// torch.promote_types for two dtypes.
DType promote_types(DType a, DType b);

// torch.result_type over operands of three priority classes: tensors with
// dims, zero-dim tensors, and wrapped Python numbers.
struct ResultType {
  int dim = -1, zero = -1, wrapped = -1;  // -1: no operand of that class yet
  void add(DType t, int rank, bool wrapped_number);
  DType result() const;
};

}  // namespace txc

"""Dtype codes shared with the C++ core (csrc/ir/dtype.h), and their torch,
numpy and MLIR names."""
import ml_dtypes
import numpy as np
import torch

# Order matches txc::DType.
TORCH = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
         torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
NUMPY = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
         np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64]
CODE = {t: i for i, t in enumerate(TORCH)}
NP_CODE = {np.dtype(t): i for i, t in enumerate(NUMPY)}

BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64 = range(11)


def code(dtype: torch.dtype) -> int:
    try:
        return CODE[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the xla device; "
                        f"supported: {', '.join(str(t) for t in TORCH)}") from None

"""Dtype codes shared with the C++ core (csrc/ir/dtype.h), and their torch,
numpy and MLIR names."""
import ml_dtypes
import numpy as np
import torch

# Order matches txc::DType.
TORCH = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
         torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
NUMPY = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
         np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128]
CODE = {t: i for i, t in enumerate(TORCH)}
NP_CODE = {np.dtype(t): i for i, t in enumerate(NUMPY)}

BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64, C128 = range(12)


class UnsupportedDtype(TypeError):
    """A dtype the device cannot hold; at(op) names the op that met it.
    (A TypeError: torch's Tensor operators turn TypeError into NotImplemented,
    so operand paths re-raise it as RuntimeError, see _tensor.v.)"""

    def __init__(self, dtype, op=None):
        self.dtype, self.op = dtype, op
        where = f" ({op})" if op else ""
        if dtype == torch.complex32:
            msg = (f"complex32 (chalf) is not supported on the xla device{where}: XLA has no complex type with "
                   f"16-bit parts; use complex64 (tensor.to(torch.complex64))")
        else:
            msg = (f"dtype {dtype} is not supported on the xla device{where}; supported: "
                   f"{', '.join(str(t) for t in TORCH)}")
        super().__init__(msg)

    def at(self, op):
        """The same error naming `op` (the outermost op that reports it wins:
        torch.complex rather than the new_empty its decomposition calls)."""
        return UnsupportedDtype(self.dtype, op)


def code(dtype: torch.dtype) -> int:
    """The core's code for dtype. Dtypes without one (complex32, the unsigned
    and float8 types) are refused here, where every tensor enters the core."""
    c = CODE.get(dtype)
    if c is None:
        raise UnsupportedDtype(dtype)
    return c

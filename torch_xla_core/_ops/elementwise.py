"""Elementwise aten ops -> core elementwise ops (csrc/ops/elementwise.cpp,
csrc/ops/activation.cpp). Promotion and broadcasting happen in the core."""
import functools

import torch
from torch._decomp import decomposition_table

from .._runtime.dtypes import UnsupportedDtype, code
from .._tracing import checks as _checks, device as _device, tensor as _tensor
from .. import metrics
from .._tracing.tensor import OP, XlaTensor, lazy_op, wrapped_op, device_error
from . import (XLA, Arg, assign, aten, check_fill, check_no_partial_overlap, convert, decomposed, full_like, impl,
               mapping)
from .dtype_rules import BOOL, INTEGRAL, INTEGRAL_PROMOTED, check_broadcast, refusal

# Dtypes that torch's kernels refuse (NotImplementedError) and the core rows
# refuse at trace time (csrc/ops/elementwise.cpp: NO_BOOL, NO_BOOL_OPERAND,
# Kind::Integral): each mapping's check= words the refusal as torch, at no
# cost to the calls the core takes.
_NEG_BOOL = ("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, "
             "use the `~` or `logical_not()` operator instead.")
_SUB_BOOLS = "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` " \
             "operator instead."
_SUB_BOOL = ("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
             "use the `~` or `logical_not()` operator instead.")


def _refuse_bool_result(name, a, b):
    """Refuses a binary op that torch has no bool kernel for when its operands promote to bool."""
    if torch.result_type(a, b) == torch.bool:
        raise refusal(name, torch.bool)


def _no_bool_result(name):
    """check= of such an op."""
    return lambda a, b, *_, **__: _refuse_bool_result(name, a, b)


def _check_integer_divisor(name, a, b):
    """torch's integer kernels of floor/trunc division, fmod and remainder
    raise ZeroDivisionError (a RuntimeError) on a zero divisor, where the
    device would return a value: a number is checked here, a tensor by a
    deferred check (checks.require) that the next sync computes."""
    dt = torch.result_type(a, b)
    if dt.is_floating_point or dt.is_complex:
        return
    message = (f"ZeroDivisionError: {name} of integers ({dt}) by zero: the divisor holds a 0 (torch's integer "
               f"kernels raise here too; divide floating tensors for inf/nan instead)")
    if isinstance(b, XlaTensor):
        _checks.require((b == 0).any()._lt, message, RuntimeError)
    elif bool((b == 0).any()) if isinstance(b, torch.Tensor) else b == 0:  # a number, or a CPU scalar tensor
        raise RuntimeError(message)


def _integral_only(name, bools=True):
    """check= of a bitwise op (core Kind::Integral): torch has no floating or
    complex kernel (nor a bool one for shifts: bools=False)."""
    def check(a, b=None, *_, **__):
        d = a.dtype if b is None else torch.result_type(a, b)
        if d.is_floating_point or d.is_complex or (d == torch.bool and not bools):
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                check_broadcast(a, b)
            raise refusal(name, d, "an integer")
    return check


def _check_neg(x, *_, **__):
    if x.dtype == torch.bool:
        raise NotImplementedError(f"neg: {_NEG_BOOL}")


def _check_sub(a, b, *_, **__):
    """torch's sub_check: no bool operand, tensor or number."""
    bools = [isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool) for x in (a, b)]
    if any(bools):
        raise NotImplementedError(f"sub: {_SUB_BOOLS if all(bools) else _SUB_BOOL}")


_CHECKS = {"neg": _check_neg,
           "bitwise_left_shift": _integral_only("bitwise_left_shift", bools=False),
           "bitwise_right_shift": _integral_only("bitwise_right_shift", bools=False),
           **{n: _integral_only(n) for n in ("bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor")}}


# Overloads that are one core op: mapping() rows (the C++ fast path and the
# handler in one declaration).
for _aten, _core in [
    ("neg", "neg"), ("abs", "abs"), ("sign", "sign"), ("exp", "exp"), ("expm1", "expm1"), ("log", "log"),
    ("log1p", "log1p"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"), ("tanh", "tanh"), ("sigmoid", "sigmoid"),
    ("sin", "sin"), ("cos", "cos"), ("tan", "tan"), ("erf", "erf"), ("erfinv", "erfinv"), ("atan", "atan"),
    ("asin", "asin"), ("acos", "acos"), ("sinh", "sinh"), ("cosh", "cosh"), ("floor", "floor"),
    ("ceil", "ceil"), ("round", "round"), ("trunc", "trunc"), ("reciprocal", "reciprocal"),
    ("bitwise_not", "bitwise_not"), ("logical_not", "logical_not"), ("isnan", "isnan"),
]:
    mapping(getattr(aten, _aten).default, op=_core, ranks=(XLA,), check=_CHECKS.get(_core))

for _aten, _core in [
    ("maximum", "maximum"), ("minimum", "minimum"), ("atan2", "atan2"), ("logical_and", "logical_and"),
    ("logical_or", "logical_or"), ("logical_xor", "logical_xor"), ("bitwise_and", "bitwise_and"), ("bitwise_or", "bitwise_or"), ("bitwise_xor", "bitwise_xor"),
    ("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"),
]:
    _packet = getattr(aten, _aten)
    for _ov in ("Tensor", "Scalar", "Scalar_Tensor", "default"):
        if _ov in _packet.overloads():
            _o = getattr(_packet, _ov)
            if any(str(a.type) == "Tensor" for a in _o._schema.arguments):  # eq.default etc. take numbers only
                mapping(_o, op=_core, check=_CHECKS.get(_core))

# Shifts: torch's two spellings (bitwise_*_shift, the operators' __*shift__), every tensor overload.
for _packet, _core in [(aten.bitwise_left_shift, "bitwise_left_shift"), (aten.__lshift__, "bitwise_left_shift"),
                       (aten.bitwise_right_shift, "bitwise_right_shift"), (aten.__rshift__, "bitwise_right_shift")]:
    for _ov in ("Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor"):
        if _ov in _packet.overloads():
            mapping(getattr(_packet, _ov), op=_core, check=_CHECKS[_core])

_OP_ADD, _OP_SUB, _OP_MUL = OP.add, OP.sub, OP.mul
add = mapping(aten.add.Tensor, aten.add.Scalar, op="add")
sub = mapping(aten.sub.Tensor, aten.sub.Scalar, op="sub", check=_check_sub)
mul = mapping(aten.mul.Tensor, aten.mul.Scalar, op="mul")
div = mapping(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor, op="div")


_HALF = (torch.float16, torch.bfloat16)


_FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _half_result(*xs):
    """The result dtype when it is float16/bfloat16 (torch's kernels then compute in float32), else None."""
    dt = None
    for x in xs:  # the common case without dispatching torch.result_type: tensors of one floating dtype
        if isinstance(x, torch.Tensor):
            if dt is None:
                dt = x.dtype
            elif x.dtype != dt:
                break
        elif isinstance(x, complex):
            break
    else:
        if dt in _FLOATING:  # real numbers do not promote a floating tensor
            return dt if dt in _HALF else None
    dt = torch.result_type(*xs) if len(xs) == 2 else torch.promote_types(torch.result_type(*xs[:2]),
                                                                             torch.result_type(xs[0], xs[2]))
    return dt if dt in _HALF else None


_OP_CONVERT, _F32 = OP.convert, code(torch.float32)


def _in_f32(x):
    """x as a float32 core operand: an xla tensor's convert node as a LazyTensor (no wrapper), else x.float()."""
    if type(x) is XlaTensor:
        return x if x.dtype == torch.float32 else lazy_op(_OP_CONVERT, (x,), (_F32,))
    return x.float()


def _as(x, dt):
    """x in dtype dt: x.to(dt) without a trip through torch's dispatcher for an xla tensor (the same node)."""
    return convert(x, dt) if isinstance(x, XlaTensor) else x.to(dt)


def _cast_number(x, dt):
    """A Python number as TensorIterator casts it to a half dtype (rounded)."""
    return float(torch.tensor(x, dtype=dt))


def _scaled(op, a, b, alpha):
    """a op alpha*b (add/sub with alpha). On half dtypes as ATen: alpha (and a
    number operand) cast to the half dtype, then computed in float32 and
    rounded once — not b*alpha rounded and then added."""
    if alpha == 1:
        return wrapped_op(op, (a, b), ())
    dt = _half_result(a, b)
    if dt is None:
        return wrapped_op(op, (a, wrapped_op(_OP_MUL, (b, alpha), ())), ())
    f = [_as(x, torch.float32) if isinstance(x, torch.Tensor) else _cast_number(x, dt) for x in (a, b)]
    return convert(wrapped_op(op, (f[0], wrapped_op(_OP_MUL, (f[1], _cast_number(alpha, dt)), ())), ()), dt)


@impl(aten.add.Tensor, aten.add.Scalar)
def add_scaled(a, b, *, alpha=1):
    """add's calls with alpha (its mapping takes the others)."""
    return _scaled(_OP_ADD, a, b, alpha)


@impl(aten.sub.Tensor, aten.sub.Scalar)
def sub_scaled(a, b, *, alpha=1):
    """sub's calls with alpha (its mapping takes the others)."""
    return _scaled(_OP_SUB, a, b, alpha)


@impl(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, *, alpha=1):
    _check_sub(a, b)
    return sub_scaled(b, a, alpha=alpha) if isinstance(b, XlaTensor) else _scaled(_OP_SUB, b, a, alpha)


@impl(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise RuntimeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    return _integer_division(f"div(rounding_mode={rounding_mode!r})",
                             OP.div_trunc if rounding_mode == "trunc" else OP.div_floor, a, b)


@impl(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    return _integer_division("floor_divide", OP.div_floor, a, b)


@impl(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(a, b):
    return _integer_division("fmod", OP.fmod, a, b)


@impl(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a, b):
    return _integer_division("remainder", OP.remainder, a, b)


def _integer_division(name, op, a, b):
    """The ops whose integer kernels refuse a zero divisor (_check_integer_divisor)."""
    _refuse_bool_result(name, a, b)
    _check_integer_divisor(name, a, b)
    return wrapped_op(op, (a, b), ())


def _is_bool(x):
    return isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool)


@impl(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(a, b):
    # Result dtype as torch: promotion of a and b (x ** 2.0 on ints is float),
    # except bool ** bool-scalar, which stays bool. Shortcuts only where they
    # give that dtype.
    if _is_bool(a) and _is_bool(b):
        if isinstance(a, XlaTensor) and isinstance(b, bool):
            if b:
                return wrapped_op(OP.alias, (a._lt,), ())
            return wrapped_op(OP.full, (), (1.0, code(torch.bool), list(a.shape)))
        raise NotImplementedError('"pow" not implemented for \'Bool\'')
    if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, XlaTensor):
        floating = a.is_floating_point()
        if not floating and isinstance(b, int) and b < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        if floating or (isinstance(b, int) and a.dtype != torch.bool):  # the result has a's dtype
            if b == 2:
                return mul(a, a)
            if b == 1:
                return wrapped_op(OP.alias, (a._lt,), ())
        if b == 0.5:
            return wrapped_op(OP.sqrt, (a._lt,), ())  # float result, as a ** 0.5
    return wrapped_op(OP.pow, (a, b), ())


@impl(aten.equal.default)
def equal(a, b):
    # torch.equal refuses other devices, CPU 0-d tensors included
    for t in (a, b):
        if not isinstance(t, XlaTensor):
            raise device_error(t)
    if a.shape != b.shape:
        return False
    return a.numel() == 0 or bool(wrapped_op(OP.all, (lazy_op(OP.eq, (a._lt, b._lt), ()),), ([], False)).item())


@impl(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(cond, a, b):
    return wrapped_op(OP.where, (cond, a, b), ())


_CLAMP_COMPLEX = ("clamp is not supported for complex types (torch's kernels refuse them too): clamp the real "
                  "and imaginary parts, or the magnitude, explicitly")


@impl(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    if x.is_complex():
        raise NotImplementedError(_CLAMP_COMPLEX)
    r = x
    if min is not None:
        r = wrapped_op(OP.maximum, (r._lt, min), ())
    if max is not None:
        r = wrapped_op(OP.minimum, (r._lt, max), ())
    if r is x:
        raise RuntimeError("clamp: at least one of 'min' or 'max' must not be None")
    return r


impl(aten.clamp_min.default, aten.clamp_min.Tensor)(lambda x, m: clamp(x, min=m))
impl(aten.clamp_max.default, aten.clamp_max.Tensor)(lambda x, m: clamp(x, max=m))


@impl(aten.lerp.Scalar, aten.lerp.Tensor, refuses=INTEGRAL_PROMOTED)
def lerp(a, b, w):
    """ATen's formula: a + w (b - a) where |w| < 0.5, else b - (b - a)(1 - w)
    (exact at w = 0 and w = 1); half dtypes compute in float32 with the
    weight at full precision and round once."""
    dt = _half_result(a, b, w)
    number = not isinstance(w, torch.Tensor)
    if dt is None:
        return _lerp(a, b, w, number, a.dtype, wrapped_op)
    r = _lerp(_in_f32(a), _in_f32(b), w if number else _in_f32(w), number, torch.float32, lazy_op)
    return wrapped_op(_OP_CONVERT, (r,), (code(dt),))


def _lerp(a, b, w, number, a_dtype, out):
    """lerp of core operands (xla tensors, LazyTensors), a of dtype a_dtype; the last node made by
    out (wrapped_op: an xla tensor, lazy_op: a LazyTensor), the intermediate ones as LazyTensors."""
    d = lazy_op(_OP_SUB, (b, a), ())
    if number:
        if abs(w) < 0.5:
            return out(_OP_ADD, (a, lazy_op(_OP_MUL, (w, d), ())), ())
        # 1 - w in the compute dtype, as ATen (the weight is cast first): 1 - 0.8 in float32 is not 0.2
        one_minus = float(1 - torch.tensor(w, dtype=torch.promote_types(a_dtype, torch.float32)))
        return out(_OP_SUB, (b, lazy_op(_OP_MUL, (d, one_minus), ())), ())
    low = lazy_op(_OP_ADD, (a, lazy_op(_OP_MUL, (w, d), ())), ())
    high = lazy_op(_OP_SUB, (b, lazy_op(_OP_MUL, (d, lazy_op(_OP_SUB, (1, w), ())), ())), ())
    return out(OP.where, (lazy_op(OP.lt, (lazy_op(OP.abs, (w,), ()), 0.5), ()), low, high), ())


def _addc(x, t1, t2, value, core):
    """x + value * t1 core t2, left to right as ATen's kernels ((value * t1) / t2 for addcdiv);
    half dtypes in float32 with value at full precision, rounded once; for an
    integer result, value is cast to it first (truncated; one it cannot hold
    raises torch's overflow error), as ATen's kernels do."""
    if isinstance(value, (int, float)) and not any(t.is_floating_point() or t.is_complex() for t in (x, t1, t2)):
        dims = [t.dtype for t in (x, t1, t2) if t.dim()] or [t.dtype for t in (x, t1, t2)]  # 0-d ones don't promote
        check_fill(value, functools.reduce(torch.promote_types, dims))
        value = int(value)
    dt = _half_result(x, t1, t2)
    if dt is None:
        t1 = t1 if value == 1 else lazy_op(_OP_MUL, (value, t1), ())
        return wrapped_op(_OP_ADD, (x, lazy_op(core, (t1, t2), ())), ())
    x, t1, t2 = _in_f32(x), _in_f32(t1), _in_f32(t2)
    r = lazy_op(_OP_ADD, (x, lazy_op(core, (t1 if value == 1 else lazy_op(_OP_MUL, (value, t1), ()), t2), ())), ())
    return wrapped_op(_OP_CONVERT, (r,), (code(dt),))


@impl(aten.addcmul.default, refuses=BOOL)
def addcmul(x, t1, t2, *, value=1):
    return _addc(x, t1, t2, value, _OP_MUL)


@impl(aten.addcdiv.default)
def addcdiv(x, t1, t2, *, value=1):
    return _addc(x, t1, t2, value, OP.div)


@impl(aten.relu.default)
def relu(x):
    if x.dtype == torch.bool:
        raise NotImplementedError("Boolean inputs not supported for relu (as in torch): cast the mask to a number")
    if x.is_complex():
        raise NotImplementedError(f"relu: {_CLAMP_COMPLEX}")
    return wrapped_op(OP.maximum, (x._lt, 0), ())


@impl(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    return where(wrapped_op(OP.gt, (x._lt, threshold), ()), grad, 0)


gelu = mapping(aten.gelu.default, op="gelu", ranks=(XLA,), attrs=(Arg("approximate"),))
gelu_backward = mapping(aten.gelu_backward.default, op="gelu_backward", ranks=(XLA, XLA),
                        attrs=(Arg("approximate"),))
silu = mapping(aten.silu.default, op="silu", ranks=(XLA,))


@impl(aten.silu_backward.default)
def silu_backward(grad, x):
    return wrapped_op(OP.silu_backward, (grad._lt, x._lt), ())


def _conj_of(y):
    return wrapped_op(OP.conj, (y._lt,), ()) if y.is_complex() else y


@impl(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    # grad * conj(y * (1 - y))
    y = _conj_of(y)
    one_minus = lazy_op(_OP_SUB, (1, y._lt), ())
    return wrapped_op(_OP_MUL, (grad._lt, lazy_op(_OP_MUL, (y._lt, one_minus), ())), ())


@impl(aten.tanh_backward.default)
def tanh_backward(grad, y):
    # grad * conj(1 - y^2)
    y = _conj_of(y)
    return wrapped_op(_OP_MUL, (grad._lt, lazy_op(_OP_SUB, (1, lazy_op(_OP_MUL, (y._lt, y._lt), ())), ())), ())


@impl(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    if isinstance(value, XlaTensor) and value.dim() != 0:
        raise RuntimeError("masked_fill only supports a 0-dimensional value tensor, "
                           f"but got tensor with {value.dim()} dimension(s).")
    check_fill(value, x.dtype)
    val = value if not isinstance(value, XlaTensor) else convert(value, x.dtype)
    r = where(mask, val, x)
    return convert(r, x.dtype)


@impl(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    try:
        return _to_copy(x, dtype, device)
    except UnsupportedDtype as e:  # x.to(torch.complex64), complex_cpu.to("xla")
        raise e.at("aten::_to_copy") from None


def _to_copy(x, dtype, device):
    if device is None and type(x) is XlaTensor:  # x.to(dtype), x.float(): the common case first
        return convert(x, dtype) if dtype is not None and dtype != x.dtype else wrapped_op(OP.alias, (x._lt,), ())
    dev = torch.device(device) if device is not None else x.device
    if dev.type == "xla":
        i = _device.index(dev)
        if isinstance(x, XlaTensor):
            if i is not None and i != _tensor.index_of(x):  # another xla device: the data moves
                x = _tensor.move(x, i)
            r = convert(x, dtype) if dtype is not None and dtype != x.dtype else wrapped_op(OP.alias, (x._lt,), ())
            return r
        src = x if dtype is None else x.to(dtype)
        return _tensor.from_cpu(src, i or 0, user=True)
    cpu = _tensor.to_cpu(x)
    if dtype is not None:
        cpu = cpu.to(dtype)
    return cpu.to(dev) if dev.type != "cpu" else cpu


@impl(torch.ops.prims.convert_element_type.default)
def convert_element_type(x, dtype):
    """torch's decompositions' cast (renorm of bf16 computes in float32 through it)."""
    return convert(x, dtype) if dtype != x.dtype else wrapped_op(OP.alias, (x._lt,), ())


@impl(aten.clone.default)
def clone(x, *, memory_format=None):
    return wrapped_op(OP.alias, (x._lt,), ())


@impl(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    if isinstance(src, XlaTensor):
        if isinstance(dst, XlaTensor):
            if dst is not src:
                check_no_partial_overlap(dst, src)
            src = _tensor.move(src, _tensor.index_of(dst))  # copy_ may cross devices, as in torch
            assign(dst, src if src.dtype == dst.dtype else convert(src, dst.dtype))
            return dst
        dst.copy_(_tensor.to_cpu(src))
        return dst
    if src.dtype != dst.dtype:
        src = src.to(dst.dtype)
    if src.shape != dst.shape:
        src = src.expand(dst.shape)
    if dst.numel() == 0:  # no values to upload (torch.tensor([]), DynamicCache's per-layer one): a fresh empty
        assign(dst, full_like(dst, 0))
        return dst
    assign(dst, _tensor.from_cpu(src, _tensor.index_of(dst), user=True))
    return dst


@impl(aten.fill_.Scalar, aten.fill_.Tensor)
def fill_(x, value):
    if isinstance(value, XlaTensor):
        assign(x, convert(value, x.dtype))
    else:
        assign(x, full_like(x, value))
    return x


@impl(aten.zero_.default)
def zero_(x):
    return fill_(x, 0)


@impl(aten._local_scalar_dense.default)
def local_scalar_dense(x):
    metrics.counter_add("scalar_read")  # a Python number read from the device (.item(), bool(t)): torch_xla's
    return _tensor.to_cpu(x).item()     # aten::_local_scalar_dense counter (compat debug.metrics)


@impl(aten.is_nonzero.default)
def is_nonzero(x):
    if x.numel() != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(local_scalar_dense(x))


# Float math torch's decompositions run, which torch's kernels refuse for integers and bools (dtype_rules).
decomposed(aten.frac, refuses=INTEGRAL)
decomposed(aten.logaddexp, aten.logaddexp2, refuses=INTEGRAL_PROMOTED)


_NAN_TO_NUM = decomposition_table[aten.nan_to_num.default]


@impl(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    """torch's decomposition; complex tensors part by part, as CPU's kernel
    (the decomposition refuses them: isneginf of complex, case 1:12439)."""
    if x.is_complex():
        return torch.complex(nan_to_num(torch.real(x), nan, posinf, neginf),
                             nan_to_num(torch.imag(x), nan, posinf, neginf))
    return _NAN_TO_NUM(x, nan, posinf, neginf)

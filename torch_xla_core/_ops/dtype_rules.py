"""Dtypes that torch's own kernels refuse, refused here too.

torch has no integer (or no bool) kernel for some ops, on CPU and CUDA alike:
`F.celu(long_tensor)` raises NotImplementedError ("elu_cpu" not implemented
for 'Long'). Our lowerings and torch's decompositions would compute them
anyway, and for float math that means a truncated, meaningless integer result
(celu(-2) = 0, hardsigmoid(1) = 0). A call torch refuses raises here, naming
the op and the dtype, before any node is made.

Each refusal is declared with its op, in the op's family module: an
argument of its mapping() or @impl declaration (`@impl(aten.lerp.Scalar,
aten.lerp.Tensor, refuses=INTEGRAL_PROMOTED)`), or, for an op that torch's
decomposition runs, `decomposed(aten.celu, ..., refuses=INTEGRAL)`. A refusal
declared on a packet or a .default overload holds for the whole packet; on
another overload, for it; either way also for its in-place and out= variants
(frac_ and frac.out: frac's; round_.decimals: round.decimals'). The kinds:
  INTEGRAL          integer and bool inputs (float and complex pass), as
                    the first tensor argument's dtype says (unary ops, pools,
                    interpolation, grid_sample's input)
  INTEGRAL_PROMOTED the same, as the promoted dtype of the tensor arguments
                    says (binary math)
  BOOL              bool inputs (the first tensor argument)
Refusals that a core row makes itself (csrc/ops/elementwise.cpp: fmod,
remainder, shifts and bitwise ops of bools or floats) are worded with
refusal() by their mapping's check= (_ops/elementwise.py), at no cost to the
calls the core takes. The declarations fill RULES: an overload ("aten::round.decimals") or a whole
packet ("aten::celu") -> (what it refuses, which argument's dtype decides).
The dispatcher's resolver wraps the handlers of the listed overloads
(_ops.resolution.entry); nothing else pays for the check. Listed: float math whose
integer result would be truncated, and bool products whose result dtype would
be wrong. Not listed on purpose: ops that compute integers and bools exactly
(histc, pools and unpooling, nearest interpolation, pads, trace, median,
sorting and searching: CUDA has integer kernels for several of them, and
transformers calls histc on int32 expert ids), C++ mappings whose result is
the right value anyway (floor/ceil/round/trunc of a bool is the bool), and
ops whose decision torch makes on more than the dtype (clamp of a bool with
scalar bounds passes).
The list came from a sweep of PyTorch's OpInfo samples (int32, int64, bool)
for calls CPU refuses "not implemented for" that the device computed;
tests/test_dtype_rules.py reruns that sweep. docs/coverage.md lists them.
"""
import torch

FLOATING, NO_BOOL = "floating", "no_bool"

INTEGRAL = (FLOATING, "first")
INTEGRAL_PROMOTED = (FLOATING, "promoted")
BOOL = (NO_BOOL, "first")

RULES = {}  # "aten::op" or "aten::op.overload" -> (kind, mode): filled by declare()


def declare(overloads, refuses) -> None:
    """Records that `overloads` (OpOverloads, OpOverloadPackets; absent ones,
    _compat.Absent, are skipped) refuse `refuses` (None: nothing)."""
    if refuses is None:
        return
    if refuses not in (INTEGRAL, INTEGRAL_PROMOTED, BOOL):
        raise ValueError(f"refuses={refuses!r}: use dtype_rules.INTEGRAL, INTEGRAL_PROMOTED or BOOL")
    for o in overloads:
        if isinstance(o, torch._ops.OpOverloadPacket):
            RULES[o._qualified_op_name] = refuses
        elif isinstance(o, torch._ops.OpOverload):
            RULES[o.name()] = refuses


# torch's own names of dtypes (its ScalarType names), as its error messages spell them: the one table
_TYPE_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
               torch.int64: "Long", torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
               torch.bfloat16: "BFloat16", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
_INTEGRAL = frozenset(d for d in _TYPE_NAMES if not (d.is_floating_point or d.is_complex))


def type_name(dtype) -> str:
    """torch's name of a dtype in its messages ("Long", "Float"); str(dtype) for one it does not name."""
    return _TYPE_NAMES.get(dtype, str(dtype))


def rule(func):
    """(kind, mode) for an overload, or None. In-place and out= variants take
    their functional's rule (frac_ and frac.out: frac's; round_.decimals and
    round.decimals_out: round.decimals')."""
    packet, _, overload = func.name().partition(".")
    if packet.endswith("_") and not packet.endswith("__"):
        packet = packet[:-1]
    if overload == "out" or overload.endswith("_out"):
        overload = overload[:-4] if overload.endswith("_out") else ""
    return (overload and RULES.get(f"{packet}.{overload}")) or RULES.get(packet)


def _decisive_dtype(args, mode):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return None
    if mode == "first":
        return tensors[0].dtype
    d = tensors[0].dtype
    for t in tensors[1:]:
        d = torch.promote_types(d, t.dtype)
    return d


def check_broadcast(a, b) -> None:
    """torch's error for two tensors whose shapes do not broadcast: its kernels
    check shapes before dtypes (bitwise_and of float tensors that do not
    broadcast raises the shape's RuntimeError, case 1:4699)."""
    sa, sb = tuple(a.shape), tuple(b.shape)
    for i in range(1, min(len(sa), len(sb)) + 1):
        x, y = sa[-i], sb[-i]
        if x != y and x != 1 and y != 1:
            raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) at "
                               f"non-singleton dimension {max(len(sa), len(sb)) - i}")


def refusal(name, d, cast_to="a numeric"):
    """The NotImplementedError of op `name` refusing dtype d, as torch's kernels refuse it."""
    return NotImplementedError(
        f"{name}: not implemented for '{type_name(d)}' ({d}): torch has no kernel for "
        f"this dtype either (CPU and CUDA raise); cast the input to {cast_to} dtype first")


def guard(func, h):
    """h, or h behind the dtype check of func's rule."""
    r = rule(func)
    if r is None:
        return h
    kind, mode = r
    refused = (lambda d: d in _INTEGRAL) if kind == FLOATING else (lambda d: d == torch.bool)
    name = func.name()

    def checked(*args, **kwargs):
        d = _decisive_dtype(args, mode)
        if d is not None and refused(d):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if mode == "promoted" and len(tensors) == 2:
                check_broadcast(*tensors)
            raise refusal(name, d, "a floating" if kind == FLOATING else "a numeric")
        return h(*args, **kwargs)
    checked.__name__ = f"dtype_checked_{getattr(h, '__name__', 'handler')}"
    return checked

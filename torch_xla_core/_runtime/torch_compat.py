"""Which torch and jax this package runs with, and every shim that makes one
wheel serve them all (the core does not link libtorch: one wheel per ABI
flavor and Python serves every torch whose Python API we use).

Supported: torch >= 2.11, < 2.16 (pyproject.toml repeats TORCH_RANGE; tests/
compat/test_compat.py keeps them equal), each version exercised by
`nox -s compat` (tests/compat: one venv per torch, the built wheel, the
compat suite). A torch outside that range is refused at import, naming the
version and the range (check_torch).

The shims, each with the versions it serves and the test that covers it
(tests/compat/test_compat.py runs in every torch's venv, so each shim is
exercised by a venv whose torch needs it, and by a stand-in where none does):

  AtenOps / ABSENT    torch 2.14 and 2.15 have no aten.cholesky (torch.cholesky
                      is linalg_cholesky there), torch 2.11-2.13 no
                      aten.linalg_matrix_sqrth / linalg_polar: _ops registers
                      handlers only for overloads this torch has.
                      test_op_registry_skips_absent
  ARANGE_INT64_TRUNCATED_LENGTH  torch 2.11-2.13's int64 arange counts its
                      length from the bounds and step truncated to integers
                      (arange(-0.9, 2.1, 2) is [0]); torch >= 2.14 from the
                      real bounds ([0, 2]); every other integer dtype from the
                      real bounds on every torch. factory._arange;
                      conformance arange-int64-fwd, tests/test_factory_out.py
  STD_VAR_DTYPE_ERROR  the error std/var of an integer or bool tensor raises:
                      RuntimeError on torch 2.11-2.14, NotImplementedError on
                      torch >= 2.15 (CPU eager's, which _ops/reduce.py's var
                      raises before tracing). tests/test_reduce.py
                      test_std_var_of_integers_raise_cpus_error, test_fuzz
  array_result_handler  jaxlib >= 0.11 took away _skip_checks (runtime.py's
                      outputs). test_array_result_handler_either_jaxlib
  linear_cross_entropy  torch 2.11-2.12 have no torch.nn.modules.
                      linear_cross_entropy (its chunked custom ops are
                      registered where the module exists: _ops/nn_extra.py's
                      try/except ImportError). test_linear_cross_entropy_ops
  sdpa_backward_meta  torch 2.11 has no meta kernel of
                      aten._scaled_dot_product_fused_attention_overrideable_backward
                      (what our SDPA's backward is): aot_autograd's fake
                      backward of any attention model failed, as "SystemError:
                      run_backward ... returned NULL without setting an
                      exception" (the engine lost the NotImplementedError).
                      Registered by dynamo.make_traceable where missing.
                      test_hf_model_training[*-dynamo]
"""
from __future__ import annotations

import re
import warnings
from typing import NamedTuple

import torch
from jax._src.lib import xla_client as xc

from .._version import __version__
from .. import config

TORCH_RANGE = ((2, 11), (2, 16))   # >= 2.11, < 2.16
JAX_RANGE = ((0, 10, 2), (0, 12))  # >= 0.10.2, < 0.12 (jaxlib the same)


def version_tuple(v: str) -> tuple[int, ...]:
    """'2.15.0+cu132' -> (2, 15, 0); '2.16.0.dev20260101' -> (2, 16, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def _spec(lo, hi) -> str:
    return f">={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}"


TORCH_SPEC = _spec(*TORCH_RANGE)
JAX_SPEC = _spec(*JAX_RANGE)
TORCH = version_tuple(torch.__version__)
# torch 2.11-2.13: an int64 arange's length is counted from its bounds and step
# truncated to integers; torch >= 2.14 counts it from the real ones (_ops/factory.py)
ARANGE_INT64_TRUNCATED_LENGTH = TORCH < (2, 14)
# std and var of an integer or bool tensor: torch 2.15 raises NotImplementedError, before RuntimeError
STD_VAR_DTYPE_ERROR = NotImplementedError if TORCH >= (2, 15) else RuntimeError


def check_torch(version: str | None = None) -> None:
    """Raises ImportError unless `version` (default: the imported torch's) is
    in TORCH_RANGE. TXC_UNSUPPORTED_TORCH=1 makes it a warning (trying a new
    torch before its range is declared)."""
    v = version or torch.__version__
    lo, hi = TORCH_RANGE
    if not lo <= version_tuple(v)[:2] < hi:
        msg = (f"torch_xla_core {__version__} supports torch {TORCH_SPEC}; this is torch {v}. Install a torch in "
               f"that range (pip install 'torch{TORCH_SPEC}'), or a torch_xla_core release that supports torch {v}")
        if config.get("TXC_UNSUPPORTED_TORCH"):
            warnings.warn(msg + " (TXC_UNSUPPORTED_TORCH=1: going on untested)", RuntimeWarning, stacklevel=3)
            return
        raise ImportError(msg + " (TXC_UNSUPPORTED_TORCH=1 tries it anyway, untested).")


# ---- aten overloads a torch version lacks -------------------------------------
class Absence(NamedTuple):
    """An aten op absent from torch `since` <= version < `until`."""
    since: tuple
    until: tuple
    why: str

    def here(self, version: tuple = TORCH) -> bool:
        return self.since <= version < self.until


_BEFORE, _STILL = (0,), (99,)  # absent from before the range / still absent
# What each known absence is (anything else absent is still skipped, and listed
# in SKIPPED: tests/compat asserts SKIPPED holds only these, per torch).
ABSENT = {
    "aten::cholesky": Absence((2, 14), _STILL,
                              "removed in torch 2.14 (torch.cholesky computes through linalg_cholesky_ex)"),
    "aten::linalg_matrix_sqrth": Absence(_BEFORE, (2, 14), "added in torch 2.14 (torch.linalg.matrix_sqrth)"),
    "aten::linalg_polar": Absence(_BEFORE, (2, 14), "added in torch 2.14 (torch.linalg.polar)"),
}
SKIPPED: set[str] = set()  # "aten::name.overload" of handlers not registered, this torch lacking them


class Absent:
    """An aten packet or overload this torch does not have: `impl` and
    `mapping` skip it (recording it in SKIPPED); calling it raises, naming it."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, overload: str) -> "Absent":
        if overload.startswith("__"):
            raise AttributeError(overload)
        return Absent(f"{self.name}.{overload}")

    def overloads(self):
        return []

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.name} does not exist in torch {torch.__version__}")

    def __repr__(self):
        return f"<absent {self.name}>"


class AtenOps:
    """torch.ops.aten where an op this torch lacks is an Absent instead of an
    AttributeError at import. A packet found is cached as an attribute of
    this object (later lookups cost what torch.ops.aten's do). Overloads are
    the real packet's: a missing overload of an existing op still raises."""

    def __init__(self, ns):
        object.__setattr__(self, "_ns", ns)

    def __getattr__(self, name: str):
        try:
            packet = getattr(self._ns, name)
        except AttributeError:
            if name.startswith("__") and name.endswith("__"):  # a protocol probe (aten.__lshift__ is an op)
                raise
            return Absent(f"aten::{name}")
        object.__setattr__(self, name, packet)
        return packet


def present(overloads):
    """The overloads of this torch among `overloads`; the absent ones go to SKIPPED."""
    out = []
    for o in overloads:
        if isinstance(o, Absent):
            SKIPPED.add(o.name)
        else:
            out.append(o)
    return out


# ---- jaxlib: array_result_handler's _skip_checks ------------------------------------
_SKIP_CHECKS = [{"_skip_checks": True}]  # its extra arguments (jaxlib >= 0.11: none), learned on first use


def array_result_handler(aval, sharding, committed):
    """jaxlib's C++ handler that makes jax Arrays of (aval, sharding).
    jaxlib < 0.11 takes _skip_checks=True (skips its checks of each output);
    jaxlib >= 0.11 has no such argument (and does not check there): the first
    call finds out which jaxlib this is, later calls pass what it takes."""
    try:
        return xc.array_result_handler(aval, sharding, committed=committed, **_SKIP_CHECKS[0])
    except TypeError:
        if not _SKIP_CHECKS[0]:
            raise
        _SKIP_CHECKS[0] = {}
        return xc.array_result_handler(aval, sharding, committed=committed)


# ---- torch 2.11: meta kernels torch added later ---------------------------------------

def _sdpa_overrideable_backward_meta(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                                     cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                                     philox_offset, *, scale=None):
    """torch >= 2.13's meta__scaled_dot_product_fused_attention_overrideable_backward."""
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            torch.empty_like(attn_bias) if attn_bias is not None else None)


_META = {"_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_overrideable_backward_meta}
_meta_lib = None
META_ADDED: list[str] = []  # the aten ops given a meta kernel here (this torch had none)


def add_missing_meta_kernels() -> None:
    """Registers _META's kernels for the ops this torch has no Meta kernel
    of (fake tensors, hence dynamo, need one). Idempotent."""
    global _meta_lib
    for name, fn in _META.items():
        if name in META_ADDED or isinstance(getattr(AtenOps(torch.ops.aten), name), Absent):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            continue
        if _meta_lib is None:
            _meta_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kept for the process)
        _meta_lib.impl(name, fn, "Meta")
        META_ADDED.append(name)

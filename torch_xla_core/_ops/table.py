"""The dispatch table of the ops layer: HANDLERS (aten overload -> handler),
BY_NAME (custom ops of libraries we do not import), which handlers were
declared (registry.py: mapping(), @impl) and which resolution.py made, and
`aten`, the namespace they are keyed by. Data only: registry.py writes the
declarations, resolution.py the handlers it derives."""
import torch

from .. import _C
from .._runtime import torch_compat as _compat

# torch.ops.aten where an op this torch lacks is an Absent (_compat.AtenOps): @impl and mapping() skip it, so a
# handler written for an op some supported torch removed does not break the import
aten = _compat.AtenOps(torch.ops.aten)

# XlaTensor.__torch_dispatch__ is C++ (csrc/py/dispatch.cpp): it asks resolution.entry once per overload for its
# handler and caches it.
HANDLERS = {}  # aten OpOverload -> handler(*args, **kwargs): a _C.Mapping or a function
BY_NAME = {}  # "namespace::op" -> handler: custom ops of libraries we do not import (their overload .default)
RESOLVED = set()  # overloads whose handler resolution.resolve made (HANDLERS caches them beside the declared ones)


def declared(func) -> bool:
    """Whether func's handler was declared (mapping(), @impl, a direct
    HANDLERS entry), not made by resolve()."""
    h = HANDLERS.get(func)
    return isinstance(h, _C.Mapping) or (h is not None and func not in RESOLVED)


def declare(func, h) -> None:
    """Makes h func's declared handler (in place of one resolve() made)."""
    HANDLERS[func] = h
    RESOLVED.discard(func)


def resolving(func) -> None:
    """Marks func's handler as resolve()'s, not a declared one."""
    RESOLVED.add(func)


def declare_by_name(qualname: str, h) -> None:
    """Makes h the handler of the custom op `qualname` (registry.impl_by_name)."""
    BY_NAME[qualname] = h

"""The coverage table: how each aten overload a user can reach runs on the xla
device, as torch_xla's xla_native_functions.yaml tells its users.

Each overload is classified by the dispatcher's own resolution (this package:
a declared handler in HANDLERS, else route(), the function resolve() follows;
dtype_rules.rule() for the dtypes it refuses), never by a second resolver:
  mapping        one core op: a mapping() row, run by the C++ dispatcher
                 without entering Python (detail: the core op; "else": the
                 @impl handler of the calls the row does not fit)
  handler        an @impl handler (Python building core ops)
  kernel         an xla kernel registered with torch.library: PrivateUse1
                 (a factory: no tensor argument reaches __torch_dispatch__)
                 or AutogradPrivateUse1 (above autograd: einsum, SDPA)
  derived        an in-place or out= variant, written through its
                 functional overload's handler (detail: that overload)
  composite      torch's CompositeImplicitAutograd kernel: the ops it is
                 made of
  decomposition  torch._decomp's decomposition (a CPU fallback where it
                 declines the inputs)
  fallback       the CPU kernel: counted in txc.metrics, warned once
  refused        no lowering and no CPU kernel: raises NotImplementedError
The `refuses` column: the input dtypes refused as torch's kernels refuse them
(dtype_rules; declared with the op).

Which overloads: every aten overload that a call on xla tensors can reach
(all but those with a CompositeImplicitAutograd kernel: torch decomposes them
above the xla key), and every overload this package declares a handler for. The set depends on torch's
version: docs/coverage.md names the torch it was generated with, and
tests/test_coverage.py compares only under that torch.

  python -m torch_xla_core._ops.coverage           the table, to stdout
  python -m torch_xla_core._ops.coverage --write   writes docs/coverage.md
"""
import argparse
import collections
import os
import sys

import torch

from .. import _C
from . import (COMPOSITE, DECOMPOSITION, DERIVED, FALLBACK, HANDLERS, Rest, declared, dtype_rules, load_all,
               route)

MAPPING, HANDLER, KERNEL, REFUSED = "mapping", "handler", "kernel", "refused"
KINDS = {  # kind -> what it means, in the order of the doc's summary
    MAPPING: "one core op (a `mapping()` row): the C++ dispatcher runs it, no Python",
    HANDLER: "an `@impl` handler: Python that builds core ops",
    KERNEL: "an xla kernel registered with torch.library: PrivateUse1 (a factory with no tensor argument) or "
            "AutogradPrivateUse1 (above autograd: einsum, SDPA)",
    DERIVED: "an in-place or out= variant, written through its functional overload's handler",
    COMPOSITE: "torch's CompositeImplicitAutograd kernel (the ops it is made of)",
    DECOMPOSITION: "torch._decomp's decomposition (the CPU kernel where it declines the inputs)",
    FALLBACK: "the CPU kernel: device -> host -> device, counted in `txc.metrics.fallbacks()`, warned once",
    REFUSED: "no lowering and no CPU kernel: raises NotImplementedError",
}
_REFUSES = {dtype_rules.INTEGRAL: "integer, bool", dtype_rules.INTEGRAL_PROMOTED: "integer, bool (promoted)",
            dtype_rules.BOOL: "bool"}
_XLA_KEYS = ("AutogradPrivateUse1", "PrivateUse1")  # torch registers none: each is ours (factory.py, ...)
_CPU_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")  # a fallback runs
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                   "coverage.md")

Row = collections.namedtuple("Row", "name how detail refuses")


def torch_version() -> str:
    """The torch release the table depends on: major.minor."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _short(func) -> str:
    """aten::add.Tensor -> add.Tensor; a .default overload by its packet's name."""
    return func.name().split("::", 1)[1]


def _has_kernel(name, keys) -> bool:
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in keys)


def overloads():
    """The aten overloads the table lists (see the module doc), sorted by name."""
    load_all()
    found = {f.name(): f for f in HANDLERS if isinstance(f, torch._ops.OpOverload) and f.namespace == "aten"
             and declared(f)}
    for name in torch._C._dispatch_get_all_op_names():
        if (not name.startswith("aten::") or name in found
                or (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
                    and not _has_kernel(name, _XLA_KEYS))):
            continue
        packet, _, overload = name[len("aten::"):].partition(".")
        found[name] = getattr(getattr(torch.ops.aten, packet), overload or "default")
    return [found[n] for n in sorted(found)]


def _where(fn) -> str:
    """A handler's module and name, relative to this package (elementwise.lerp)."""
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    for prefix in ("torch_xla_core._ops.", "torch_xla_core._features.", "torch_xla_core._execution.",
                   "torch_xla_core._tracing.", "torch_xla_core._runtime.", "torch_xla_core."):  # (the layer folders)
        if mod.startswith(prefix):
            mod = mod[len(prefix):]
            break
    return f"{mod}.{name}"


def how(func):
    """(kind, detail) for one overload."""
    keys = [k for k in _XLA_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), k)]
    if keys:  # (AutogradPrivateUse1 runs before __torch_dispatch__; PrivateUse1 takes the calls without tensors)
        return KERNEL, keys[0]
    return how_dispatched(func)


def how_dispatched(func):
    """(kind, detail) of func's calls that reach __torch_dispatch__."""
    if declared(func):
        h = HANDLERS[func]
        if isinstance(h, _C.Mapping):
            rest = "" if isinstance(h.rest, Rest) or h.rest is None else f"; else `{_where(h.rest)}`"
            return MAPPING, f"core op `{h.op}`{rest}"
        return HANDLER, f"`{_where(h)}`"
    kind, fn = route(func)
    if kind == DERIVED:
        return DERIVED, f"from `{_short(fn)}` ({how(fn)[0]})"
    if kind == FALLBACK and not _has_kernel(func.name(), _CPU_KEYS):
        return REFUSED, ""
    return kind, ""


def table():
    """The rows, one per overload, sorted by name."""
    rows = []
    for f in overloads():
        kind, detail = how(f)
        r = dtype_rules.rule(f)
        rows.append(Row(_short(f), kind, detail, _REFUSES[r] if r else ""))
    return rows


def render(rows) -> str:
    """docs/coverage.md's text."""
    counts = collections.Counter(r.how for r in rows)
    lines = [
        "# Coverage: how each aten overload runs on the xla device",
        "",
        f"Generated for torch {torch_version()} by `python -m torch_xla_core._ops.coverage --write` from the "
        "dispatcher's own resolution (`torch_xla_core/_ops/coverage.py`); `tests/test_coverage.py` keeps it "
        "current. Listed: every aten overload a call on xla tensors can reach (all but those torch decomposes "
        "above the xla key: CompositeImplicitAutograd) and every overload the package declares a handler for.",
        "",
        "| how | overloads | meaning |",
        "|---|---:|---|",
    ]
    lines += [f"| {k} | {counts.get(k, 0)} | {m} |" for k, m in KINDS.items()]
    lines += [f"| total | {len(rows)} | |", ""]
    refusing = sum(1 for r in rows if r.refuses)
    lines += [f"{refusing} overloads refuse some input dtypes as torch's own kernels do (`refuses`: float math "
              "that would truncate into integers, bool products; `torch_xla_core/_ops/dtype_rules.py`).", ""]
    lines += ["| aten overload | how | detail | refuses |", "|---|---|---|---|"]
    lines += [f"| `{r.name}` | {r.how} | {r.detail} | {r.refuses} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_xla_core._ops.coverage", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {os.path.relpath(DOC)} instead of printing")
    a = p.parse_args(argv)
    text = render(table())
    if a.write:
        os.makedirs(os.path.dirname(DOC), exist_ok=True)
        with open(DOC, "w") as f:
            f.write(text)
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

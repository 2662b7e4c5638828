"""Why did that compile? Each new compile is attributed to the user's Python
frame that synced (the call site) and counted per site; a compile after the
first at a site is a recompile (metrics counter "recompile"). With
TXC_DEBUG=recompiles (or enable()), each recompile is explained: the graph
hash, the nearest graph compiled before (same site first) and what differs —
a key field (matmul precision, donation, device, memory kinds, platform) or
the first node whose op, dtype, shape, attributes or operands differ, with
the aten op that made it — printed to stderr and kept for explanations().
TXC_RECOMPILE_LIMIT=N raises RecompileLimitError instead of the (N+1)th
compile at one site. The executor calls on_compile() before each compile
(torch_xla_core/_execution/executor.py); nothing here runs on a cache hit."""
import collections
import os
import re
import sys
import threading

import torch

from .. import config, metrics

__all__ = ["enable", "disable", "enabled", "explanations", "clear", "Explanation", "RecompileLimitError"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package (this file is in _execution/)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_DIRS = (_PKG_DIR + os.sep, _TORCH_DIR + os.sep, os.path.dirname(os.__file__) + os.sep)
_HISTORY = 256                 # graphs remembered for "nearest" (texts are kept only while enabled)

_lock = threading.Lock()
_sites = collections.Counter()                     # call site -> compiles there
_graphs = collections.deque(maxlen=_HISTORY)        # (site, key, lines) of graphs compiled while enabled
_explained = []                                     # Explanation, in order
_forced = None                                      # enable()/disable() override TXC_DEBUG


class RecompileLimitError(RuntimeError):
    """More compiles at one call site than TXC_RECOMPILE_LIMIT allows."""


class Explanation(collections.namedtuple("Explanation", "graph site count nearest differences")):
    """One recompile: the new graph's hash, the call site ("file:line in
    function"), the number of compiles at that site so far, the nearest
    earlier graph's hash (None if none was recorded) and what differs, one
    phrase per difference ("shape of %0 (made by aten.copy_.default):
    float32[4, 3] -> float32[8, 3]")."""

    def __str__(self):
        near = f"nearest cached graph {self.nearest:016x}" if self.nearest is not None else "no earlier graph recorded"
        diff = "; ".join(self.differences) or "nothing found (same graph and key)"
        return (f"torch_xla_core: recompile #{self.count - 1} at {self.site}: graph {self.graph:016x}; "
                f"{near}; differs in: {diff}")


def enabled() -> bool:
    if _forced is not None:
        return _forced
    return "recompiles" in config.get("TXC_DEBUG")


def enable() -> None:
    """Explain recompiles (as TXC_DEBUG=recompiles), printing each to stderr."""
    global _forced
    _forced = True


def disable() -> None:
    global _forced
    _forced = False


def explanations() -> list:
    """The recompiles explained so far (Explanation tuples; str() reads well)."""
    with _lock:
        return list(_explained)


def clear() -> None:
    """Forgets call sites, recorded graphs and explanations."""
    with _lock:
        _sites.clear()
        _graphs.clear()
        _explained.clear()


def _user_frame():
    """(the innermost Python frame outside torch_xla_core, torch and the
    standard library, its depth below the caller of _user_frame's caller
    (warnings.warn's stacklevel)), or (None, 1)."""
    f, level = sys._getframe(2), 1
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_SKIP_DIRS) and not fn.startswith("<frozen"):
            return f, level
        f, level = f.f_back, level + 1
    return None, 1


def call_site() -> str:
    """The user's line whose op or read synced ("file:line in function")."""
    f, _ = _user_frame()
    return "<unknown>" if f is None else f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"


def user_stacklevel() -> int:
    """warnings.warn's stacklevel, for a warning given by the caller, that
    points at the user's line (call_site) instead of torch_xla_core's."""
    return _user_frame()[1]


def _limit():
    return config.get("TXC_RECOMPILE_LIMIT")  # None: no limit


def on_compile(plan) -> None:
    """Called by the executor before compiling `plan` (a cache miss)."""
    site = call_site()
    on = enabled()
    lines = plan.cut.text().splitlines() if on else None
    with _lock:
        _sites[site] += 1
        n = _sites[site]
        near = _nearest(site, plan.key, lines) if on and n > 1 else None
        if on:
            _graphs.append((site, plan.key, lines))
    if n <= 1:
        return
    metrics.counter_add("recompile")
    limit = _limit()
    exp = None
    if on or limit is not None:
        exp = Explanation(plan.key.graph, site, n, near[1].graph if near else None,
                          _differences(near[1], near[2], plan.key, lines) if near else [])
    if on:
        with _lock:
            _explained.append(exp)
        print(str(exp), file=sys.stderr)
    if limit is not None and n > limit:
        raise RecompileLimitError(f"{exp} -- TXC_RECOMPILE_LIMIT={limit} compiles at one call site exceeded. "
                                  f"Keep shapes, dtypes and settings fixed at this line (pad batches to a "
                                  f"few sizes), or raise the limit.")


# --- nearest graph and its differences ----------------------------------------

_KEY_FIELDS = {"precision": "matmul precision (torch.set_float32_matmul_precision)",
               "aliases": "donated buffers (TXC_DONATE, buffers still referenced elsewhere)",
               "device": "device", "platform": "platform", "memory": "memory kinds (offload)"}


def _key_diffs(a, b) -> list:
    out = []
    for f in a._fields:
        if f == "graph" or getattr(a, f) == getattr(b, f):
            continue
        va, vb = getattr(a, f), getattr(b, f)
        if f == "aliases":
            out.append(f"{_KEY_FIELDS[f]}: {len(va)} donated pairs -> {len(vb)}")
        else:
            out.append(f"{_KEY_FIELDS.get(f, f)}: {va!r} -> {vb!r}")
    return out


def _line_diffs(a, b) -> int:
    n = sum(x != y for x, y in zip(a, b))
    return n + abs(len(a) - len(b))


def _nearest(site, key, lines):
    """(score, key, lines) of the closest recorded graph, preferring this site."""
    best = None
    for s, k, ls in _graphs:
        score = _line_diffs(ls, lines) + len(_key_diffs(k, key)) + (0 if s == site else 0.5)
        if best is None or score < best[0]:
            best = (score, k, ls)
    return best


_NODE = re.compile(r"^%(\d+) = ([\w.]+)\((.*?)\)(?: \{(.*)\})? : (.+?)(?:  # (.*))?$")


def _parse(line):
    m = _NODE.match(line)
    if m is None:
        return None
    idx, op, operands, attrs, ty, origin = m.groups()
    dtype, _, shape = ty.partition("[")
    return {"id": idx, "op": op, "operands": operands, "attributes": attrs or "", "dtype": dtype,
            "shape": "[" + shape if shape else "[]", "type": ty, "origin": origin or ""}


def _node_diff(a_line, b_line) -> str:
    a, b = _parse(a_line), _parse(b_line)
    if a is None or b is None:
        return f"line {a_line!r} -> {b_line!r}"
    where = f"%{b['id']}" + (f" (made by {b['origin'] or a['origin']})" if (b["origin"] or a["origin"]) else "")
    if a["op"] != b["op"]:
        return f"op of {where}: {a['op']} -> {b['op']}"
    if a["dtype"] != b["dtype"]:
        return f"dtype of {where} {a['op']}: {a['type']} -> {b['type']}"
    if a["shape"] != b["shape"]:
        return f"shape of {where} {a['op']}: {a['type']} -> {b['type']}"
    if a["attributes"] != b["attributes"]:
        return f"attributes of {where} {a['op']}: {{{a['attributes']}}} -> {{{b['attributes']}}}"
    if a["operands"] != b["operands"]:
        return f"operands of {where} {a['op']}: ({a['operands']}) -> ({b['operands']})"
    return f"{where}: {a_line!r} -> {b_line!r}"


def _differences(old_key, old_lines, key, lines) -> list:
    out = _key_diffs(old_key, key)
    for i, (x, y) in enumerate(zip(old_lines, lines)):
        if x != y:
            out.append(_node_diff(x, y))
            break
    else:
        if len(lines) > len(old_lines):
            out.append(f"{len(lines) - len(old_lines)} more node(s), first: {lines[len(old_lines)]!r}")
        elif len(lines) < len(old_lines):
            out.append(f"{len(old_lines) - len(lines)} fewer node(s), first missing: {old_lines[len(lines)]!r}")
    return out

"""Counts of an OpInfo conformance run, from the per-case records the tests
attach to their reports (see plugin.py) or from the JSON a run wrote.

    python -m tests.conformance.report RUN.json [--list mismatch|error|fallback|all] [--emit]

prints the summary table, then (with --list) each failing case with its first
failing sample; --emit prints expected_failures.X(...) lines for the cases
that were not as expected, with a guessed reason to review before pasting.
Imports no torch: it runs where the JSON is.
"""
import argparse
import json
import sys

OUTCOMES = ("pass", "fallback", "mismatch", "error")


def summarize(records):
    """records: one dict per case (op, dtype, direction, counts, expected).
    Returns {dtype: {...}} with op- and sample-level counts."""
    out = {}
    by_dtype = {}
    for r in records:
        by_dtype.setdefault(r["dtype"], []).append(r)
    for dtype, recs in sorted(by_dtype.items()):
        ops = {}
        for r in recs:
            ops.setdefault(r["op"], []).append(r)
        fwd_ops = {op for op, rs in ops.items() if any(r["direction"] == "fwd" for r in rs)}

        def has(op, outcome, direction=None):
            return any(r["counts"].get(outcome, 0) for r in ops[op]
                       if direction in (None, r["direction"]))

        def clean(op, direction=None):
            return not any(has(op, o, direction) for o in OUTCOMES[1:])

        s = {
            "ops": len(fwd_ops),
            "ops_all_pass": sum(clean(op) for op in fwd_ops),
            "ops_fwd_all_pass": sum(clean(op, "fwd") for op in fwd_ops),
            "bwd_ops": sum(any(r["direction"] == "bwd" for r in ops[op]) for op in ops),
            "bwd_ops_all_pass": sum(clean(op, "bwd") for op in ops
                                    if any(r["direction"] == "bwd" for r in ops[op])),
        }
        for o in OUTCOMES[1:]:
            s[f"ops_with_{o}"] = sum(has(op, o) for op in ops)
        for d in ("fwd", "bwd"):
            for o in OUTCOMES:
                s[f"{d}_samples_{o}"] = sum(r["counts"].get(o, 0) for r in recs if r["direction"] == d)
        s["cases_expected_to_fail"] = sum(bool(r["expected"]) for r in recs)
        s["cases_unexpected"] = sum(r["verdict"] not in ("ok", "expected") for r in recs)
        out[dtype] = s
    return out


def render(summary, mode):
    lines = [f"OpInfo conformance ({mode} mode), per dtype:"]
    for dtype, s in summary.items():
        lines.append(
            f"  {dtype}: {s['ops']} ops, {s['ops_all_pass']} with every sample passing "
            f"(forward {s['ops_fwd_all_pass']}; backward {s['bwd_ops_all_pass']}/{s['bwd_ops']}); "
            f"ops with a mismatch {s['ops_with_mismatch']}, an error {s['ops_with_error']}, "
            f"a CPU fallback {s['ops_with_fallback']}")
        for d in ("fwd", "bwd"):
            lines.append(f"    {d} samples: " + ", ".join(f"{o} {s[f'{d}_samples_{o}']}" for o in OUTCOMES))
        lines.append(f"    cases in the expected-failure list {s['cases_expected_to_fail']}, "
                     f"not as expected {s['cases_unexpected']}")
    return lines


DATA_DEPENDENT = ("nonzero", "unique", "masked_select", "bincount", "_unique2", "unique_consecutive",
                  "unique_dim", "repeat_interleave")


def guess_reason(rec):
    """A first wording of why a case fails, from its first failing samples."""
    msgs = [m for _, o, m in rec["failures"]]
    outs = {o for _, o, _ in rec["failures"]}
    if outs == {"fallback"}:
        ops = sorted({x for m in msgs for x in m.removeprefix("CPU fallback: ").split(", ")})
        if any(x.split("::")[-1].split(".")[0] in DATA_DEPENDENT for x in ops):
            return f"fallback: data-dependent output shape, counted CPU fallback ({', '.join(ops)})"
        return f"fallback: no XLA lowering yet, counted CPU fallback ({', '.join(ops)})"
    text = " ".join(msgs)
    if "complex" in text:
        return "unsupported: complex dtype (complex64 refusal: fixed in branch ops)"
    first = next((m for _, o, m in rec["failures"] if o != "fallback"), msgs[0])
    return "bug: " + first[:150]


def emit(records):
    for r in sorted(records, key=lambda r: (r["op"], r["direction"])):
        if r["verdict"] in ("ok", "expected"):
            continue
        kinds = "+".join(sorted({o for _, o, _ in r["failures"]}))
        if not kinds:
            print(f"# unexpected pass: remove {r['op']} {r['direction']} {r['dtype']}")
            continue
        dt = "" if r["dtype"] == "float32" else f", dtype={r['dtype']!r}"
        print(f"    X({r['op']!r}, {r['direction']!r}, {kinds!r}, {guess_reason(r)!r}{dt}),")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--list", choices=("mismatch", "error", "fallback", "all"))
    ap.add_argument("--emit", action="store_true")
    a = ap.parse_args(argv)
    with open(a.json) as f:
        run = json.load(f)
    print("\n".join(render(summarize(run["cases"]), run["mode"])))
    if a.list:
        for r in sorted(run["cases"], key=lambda r: (r["op"], r["dtype"], r["direction"])):
            kinds = [o for o in OUTCOMES[1:] if r["counts"].get(o)]
            if kinds and (a.list == "all" or a.list in kinds):
                first = r["failures"][0] if r["failures"] else ["", "", ""]
                print(f"{r['op']:45s} {r['dtype']:9s} {r['direction']} {'+'.join(kinds):18s} "
                      f"[{r['expected'] or 'NOT LISTED'}] #{first[0]} {first[2][:200]}")
    if a.emit:
        emit(run["cases"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

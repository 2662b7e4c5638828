"""The bf16 training conformance report (test_opinfo_bf16.py): pass rate per
run ("bf16", "autocast"), the ops not fully passing, and, per op family,
where the xla device is more or less accurate than CPU against float64.

Accuracy: each op's relative L2 error against float64 over its outputs and
gradients (the worst of its passing samples), ours and CPU's. An op is
"more accurate" where ours is under 0.8x CPU's, "less accurate" where over
1.25x, "same" otherwise or where both are below 1e-6 (exact).

    python -m tests.conformance.report_bf16 RUN.json [--more]

prints the report of a run that wrote TXC_BF16_REPORT=RUN.json (--more:
the ops more accurate than CPU too).
Imports no torch: it runs where the JSON is.
"""
import json
import math
import sys

EXACT = 1e-6


def accuracy(rec):
    """'more', 'less', 'same' or None (no passing sample measured)."""
    ex, ec = rec.get("err_xla"), rec.get("err_cpu")
    if ex is None or ec is None:
        return None
    if max(ex, ec) < EXACT:
        return "same"
    if ex < 0.8 * ec:
        return "more"
    if ex > 1.25 * ec:
        return "less"
    return "same"


def _ratio(rec):
    ex, ec = rec.get("err_xla"), rec.get("err_cpu")
    if ex is None or ec is None or max(ex, ec) < EXACT:
        return None
    return max(ex, EXACT) / max(ec, EXACT)


def summarize(records):
    """{run: {...}} from test_opinfo_bf16's records."""
    out = {}
    for run in sorted({r["mode"] for r in records}):
        recs = [r for r in records if r["mode"] == run and r["counts"]]
        passing = [r for r in recs if set(r["counts"]) == {"pass"}]
        fams = {}
        for r in recs:
            f = fams.setdefault(r["family"], {"ops": 0, "pass": 0, "more": [], "same": 0, "less": [], "ratios": []})
            f["ops"] += 1
            f["pass"] += set(r["counts"]) == {"pass"}
            a = accuracy(r)
            if a == "more" or a == "less":
                f[a].append(r["op"])
            elif a == "same":
                f["same"] += 1
            q = _ratio(r)
            if q is not None:
                f["ratios"].append(q)
        for f in fams.values():
            rs = f.pop("ratios")
            f["geomean_ratio"] = round(math.exp(sum(map(math.log, rs)) / len(rs)), 3) if rs else None
        out[run] = {
            "ops": len(recs), "ops_all_pass": len(passing),
            "pass_rate": round(len(passing) / len(recs), 4) if recs else None,
            "not_passing": sorted((r["op"], "+".join(sorted(k for k in r["counts"] if k != "pass")),
                                   r["expected"] or "NOT LISTED") for r in recs if r not in passing),
            "unexpected": sorted(r["op"] for r in recs if r["verdict"] not in ("ok", "expected")),
            "seconds": round(sum(r["seconds"] for r in records if r["mode"] == run), 1),
            "families": dict(sorted(fams.items())),
            "policy_differs": sorted(r["op"] for r in recs if r.get("policy")),
        }
    return out


def render(summary):
    lines = []
    for run, s in summary.items():
        what = "bf16 forward+gradients" if run == "bf16" else "float32 under autocast(bf16)"
        lines.append(f"{run} ({what}, judged against float64): {s['ops']} ops, {s['ops_all_pass']} fully passing "
                     f"({100 * (s['pass_rate'] or 0):.1f}%), not as expected {len(s['unexpected'])}, "
                     f"{s['seconds']} s in the cases")
        for op, kinds, why in s["not_passing"]:
            lines.append(f"    {op:40s} {kinds:16s} {why[:100]}")
        lines.append(f"  {'family':20s} {'ops':>4s} {'pass':>5s} {'more':>5s} {'same':>5s} {'less':>5s} "
                     f"{'xla/cpu err':>11s}  less accurate than CPU")
        for fam, f in s["families"].items():
            g = f"{f['geomean_ratio']:.2f}" if f["geomean_ratio"] is not None else "-"
            lines.append(f"  {fam:20s} {f['ops']:4d} {f['pass']:5d} {len(f['more']):5d} {f['same']:5d} "
                         f"{len(f['less']):5d} {g:>11s}  {', '.join(f['less'])[:120]}")
        if s["policy_differs"]:
            lines.append("  xla's autocast (CUDA's lists) computes in another dtype than CPU's for: "
                         + ", ".join(s["policy_differs"]))
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        run = json.load(f)
    print("\n".join(render(summarize(run["cases"]))))
    for name, r in run["summary"].items() if "--more" in argv else ():
        for fam, f in r["families"].items():
            if f["more"]:
                print(f"  {name}, more accurate than CPU, {fam}: {', '.join(f['more'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The two C++-ABI flavors of torch_xla_core side by side (and torch-xla, if given).

A program, not a test: it prints one comparison table and writes JSON and a
PNG chart. `nox -s bench` builds or reuses the wheels, installs each flavor in
its own virtualenv with its documented install command and runs this with the
two venvs' interpreters; run it directly given two such interpreters:

  python bench/flavors.py --flavor cxx11=.nox/bench-flavors/cxx11/bin/python \\
                          --flavor precxx11=.nox/bench-flavors/precxx11/bin/python \\
                          [--peer PEER_PYTHON] [--repeats N] [--quick]

Each interpreter runs a worker process (this file, --worker) that first
reports torch_xla_core.build_info(); the driver stops unless each reports the
flavor it was named for. The driver then sends every worker the same
commands one at a time and interleaves the measured repeats, rotating who
goes first, so drifts in machine load hit every flavor alike. Figures:

  trace µs/op     bench/trace_overhead.py's models (64-layer MLP, small decoder),
                  forward / forward+backward traced without syncing, wall and
                  process-CPU µs per aten op
  cached overhead trace + sync (compile-cache hit) + wait minus device execution
  core ns/node    torch_xla_core._bench_core: the C++ work alone (thread CPU time) on a graph
                  of --core-n op nodes built through the op registry: build
                  (make_node: shape rules, attributes, node hash), hash
                  (GraphCut walk + graph hash), lower (StableHLO text)
  wheel           repaired wheel size, _C size, build time (wheelhouse/report.json)

Every timed figure is a per-repeat value (median of the repeat's samples);
the ratio cxx11/precxx11 is taken per repeat (paired: the two ran back to
back) and reported as the median ratio with its interquartile range. < 1
means the C++11 flavor is faster.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import time
import zipfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
import trace_overhead as to  # noqa: E402  (bench/trace_overhead.py: worker, backends)
from _harness import RemoteWorker, WorkerError, stats, worker_env  # noqa: E402

SCHEMA = "torch_xla_core/bench/flavors/1"
PEER = to.PEER
CORE_KINDS = ("build", "hash", "lower")


# ============================================================ worker (per venv)

class FlavorWorker(to.Worker):
    """trace_overhead's worker plus what the flavor comparison needs."""

    def hello(self):
        info = super().hello()
        if self.backend_name == to.OURS:
            import torch_xla_core as txc
            from torch_xla_core import _C
            bi = txc.build_info()
            info.update(build_info=bi, flavor=bi["flavor"], package_file=txc.__file__,
                        core_file=_C.__file__, has_bench_core=_has_bench_core())
        return info

    def bench_core(self, kind, n, repeats):
        if not _has_bench_core():
            import torch_xla_core
            raise RuntimeError(f"{torch_xla_core.__file__}: no torch_xla_core._bench_core "
                               "(a wheel built before csrc/bench/bench_core.cpp: rebuild it)")
        from torch_xla_core import _bench_core
        return _bench_core.bench_core(kind, n, repeats)


def _has_bench_core():
    import importlib.util
    return importlib.util.find_spec("torch_xla_core._bench_core") is not None


def worker_main(backend_name):
    """JSON lines on stdin -> JSON lines on the original stdout (trace_overhead's loop)."""
    to.worker_main(backend_name, FlavorWorker)
def remote(name, backend, python):
    """A worker process of this file under `python`, named `name`."""
    # absolute (the worker runs in bench/), but not resolved: a venv's
    # python is a symlink that must stay one
    python = os.path.abspath(python) if os.sep in python else shutil.which(python) or python
    worker = RemoteWorker(name, [python, Path(__file__).resolve(), "--worker", "--backend", backend],
                          worker_env(clean_python_path=True))
    worker.python = python
    return worker


# ==================================================================== driver

def build_flavors():
    """build/flavors.py (the flavor matrix), loaded by path: this file is
    named flavors too, and `build` would shadow pypa's build package."""
    import importlib.util
    name = "_txc_build_flavors"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "build" / "flavors.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def log(msg):
    print(f"[flavors] {msg}", file=sys.stderr, flush=True)


def rotate(xs, i):
    i %= len(xs)
    return xs[i:] + xs[:i]


def flavor_check(workers, expected):
    """hello() every worker; the txc ones must report the flavor they were named for."""
    infos, problems = {}, []
    for w in workers:
        info = w.call("hello")
        infos[w.name] = info
        if w.name in expected:
            want = expected[w.name]
            if info.get("flavor") != want:
                problems.append(f"{w.python} was named {want} but loaded flavor "
                                f"{info.get('flavor')!r} from {info.get('core_file')}")
            log(f"{w.name}: flavor={info.get('flavor')} cxx11_abi="
                f"{info['build_info']['cxx11_abi']} version={info['build_info']['version']} "
                f"torch={info['torch']} compiler={info['build_info']['compiler']!r} "
                f"core={info['core_file']}")
        else:
            log(f"{w.name}: {info.get('backend')} {info.get('version')} torch={info.get('torch')}")
    if problems:
        raise SystemExit("[flavors] FLAVOR MISMATCH:\n  " + "\n  ".join(problems))
    return infos


def run_core(workers, n, inner, rounds):
    """Interleaved _bench_core.bench_core rounds: {kind: {flavor: [ns/node per round]}}."""
    out = {k: {w.name: [] for w in workers} for k in CORE_KINDS}
    for k in CORE_KINDS:                      # warm caches, op id lookups, allocator
        for w in workers:
            w.call("bench_core", kind=k, n=n, repeats=2)
    for r in range(rounds):
        for k in CORE_KINDS:
            for w in rotate(workers, r):
                t = w.call("bench_core", kind=k, n=n, repeats=inner)
                out[k][w.name].append(1e9 * statistics.median(t) / n)
    log(f"core-only: {rounds} interleaved rounds x {inner} repeats, n={n} op nodes")
    return out


def run_models(workers, models, repeats, warmup, trace_iters, seed):
    """trace_overhead's measurements, interleaved per repeat; keeps the raw
    per-repeat samples (for paired ratios) and trace_overhead's summary."""
    res = {}
    for m in models:
        setups, firsts, samples = {}, {}, {w.name: [] for w in workers}
        for w in workers:
            log(f"{w.name} {m}: setup, first steps (compile), warmup x{warmup}")
            setups[w.name] = w.call("setup", model=m, seed=seed)
            firsts[w.name] = w.call("first_steps")
            w.call("warmup", n=warmup)
        for i in range(repeats):
            for w in rotate(workers, i):
                samples[w.name].append(w.call("sample", trace_iters=trace_iters))
        log(f"{m}: {repeats} interleaved repeats done")
        for w in workers:
            w.call("teardown")
        res[m] = {w.name: {"setup": setups[w.name], "samples": samples[w.name],
                           "summary": to.summarize(setups[w.name], firsts[w.name],
                                                   samples[w.name])}
                  for w in workers}
    return res


# (key, label, unit, extractor(sample, setup) -> value in unit)
def _per_op(kind, cpu=False):
    key = f"trace_{kind}_{'cpu_' if cpu else ''}s"
    return lambda s, st: 1e6 * statistics.median(s[key]) / st["ops"][kind]


MODEL_FIGURES = [
    ("trace_fwd_us_per_op", "trace fwd µs/op", "µs", _per_op("forward")),
    ("trace_fwd_bwd_us_per_op", "trace fwd+bwd µs/op", "µs", _per_op("forward_backward")),
    ("trace_fwd_cpu_us_per_op", "trace fwd CPU µs/op", "µs", _per_op("forward", True)),
    ("trace_fwd_bwd_cpu_us_per_op", "trace fwd+bwd CPU µs/op", "µs",
     _per_op("forward_backward", True)),
    ("cached_fwd_overhead_ms", "cached fwd overhead ms", "ms",
     lambda s, st: 1e3 * s["step_forward"]["overhead_s"]),
    ("cached_fwd_bwd_overhead_ms", "cached fwd+bwd overhead ms", "ms",
     lambda s, st: 1e3 * s["step_forward_backward"]["overhead_s"]),
]
CORE_LABELS = {"build": "core build CPU ns/node", "hash": "core hash CPU ns/node",
               "lower": "core lower CPU ns/node"}


def figures(models_res, core_res, names, flavor_names):
    """One row per figure: per-backend stats of per-repeat values, and the
    paired cxx11/precxx11 ratio (per repeat)."""
    num, den = flavor_names
    rows = []

    def row(group, key, label, unit, series):
        r = {"group": group, "key": key, "label": label, "unit": unit,
             "values": {n: stats(series.get(n, [])) for n in names if n in series}}
        a, b = series.get(num, []), series.get(den, [])
        paired = [x / y for x, y in zip(a, b) if x is not None and y]
        r["ratio"] = stats(paired)
        if PEER in series and series[PEER]:
            ma, mp = statistics.median(a), statistics.median(series[PEER])
            r["ratio_vs_peer"] = ma / mp if mp else None
        rows.append(r)

    for m, per in models_res.items():
        for key, label, unit, fn in MODEL_FIGURES:
            row(m, key, label, unit, {n: [fn(s, per[n]["setup"]) for s in per[n]["samples"]]
                                      for n in per})
    for k in CORE_KINDS:
        if core_res:
            row("core", f"core_{k}_ns_per_node", CORE_LABELS[k], "ns", core_res[k])
    return rows


def packaging(flavor_names, infos):
    """Wheel size, _C size and build time per flavor (wheelhouse/report.json,
    written by build/wheels.py, and the wheel files themselves)."""
    fl = build_flavors()
    matrix, base = fl.load(), fl.base_version()
    report_path = ROOT / "wheelhouse" / "report.json"
    rep = json.loads(report_path.read_text()) if report_path.exists() else {}
    out = {}
    for name in flavor_names:
        f = matrix[name]
        want = f.version(base)
        whls = [w for w in sorted(f.wheelhouse_dir().glob(f"{fl.DIST}-*.whl"))
                if w.name.split("-")[1] == want]
        d = {"version": want, "install_command": " ".join(f.install_command(base))}
        if whls:
            w = whls[-1]
            with zipfile.ZipFile(w) as z:
                so = [i for i in z.infolist() if "/_C." in i.filename and ".libs/" not in i.filename]
            d.update(wheel=str(w.relative_to(ROOT)), wheel_bytes=w.stat().st_size,
                     core_so_bytes=so[0].file_size if so else None)
        b = rep.get(name, {}).get("build", {})
        d["build_seconds"] = b.get("seconds")
        d["build_fresh"] = b.get("fresh")
        info = infos.get(name, {})
        d["installed_core"] = info.get("core_file")
        out[name] = d
    return out


# ------------------------------------------------------------------ output

def _fmt(v, unit):
    if v is None:
        return "n/a"
    return f"{v:.0f}" if unit == "ns" and v >= 100 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def _cell(st, unit):
    if not st:
        return "n/a"
    med = st["median"]
    half_iqr = (st["p75"] - st["p25"]) / 2 / med * 100 if med else 0
    return f"{_fmt(med, unit)} ±{half_iqr:.0f}%"


def _ratio_cell(st):
    if not st:
        return "n/a"
    return f"{st['median']:.3f} [{st['p25']:.2f}–{st['p75']:.2f}]"


def print_table(rows, pack, names, flavor_names, out=sys.stdout):
    num, den = flavor_names
    has_peer = PEER in names
    hdr = ["figure", num, den, f"{num}/{den} [IQR]"] + ([PEER, f"{num}/{PEER}"] if has_peer else [])
    lines = []
    group = None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            lines.append(None)
            lines.append([f"-- {group}"] + [""] * (len(hdr) - 1))
        cells = [r["label"], _cell(r["values"].get(num), r["unit"]),
                 _cell(r["values"].get(den), r["unit"]), _ratio_cell(r["ratio"])]
        if has_peer:
            cells += [_cell(r["values"].get(PEER), r["unit"]),
                      f"{r['ratio_vs_peer']:.2f}" if r.get("ratio_vs_peer") else "n/a"]
        lines.append(cells)
    lines.append(None)
    lines.append(["-- wheel"] + [""] * (len(hdr) - 1))

    def prow(label, key, scale, fmt):
        a, b = pack[num].get(key), pack[den].get(key)
        cells = [label, fmt.format(a * scale) if a is not None else "n/a",
                 fmt.format(b * scale) if b is not None else "n/a",
                 f"{a / b:.3f}" if a is not None and b else "n/a"]
        return cells + (["", ""] if has_peer else [])

    lines.append(prow("wheel KiB", "wheel_bytes", 1 / 1024, "{:.0f}"))
    lines.append(prow("_C .so KiB (unpacked)", "core_so_bytes", 1 / 1024, "{:.0f}"))
    build = prow("build s (wheels.py)", "build_seconds", 1, "{:.0f}")
    for i, f in ((1, num), (2, den)):
        if pack[f].get("build_seconds") is not None:
            build[i] += " (fresh)" if pack[f].get("build_fresh") else " (incr.)"
    lines.append(build)
    body = [ln for ln in lines if ln is not None]
    widths = [max(len(c[i]) for c in body + [hdr]) for i in range(len(hdr))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    print("\n" + fmt(hdr), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for ln in lines:
        if ln is None:
            continue
        print(fmt(ln) if not ln[0].startswith("-- ") else ln[0], file=out)
    print(f"\ncells: median ±half the IQR (% of median) of per-repeat values; {num}/{den}: "
          f"median [p25–p75] of the per-repeat ratios (interleaved, paired); < 1: {num} faster."
          + (f" {num}/{PEER}: ratio of medians." if has_peer else ""), file=out)


def plot(rows, pack, flavor_names, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    num, den = flavor_names
    rr = [r for r in rows if r["ratio"]]
    fig = plt.figure(figsize=(11, 0.36 * len(rr) + 4.4))
    gs = fig.add_gridspec(2, 3, height_ratios=[0.36 * len(rr) + 0.8, 1.6], hspace=0.3,
                          wspace=0.45)
    ax = fig.add_subplot(gs[0, :])
    ys = list(range(len(rr)))[::-1]
    lo = min(min(r["ratio"]["p25"] for r in rr) / 1.15, 0.8)
    hi = max(max(r["ratio"]["p75"] for r in rr) * 1.15, 1.25)
    for y, r in zip(ys, rr):
        st = r["ratio"]
        med, q1, q3 = st["median"], st["p25"], st["p75"]
        color = "#2a9d4a" if q3 < 1 else ("#c0392b" if q1 > 1 else "#7f8c8d")
        ax.plot([max(st["min"], lo), min(st["max"], hi)], [y, y], color=color, alpha=0.3, lw=1.2)
        ax.plot([q1, q3], [y, y], color=color, lw=6, alpha=0.55, solid_capstyle="butt")
        ax.plot([med], [y], "o", color=color, ms=7)
        a, b = r["values"][num]["median"], r["values"][den]["median"]
        ax.annotate(f"{med:.2f}×  ({_fmt(a, r['unit'])} vs {_fmt(b, r['unit'])} {r['unit']})",
                    (1.0, y), xycoords=("axes fraction", "data"), xytext=(8, 0),
                    textcoords="offset points", va="center", fontsize=8.5)
    for y, r in zip(ys[1:], rr[1:]):
        if r["group"] != rr[rr.index(r) - 1]["group"]:
            ax.axhline(y + 0.5, color="black", lw=0.5, alpha=0.4)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    cand = (0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 4)
    if hi / lo > 2.5:
        cand = tuple(t for t in cand if t not in (0.9, 1.1))
    ticks = [t for t in cand if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.set_ylim(-0.6, len(rr) - 0.4)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r['group']}: {r['label'].removeprefix('core ')}" for r in rr],
                       fontsize=9)
    ax.set_xlabel(f"time {num} / {den}, per interleaved repeat (log scale; < 1: {num} faster)")
    ax.set_title("dot: median ratio   bar: interquartile range   line: min–max      "
                 "green: IQR below 1 (C++11 faster)   red: above 1   grey: overlaps 1",
                 fontsize=8.5)
    ax.grid(axis="x", alpha=0.3)

    for j, (label, key, scale) in enumerate((("wheel KiB", "wheel_bytes", 1 / 1024),
                                             ("_C .so KiB (unpacked)", "core_so_bytes", 1 / 1024),
                                             ("build s (build/wheels.py)", "build_seconds", 1))):
        bx = fig.add_subplot(gs[1, j])
        vals = [(pack[f].get(key) or 0) * scale for f in (num, den)]
        bars = bx.barh([num, den], vals, color=["#2a6f9d", "#d08c2a"])
        for bar, v in zip(bars, vals):
            bx.annotate(f" {v:.0f}", (v, bar.get_y() + bar.get_height() / 2), va="center",
                        fontsize=8)
        bx.set_xlim(0, max(vals + [1]) * 1.25)
        bx.invert_yaxis()
        bx.set_title(label, fontsize=9)
        bx.tick_params(labelsize=8)
    fig.suptitle(f"torch_xla_core C++ ABI flavors: {num} vs {den}\n{meta}", fontsize=10)
    fig.subplots_adjust(left=0.25, right=0.8, top=0.9, bottom=0.06)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", action="append", default=[], metavar="NAME=PYTHON",
                    help="a flavor and the interpreter it is installed in (twice)")
    ap.add_argument("--peer", metavar="PYTHON", help="an interpreter with torch-xla: adds a column")
    ap.add_argument("--models", default="mlp,decoder")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved measured repeats per model (default 6; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup repeats (default 1)")
    ap.add_argument("--trace-iters", type=int, default=None,
                    help="trace-only samples per repeat (default 3; 1 with --quick)")
    ap.add_argument("--core-n", type=int, default=2100, help="op nodes in the core-only graph")
    ap.add_argument("--core-rounds", type=int, default=None,
                    help="interleaved core-only rounds (default 3 x repeats)")
    ap.add_argument("--core-inner", type=int, default=7, help="bench_core repeats per round")
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(BENCH_DIR / "results" / "flavors.json"))
    ap.add_argument("--png", default=str(BENCH_DIR / "results" / "flavors.png"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default=to.OURS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args.backend)
        return 0

    fl = build_flavors()
    matrix = fl.load()
    pythons = {}
    for spec in args.flavor:
        name, sep, py = spec.partition("=")
        if not sep or name not in matrix.names():
            ap.error(f"--flavor {spec!r}: want NAME=PYTHON with NAME in {matrix.names()}")
        pythons[name] = py
    if len(pythons) != 2:
        ap.error(f"give both flavors: --flavor {matrix.names()[0]}=PY --flavor "
                 f"{matrix.names()[1]}=PY")
    # numerator: the C++11 flavor, whatever build/flavors.toml names it
    flavor_names = (matrix.by_abi(True).name, matrix.by_abi(False).name)
    repeats = args.repeats or (3 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else 1
    trace_iters = args.trace_iters or (1 if args.quick else 3)
    core_rounds = args.core_rounds or 3 * repeats
    models = [m.strip() for m in args.models.split(",") if m.strip()]

    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    workers = [remote(n, to.OURS, pythons[n]) for n in flavor_names]
    if args.peer:
        workers.append(remote(PEER, PEER, args.peer))
    names = [w.name for w in workers]
    try:
        infos = flavor_check(workers, {n: n for n in flavor_names})
        core = run_core(workers[:2], args.core_n, args.core_inner, core_rounds)
        models_res = run_models(workers, models, repeats, warmup, trace_iters, args.seed)
    except WorkerError as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        for w in workers:
            w.close()

    rows = figures(models_res, core, names, flavor_names)
    pack = packaging(flavor_names, infos)
    print_table(rows, pack, names, flavor_names)
    elapsed = time.monotonic() - t0
    load_after = os.getloadavg()

    doc = {
        "schema": SCHEMA,
        "created": started.isoformat(timespec="seconds"),
        "command": [sys.executable] + sys.argv,
        "seconds": round(elapsed, 1),
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                 "machine": platform.machine(), "loadavg_before": load_before,
                 "loadavg_after": load_after},
        "config": {"models": models, "repeats": repeats, "warmup": warmup,
                   "trace_iters": trace_iters, "core_n": args.core_n,
                   "core_rounds": core_rounds, "core_inner": args.core_inner,
                   "seed": args.seed, "pjrt_device": os.environ.get("PJRT_DEVICE", "CPU")},
        "ratio": {"numerator": flavor_names[0], "denominator": flavor_names[1],
                  "how": "per-repeat paired ratios of interleaved runs; median and quartiles"},
        "workers": {n: {"python": w.python, **infos.get(n, {})} for n, w in
                    zip(names, workers)},
        "figures": rows,
        "packaging": pack,
        "trace_overhead": {m: {n: per[n]["summary"] for n in per}
                           for m, per in models_res.items()},
    }
    jp = Path(args.json)
    jp.parent.mkdir(parents=True, exist_ok=True)
    jp.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {jp}")
    try:
        meta = (f"{started:%Y-%m-%d %H:%M} UTC, {repeats} repeats x {trace_iters} traces, "
                f"core n={args.core_n} x {core_rounds} rounds, load {load_before[0]:.1f}")
        plot(rows, pack, flavor_names, meta, args.png)
        print(f"wrote {args.png}")
    except ImportError as e:
        print(f"no chart: {e} (pip install matplotlib)", file=sys.stderr)
    print(f"({elapsed:.0f} s; load average {load_before[0]:.1f} -> {load_after[0]:.1f} "
          f"on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

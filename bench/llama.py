#!/usr/bin/env python
"""Issue 29's workload: a Hugging Face Llama training step on each runtime.

transformers.LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=1024,
intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
num_key_value_heads=8, max_position_embeddings=1024)), random weights (seed
0), .to(torch.bfloat16), AdamW(lr=1e-5), batch 8 x 1024 random token ids;
one step is `loss = model(input_ids=ids, labels=ids).loss; loss.backward();
opt.step(); opt.zero_grad()`.

A program, not a test: it prints a table and writes JSON. Each runtime runs
in a process of its own (a fresh allocator peak, no state shared):

  cuda_eager   the model on "cuda" (CPU machines: cpu_eager, on "cpu")
  inductor     torch.compile(model) on CUDA (on CPU only when asked for)
  traced       ours: the step traced every call, txc.sync()
  txc_compile  ours: txc.compile(step) (records the step, then replays it)
  dynamo       ours: torch.compile(model, backend="torch_xla_core") ("dynamo, model only": AdamW traced per op)
  dynamo_opt   ours: the model and opt.step each torch.compile'd, zero_grad(set_to_none=True)
               ("dynamo, model + torch.compile(opt.step)")
  dynamo_step  ours: torch.compile(train_step) of the whole step with
               torch._dynamo.config.compiled_autograd ("dynamo, whole step")

A runtime may carry options after a colon, comma-separated, each run as its
own row: `cublas` (XLA_FLAGS=--xla_gpu_enable_triton_gemm=false: cuBLAS for
every GEMM instead of XLA's Triton gemm fusions), `sdpa=auto|flash|cudnn|xla`
(TXC_SDPA_KERNEL), `autotune=N` (--xla_gpu_autotune_level=N); e.g.
`txc_compile:cublas,sdpa=cudnn`. `floor` (the dynamo rows only) is a diagnostic: the
same step with bench/dynamo_floor.py's backend, whose graphs run once and then
return their first outputs, so the row's host time is torch's own per step
(dynamo, AOTAutograd's wrappers, autograd, the optimizer's hooks) plus what
runs outside the graphs: the least any backend could cost on that route
(--floor adds the three floor rows; their losses are not the real ones).

Per runtime: the first step (wall seconds, until its results are ready:
compiles included), --warmup more steps, then --steps steps back to back,
each ended by one sync that does not wait (ours: txc.sync(); eager and
inductor: nothing, CUDA queues the work), and one wait at the end (ours:
txc.wait_device_ops(); CUDA: torch.cuda.synchronize()). ms/step = that wall
time / steps; tokens/s; MFU = (6 N + 12 L H S) tokens / time / peak, N the
parameters without the input embedding, L layers, H hidden size, S sequence
length, peak the device's dense bf16 FLOP/s (989 TFLOP/s for H100/H200;
--peak-tflops for others; none on CPU); peak memory (CUDA: the caching
allocator's peak; ours: PJRT's peak_bytes_in_use where the device reports
it; CPU: none, the process's max RSS is in the JSON); and for ours the
replay counters of the timed steps (txc.metrics "replay", "replay_trace",
"replay_refused", "compile"): whether capture engaged, and launches and
device->host transfers per timed step (txc.metrics "execute",
"transfer_to_host"; the step's sync included). host ms: the time
the host spends per timed step until the step's sync returns (tracing and
binding; ours' sync does not wait, so XLA's compute of the step is not in
it unless the host waited on it), beside ms/step (wall, the device's
compute included); for eager it is the whole step. The line under the table
gives traced host ms / txc_compile host ms (issue 29's CPU target: >= 20x).
The JSON also has host_thread_cpu_ms_per_step: the CPU time of the
stepping thread over the same span (less swayed by other processes on a
shared machine; eager's intra-op worker threads are not in it). On CPU a
replayed step's wall host time is bound by XLA:CPU's compute: the launch
(txc.metrics "execute_launch", little of it CPU time of this thread) and
the read of the deferred checks of the step two syncs back wait for it;
its thread CPU time is what recording, binding and launching cost. CPU eager and
inductor on CPU run with torch.set_flush_denormal(True), as XLA:CPU flushes
denormals (without it the bf16 eager step ran 10-20x slower here).

  python bench/llama.py [--runtimes traced txc_compile:cublas ...] [--steps 20] [--warmup 2]
                        [--tiny] [--layers N] [--batch N] [--seq N] [--floor] [--timeout S] [--out FILE.json]

--tiny: 2 layers, hidden 64, 4 heads (2 kv), vocabulary 256, batch 2 x 32
(the CPU smoke run of CI and tests/test_bench_llama.py). --hidden N scales
the hidden and intermediate sizes (issue 43's CPU Llama: --tiny --layers 8
--hidden 128 --seq 64).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TXC_COMPILE_CACHE", "off")  # first steps compile, as bench/_harness.py keeps it

SCHEMA = "torch_xla_core/bench/llama/1"
OURS = ("traced", "txc_compile", "dynamo", "dynamo_opt", "dynamo_step")
RUNTIMES = ("cuda_eager", "cpu_eager", "inductor") + OURS
DYNAMO = ("dynamo", "dynamo_opt", "dynamo_step")
OPTIONS = ("cublas", "sdpa", "autotune", "floor")
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense bf16, by device name
ISSUE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=8, max_position_embeddings=1024)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32)
_RESULT = "LLAMA_RESULT "


def parse_spec(spec):
    """'txc_compile:cublas,sdpa=flash' -> ('txc_compile', {'cublas': True, 'sdpa': 'flash'})."""
    name, _, rest = spec.partition(":")
    if name not in RUNTIMES:
        raise SystemExit(f"bench/llama.py: unknown runtime {name!r}; pick from {', '.join(RUNTIMES)}")
    opts = {}
    for o in filter(None, rest.split(",")):
        k, eq, v = o.partition("=")
        if k not in OPTIONS or (k in ("sdpa", "autotune")) != bool(eq):
            raise SystemExit(f"bench/llama.py: unknown option {o!r} of {spec!r} (cublas, sdpa=MODE, autotune=N, "
                             f"floor)")
        opts[k] = v if eq else True
    if opts and name not in OURS:
        raise SystemExit(f"bench/llama.py: options {rest!r} apply to our runtimes only ({', '.join(OURS)})")
    if opts.get("floor") and name not in DYNAMO:
        raise SystemExit(f"bench/llama.py: option 'floor' of {spec!r} applies to the dynamo rows only "
                         f"({', '.join(DYNAMO)})")
    return name, opts


def spec_env(opts):
    """The environment a runtime's process runs with, for its options."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    flags = [env.get("XLA_FLAGS", "")]
    if opts.get("cublas"):
        flags.append("--xla_gpu_enable_triton_gemm=false")
    if "autotune" in opts:
        flags.append(f"--xla_gpu_autotune_level={int(opts['autotune'])}")
    env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    if "sdpa" in opts:
        env["TXC_SDPA_KERNEL"] = opts["sdpa"]
    return env


def flops_per_token(model, cfg, seq):
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    return 6 * n + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * seq, n


def train_step(model, opt, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def compiled_opt_step(opt_step):
    """The step with the optimizer's step torch.compile'd (opt_step)."""
    def step(model, opt, ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def run_one(spec, cfg, batch, seq, steps, warmup):
    """In this process: one runtime's measurements (a dict)."""
    import torch
    import transformers
    name, opts = parse_spec(spec)
    cuda = name == "cuda_eager" or (name == "inductor" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        return {"unavailable": "no CUDA device"}
    if name in OURS:
        import torch_xla_core as txc
        dev, sync, wait = txc.device(), txc.sync, txc.wait_device_ops
        import jax
        device_name = jax.devices()[0].device_kind
    else:
        dev = "cuda" if cuda else "cpu"
        if not cuda:  # XLA:CPU flushes denormals; CPU eager in bf16 ran 10-20x slower on them here
            torch.set_flush_denormal(True)
        sync = lambda: None  # noqa: E731  (eager work is queued on the CUDA stream as it is called)
        wait = torch.cuda.synchronize if cuda else (lambda: None)
        device_name = torch.cuda.get_device_name() if cuda else "cpu"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).to(torch.bfloat16).to(dev)
    fpt, n_params = flops_per_token(model, cfg, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1)).to(dev)
    step, fwd = train_step, model
    backend = "torch_xla_core"
    if opts.get("floor"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from dynamo_floor import backend
    if name == "inductor":
        fwd = torch.compile(model)
    elif name in ("dynamo", "dynamo_opt"):
        fwd = torch.compile(model, backend=backend)
        if name == "dynamo_opt":
            step = compiled_opt_step(torch.compile(opt.step, backend=backend))
    elif name == "dynamo_step":
        torch._dynamo.config.compiled_autograd = True
        step = torch.compile(train_step, backend=backend)
    elif name == "txc_compile":
        step = txc.compile(train_step)

    def counters():
        return dict(txc.metrics.counters()) if name in OURS else {}

    t0 = time.perf_counter()
    loss = step(fwd, opt, ids)
    sync()
    wait()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        loss = step(fwd, opt, ids)
        sync()
    wait()
    c0 = counters()
    host = host_cpu = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        h0, c0_ = time.perf_counter(), time.thread_time()
        loss = step(fwd, opt, ids)
        sync()
        host += time.perf_counter() - h0
        host_cpu += time.thread_time() - c0_
    wait()
    wall = time.perf_counter() - t0
    c1 = counters()
    graph_bytes = (txc.memory.last_graph() or {}).get("device_total_bytes") if name in OURS else None
    tokens = batch * seq * steps
    peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)
    r = {"runtime": spec, "device": device_name, "ms_per_step": wall / steps * 1e3, "host_ms_per_step": host / steps * 1e3,
         "host_thread_cpu_ms_per_step": host_cpu / steps * 1e3,
         "tokens_per_s": tokens / wall,
         "flops_per_token": fpt, "params_non_embedding": n_params, "peak_tflops": peak_tflops,
         "first_step_s": first, "loss": float(loss.float().cpu()), "steps": steps, "warmup": warmup,
         "peak_bytes": None, "max_rss_bytes": _max_rss()}
    if cuda:
        r["peak_bytes"] = torch.cuda.max_memory_allocated()
    elif name in OURS:
        info = txc.memory.device_info() or {}
        r["peak_bytes"] = info.get("peak_bytes_in_use")
        r["graph_bytes"] = graph_bytes  # the compiled step's argument + output + temp - alias bytes
        for k in ("replay", "replay_trace", "replay_refused", "compile"):
            r[k] = c1.get(k, 0) - c0.get(k, 0)
        r["launches_per_step"] = (c1.get("execute", 0) - c0.get("execute", 0)) / steps
        r["transfers_per_step"] = (c1.get("transfer_to_host", 0) - c0.get("transfer_to_host", 0)) / steps
        r["sdpa_flash"] = c1.get("sdpa_flash", 0)
        r["env"] = {k: os.environ.get(k) for k in ("XLA_FLAGS", "TXC_SDPA_KERNEL", "PJRT_DEVICE")}
    return r


def _max_rss():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mfu(r, peak_tflops):
    peak = peak_tflops or r.get("peak_tflops")
    if not peak or "ms_per_step" not in r:
        return None
    return r["flops_per_token"] * r["tokens_per_s"] / (peak * 1e12)


def host_ratio(rows, key="host_ms_per_step", num="traced", den="txc_compile"):
    """num's host ms per step over den's (key: the wall or the thread CPU figure), or None."""
    host = {r["runtime"]: r.get(key) for r in rows}
    t, c = host.get(num), host.get(den)
    return t / c if t and c else None


def default_runtimes():
    import torch
    if torch.cuda.is_available():
        return ["cuda_eager", "inductor", "traced", "txc_compile", "dynamo", "dynamo_opt", "dynamo_step"]
    return ["cpu_eager", "traced", "txc_compile", "dynamo", "dynamo_opt", "dynamo_step"]


def run_process(spec, args, timeout):
    """One runtime in a process of its own; its result dict, or an error/unavailable one."""
    _, opts = parse_spec(spec)
    cmd = [sys.executable, __file__, "--one", spec] + args
    try:
        p = subprocess.run(cmd, env=spec_env(opts), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"runtime": spec, "error": f"timed out after {timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(_RESULT):
            return {"runtime": spec, **json.loads(line[len(_RESULT):])}
    tail = [ln for ln in p.stderr.splitlines() if ln.strip() and "torch_xla_core: compil" not in ln][-6:]
    return {"runtime": spec, "error": f"rc={p.returncode}: " + " | ".join(tail)[-1500:]}


def table(rows, peak_tflops):
    head = (f"{'runtime':<28} {'ms/step':>9} {'host ms':>8} {'CPU ms':>7} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9} "
            f"{'first s':>8} {'replay':>7} {'traced':>7} {'refused':>8} {'launch':>7} {'xfer':>5} {'loss':>8}")
    print(head)
    for r in rows:
        if "ms_per_step" not in r:
            print(f"{r['runtime']:<28} {r.get('unavailable') and 'unavailable: ' + r['unavailable'] or r.get('error')}")
            continue
        m = mfu(r, peak_tflops)
        gib = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "-"
        rep = [str(r[k]) if k in r else "-" for k in ("replay", "replay_trace", "replay_refused")]
        host = f"{r['host_ms_per_step']:.2f}" if r.get("host_ms_per_step") is not None else "-"
        cpu = f"{r['host_thread_cpu_ms_per_step']:.2f}" if r.get("host_thread_cpu_ms_per_step") is not None else "-"
        per = [f"{r[k]:.1f}" if k in r else "-" for k in ("launches_per_step", "transfers_per_step")]
        print(f"{r['runtime']:<28} {r['ms_per_step']:>9.2f} {host:>8} {cpu:>7} {r['tokens_per_s']:>10.0f} "
              f"{(f'{100 * m:.1f}%' if m is not None else '-'):>6} {gib:>9} {r['first_step_s']:>8.1f} "
              f"{rep[0]:>7} {rep[1]:>7} {rep[2]:>8} {per[0]:>7} {per[1]:>5} {r['loss']:>8.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtimes", nargs="+", help="default: cuda_eager inductor traced txc_compile dynamo dynamo_opt "
                                                  "dynamo_step with CUDA, else cpu_eager traced txc_compile dynamo "
                                                  "dynamo_opt dynamo_step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, batch 2 x 32 (CPU smoke)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int, help="hidden size (the intermediate size scales with it)")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--floor", action="store_true", help="add the dynamo rows' floor rows (dynamo:floor ...): "
                                                          "torch's own host time per step on each route")
    ap.add_argument("--peak-tflops", type=float, help="the device's dense bf16 TFLOP/s for MFU")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per runtime's process")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "llama.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the worker: one runtime, its result on stdout
    a = ap.parse_args()
    cfg = dict(TINY if a.tiny else ISSUE)
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    if a.hidden:
        cfg["intermediate_size"] = cfg["intermediate_size"] * a.hidden // cfg["hidden_size"]
        cfg["hidden_size"] = a.hidden
    batch = a.batch or (2 if a.tiny else 8)
    seq = a.seq or (32 if a.tiny else 1024)
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], seq)
    if a.one:
        r = run_one(a.one, cfg, batch, seq, a.steps, a.warmup)
        print(_RESULT + json.dumps(r), flush=True)
        return
    specs = a.runtimes or default_runtimes()
    if a.floor:
        specs += [f"{s}:floor" for s in specs if s in DYNAMO and f"{s}:floor" not in specs]
    for s in specs:
        parse_spec(s)
    passthrough = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(batch), "--seq", str(seq),
                   "--layers", str(cfg["num_hidden_layers"]), "--hidden", str(cfg["hidden_size"])] + (
                      ["--tiny"] if a.tiny else [])
    rows = []
    for s in specs:
        print(f"... {s}", file=sys.stderr, flush=True)
        r = run_process(s, passthrough, a.timeout)
        if "ms_per_step" in r:
            r["mfu"] = mfu(r, a.peak_tflops)
        rows.append(r)
    print(f"\nLlama {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, batch {batch} x {seq}, bf16, "
          f"AdamW; {a.steps} steps after {a.warmup} warmup")
    table(rows, a.peak_tflops)
    ratio, cpu_ratio = host_ratio(rows), host_ratio(rows, "host_thread_cpu_ms_per_step")
    if ratio is not None:
        print(f"host ms per step, traced / txc_compile: {ratio:.1f}x wall, {cpu_ratio:.1f}x thread CPU time "
              f"(issue 29's target on CPU: >= 20x)")
    dyn = {}
    for name, den in (("dynamo", "txc_compile"), ("dynamo", "traced"), ("dynamo_opt", "txc_compile"),
                      ("dynamo_step", "txc_compile"), ("dynamo:floor", "txc_compile"),
                      ("dynamo_opt:floor", "txc_compile"), ("dynamo_step:floor", "txc_compile"),
                      ("dynamo:floor", "dynamo"), ("dynamo_opt:floor", "dynamo_opt"),
                      ("dynamo_step:floor", "dynamo_step")):
        w, c = host_ratio(rows, num=name, den=den), host_ratio(rows, "host_thread_cpu_ms_per_step", name, den)
        if w is not None:
            dyn[f"{name}/{den}"] = {"wall": w, "thread_cpu": c}
            print(f"host ms per step, {name} / {den}: {w:.2f}x wall, {c:.2f}x thread CPU time")
    import platform
    import datetime
    import torch
    doc = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "python": platform.python_version(), "torch": torch.__version__, "config": cfg, "batch": batch,
           "seq": seq, "steps": a.steps, "warmup": a.warmup, "rows": rows, "host_ratio_traced_captured": ratio,
           "host_thread_cpu_ratio_traced_captured": cpu_ratio, "host_ratios_dynamo": dyn}
    try:
        import transformers
        import jax
        doc.update(transformers=transformers.__version__, jax=jax.__version__)
    except ImportError:
        pass
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

#!/bin/bash
# The GPU checks of a session lent a device machine, as one prepared run
# (the device tool's `run`; ~8 minutes of its 15: with the default BUDGET the
# issue-29 steps llama/sdpa/gemm run first and the older ones as time allows;
# STEPS="tests memory replay kernels" for those). That machine has Python
# 3.12, torch 2.11, jax 0.11 with the CUDA 13 plugin, no network; our core is
# built here for it and carried:
#   echo /.whl/ >> .git/info/exclude
#   python3.12 -m venv /tmp/v312 && /tmp/v312/bin/pip install scikit-build-core pybind11 ninja
#   CMAKE_BUILD_PARALLEL_LEVEL=2 /tmp/v312/bin/pip wheel --no-build-isolation --no-deps -w .whl .
#   unzip -o .whl/*.whl 'torch_xla_core/*.so' -d .
# then run: bench/device_check.sh, carry ["torch_xla_core/_C.cpython-312-x86_64-linux-gnu.so",
# "torch_xla_core/_bench_core.cpython-312-x86_64-linux-gnu.so"], timeout_s ~500.
# STEPS picks the steps (default all), BUDGET the seconds for all of them;
# each step's output goes to $OUT/all.log, the benchmarks' JSON beside it.
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PJRT_DEVICE=${PJRT_DEVICE:-CUDA} TXC_COMPILE_CACHE=off
OUT=${OUT:-/tmp/device_check}; mkdir -p "$OUT"
START=$(date +%s); BUDGET=${BUDGET:-450}
LOG=$OUT/all.log
step() {
  local name=$1 lim=$2; shift 2
  local el=$(( $(date +%s) - START )); local left=$(( BUDGET - el ))
  if [ $left -lt 25 ]; then echo "=== SKIP $name (out of time)" | tee -a "$LOG"; return; fi
  [ "$lim" -gt $left ] && lim=$left
  echo "=== $name (limit $lim s, at $el s)" | tee -a "$LOG"
  timeout "$lim" "$@" >> "$LOG" 2>&1
  echo "=== $name rc=$? at $(( $(date +%s) - START )) s" | tee -a "$LOG"
}
{ nvidia-smi -L; python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"; } >> "$LOG" 2>&1
# issue 29 first: the Llama step on every runtime, then the attention and GEMM choices on it
for s in ${STEPS:-llama sdpa gemm scan tests memory replay kernels dp ckpt collreplay}; do
  case $s in
    # issue 29's workload at its size (bf16 160M Llama, AdamW, 8 x 1024): CUDA eager, inductor, ours traced,
    # txc.compile and the dynamo route, each in its own process (~40 s each: startup, compiles, 2 + 8 steps)
    llama) step llama 230 python3 bench/llama.py --steps 8 --warmup 2 --timeout 110 --out "$OUT/llama.json" ;;
    # attention on that step (captured: the device's time shows): the Pallas/Triton flash kernel ('auto' now
    # picks it for bf16), XLA's cuDNN fused attention, the core sdpa op (bf16 products)
    sdpa) step sdpa 170 python3 bench/llama.py --steps 8 --warmup 2 --timeout 80 \
            --runtimes txc_compile:sdpa=flash txc_compile:sdpa=cudnn txc_compile:sdpa=xla --out "$OUT/llama_sdpa.json" ;;
    # GEMMs on that step: XLA's Triton gemm fusions (the default) vs cuBLAS for every GEMM
    gemm) step gemm 120 python3 bench/llama.py --steps 8 --warmup 2 --timeout 80 \
            --runtimes txc_compile txc_compile:cublas --out "$OUT/llama_gemm.json" ;;
    # issue 29 part 4: the same Llama step with its decoder layers scanned (scan_decoder_layers) vs unrolled,
    # traced and captured: first step and cached ms/step ratios
    scan) step scan 150 python3 bench/scan_hf.py --issue --methods unrolled scan unrolled+compile scan+compile \
            --out "$OUT/scan_hf.json" ;;
    # one GPU, several test processes: no preallocation (each would take 75% of the memory)
    tests) XLA_PYTHON_CLIENT_PREALLOCATE=false step tests 120 python3 -m pytest -q -p no:cacheprovider -n 4 -rf \
             tests/test_offload.py tests/test_memory.py tests/test_donation.py tests/test_runtime.py tests/test_kernels.py \
             tests/test_half_precision.py tests/test_foreach_fused.py ;;
    # autotuning off: the 16-layer step compiles in ~10 s instead of ~45 s per configuration
    memory) XLA_FLAGS=--xla_gpu_autotune_level=0 step memory 200 python3 bench/memory.py --layers 16 --width 512 \
              --batch 8 --seq 1024 --steps 2 --configs loop loop-offload loop-nodonate scan-offload scan-save \
              --out "$OUT/memory.json" ;;
    # issue 42: data parallel on 1 and 2 processes (XLA's NCCL collectives), ours (DDP on xla,
    # txc.optimizer_step) vs torch DDP over gloo on CPU tensors; no preallocation: the processes share the
    # machine's GPUs (NCCL refuses two ranks on one GPU, so with a single GPU the 2-process xla rows fail, named)
    dp) XLA_PYTHON_CLIENT_PREALLOCATE=false step dp 200 python3 bench/dp.py --procs 1 2 --steps 8 --timeout 90 \
          --json "$OUT/dp.json" ;;
    replay) step replay 100 python3 bench/replay.py --models mlp --steps 10 --warmup 2 --out "$OUT/replay.json" ;;
    # issue 38: step time while an async checkpoint is written, the compute on the device (on the 2-core CPU
    # host the writer and XLA:CPU's compute share the same cores)
    ckpt) step ckpt 120 python3 bench/checkpoint.py --runtime compiled --writers process,thread --rounds 8 \
            --out "$OUT/checkpoint.json" ;;
    # issue 42: a 2-process data-parallel step traced vs replayed, on that machine's CPUs (16 cores: the two
    # ranks' XLA:CPU threads off each other's cores, which the 2-core host cannot give)
    collreplay) PJRT_DEVICE=CPU step collreplay 150 python3 bench/collective_replay.py --out "$OUT/collective_replay.json" ;;
    kernels) step kernels 90 python3 bench/kernels.py --sections attention --seq 1024 4096 --dtype bfloat16 \
               --out "$OUT/kernels.json" ;;
  esac
done
grep -v "torch_xla_core: compil\|Source Location\|external/xla" "$LOG" | tail -c 11000

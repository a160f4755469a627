#!/usr/bin/env bash
# The CUDA backend's check on a GPU host, from the repository root:
#   tests/cuda/gpu_check.sh [BIN_DIR [OUT_DIR [SWEEP ...]]]
# BIN_DIR (default build/) holds llmhpc and the test_cuda_* executables (build-cuda/ and
# build-cuda/tests/, or a folder made by scripts/gpu/pack_binaries.sh); OUT_DIR defaults to
# results/gpu-check-<time>. Runs every CUDA test, the kernel timings and bench sweeps, each
# under a time limit; full logs go to OUT_DIR, and a short summary to stdout. The bench sweeps
# are the arguments after the first two, one quoted argument list each; without them the
# default set below runs.
set -uo pipefail
source "$(dirname "$0")/../../scripts/gpu/setup.sh" gpu-check "${1:-}" "${2:-}"
shift $(($# < 2 ? $# : 2))  # what follows BIN_DIR and OUT_DIR: the bench sweeps
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
ldd "$bin/llmhpc" | grep "not found" | sed 's/^/missing library: /'

status=0
for t in test_cuda_device test_cuda_ops test_cuda_model test_cuda_profiler; do
  timeout 300 "$(find_exe $t)" >>"$out/tests.log" 2>&1 || status=1
done
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|model:|Expected|Which is|Value of|actual" "$out/tests.log" | head -60
echo "tests: $([ $status = 0 ] && echo all passed || echo FAILURES)"

timeout 240 "$(find_exe kernel_bench)" >"$out/kernels.log" 2>&1
grep "^BENCH" "$out/kernels.log"

# Training end to end: the same tiny run on the GPU and on the CPU (fp32, sequential data)
# must print the same losses; a bf16 run must train too.
if python3 -c "import numpy" 2>/dev/null; then
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 10000, 400000).astype(np.uint16).tofile('/tmp/llmhpc_tokens.bin')"
  for run in "cuda fp32" "cpu fp32" "cuda bf16"; do
    read -r device precision <<<"$run"
    echo "== train on $device, $precision" >>"$out/train.log"
    timeout 120 "$bin/llmhpc" --mode train --device "$device" --precision "$precision" --model tiny \
      --data /tmp/llmhpc_tokens.bin --data-order sequential --steps 30 --log-every 10 \
      --out "/tmp/llmhpc_train_${device}_$precision" >>"$out/train.log" 2>&1
    echo "train $device $precision: exit $?"
  done
  grep -E "^== |^step|final" "$out/train.log"
fi

if [ $# = 0 ]; then
  set -- "--model small,medium,large,xl,2.7B --precision fp32,bf16" \
         "--model 2.7B --context-length 512 --precision bf16 --phase forward-backward"
fi
k=0
for sweep in "$@"; do
  k=$((k + 1))
  timeout 300 "$bin/llmhpc" --mode bench --device cuda $sweep --out "$out/bench$k" >"$out/bench$k.log" 2>&1
  echo "bench $k ($sweep): exit $?"
  sed -n '/bench summary/,$p' "$out/bench$k.log" | cut -c1-160
done
exit $status

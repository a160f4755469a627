#!/usr/bin/env bash
# Mode profile's first GPU session (CUPTI): its CUDA tests, a small model profiled with naive
# and flash attention in fp32 and bf16 with a trace, the seeds' xl at context 256, the
# fallback (--no-cupti), analysis/profile.py on each, and, where nsys is installed, Nsight
# Systems' kernel summary of bench's same steps to set beside ours. From the repository root:
#   scripts/gpu/profile_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR holds llmhpc and test_cuda_profiler (build/ and build/tests/, or carry/cuda/ from
# tests/cuda/make_carry.sh). Every step has a time limit; logs and results go to OUT_DIR.
set -uo pipefail
source "$(dirname "$0")/setup.sh" profile-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
test=$bin/test_cuda_profiler; [ -x "$test" ] || test=$bin/tests/test_cuda_profiler
timeout 300 "$test" >"$out/tests.log" 2>&1; echo "test_cuda_profiler: exit $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|Value of|actual" "$out/tests.log" | head -40

profile() {  # NAME, then llmhpc's options
  local name=$1; shift
  timeout 300 "$bin/llmhpc" --mode profile --device cuda "$@" --out "$out/$name" >"$out/$name.log" 2>&1
  echo "== $name: exit $?"; sed -n '/profile summary/,$p' "$out/$name.log"
  timeout 120 python3 "$root/analysis/profile.py" "$out/$name" >"$out/$name.md" 2>&1 || echo "analysis of $name failed"
}
profile small --model small --context-length 128 --precision fp32,bf16 --attention naive,flash --warmup 3 --steps 5 \
  --trace
profile xl --model xl --context-length 256 --warmup 3 --steps 3
profile xl-events --model xl --context-length 256 --warmup 3 --steps 3 --no-cupti
ls -la "$out"/small/trace_rank00000.json 2>/dev/null
if command -v nsys >/dev/null; then
  timeout 300 nsys profile -t cuda,nvtx -o "$out/xl_bench" --force-overwrite true "$bin/llmhpc" --mode bench \
    --device cuda --model xl --context-length 256 --warmup 3 --steps 3 --out "$out/xl_bench" >"$out/nsys.log" 2>&1
  nsys stats -r cuda_gpu_kern_sum "$out/xl_bench.nsys-rep" >"$out/xl_nsys_kernels.txt" 2>&1
  echo "nsys: exit $?"; head -20 "$out/xl_nsys_kernels.txt"
fi

#!/usr/bin/env bash
# The model on a GPU host, in one run: CUDA tests, the PyTorch training cross-check, the
# GPU's measured ceilings, and llmhpc next to PyTorch (analysis/torch_baseline.py) on the
# same GPU. Run from the repository root:
#   scripts/gpu/model_check.sh [BIN_DIR [OUT_DIR [bench args ...]]]
# BIN_DIR (default build/) holds llmhpc and the test_cuda_* executables, in it or its tests/ (see
# scripts/gpu/pack_binaries.sh); OUT_DIR defaults to results/model-check-<time>.
# Environment: TORCH_RUNS, PyTorch runs separated by ';', each the arguments of one
# analysis/torch_baseline.py call (default: eager and compiled, fp32 and bf16, contexts
# 128 and 512); TORCH_TIMEOUT (s, default 300); LLMHPC_TIMEOUT (s, default 300); SKIP_TESTS=1;
# SKIP_CEILINGS=1. Every step has a time limit;
# logs go to OUT_DIR.
set -uo pipefail
source "$(dirname "$0")/setup.sh" model-check "${1:-}" "${2:-}"
shift $(($# < 2 ? $# : 2))  # what follows BIN_DIR and OUT_DIR: the bench arguments
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ >>"$out/device.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in test_cuda_device test_cuda_ops test_cuda_model; do
    timeout 240 "$(find_exe $t)" >>"$out/tests.log" 2>&1; echo "$t: exit $?"
  done
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$out/tests.log"
  LLMHPC_BIN=$bin/llmhpc LLMHPC_ROOT=$PWD timeout 180 python3 tests/scripts/test_reference_torch.py >"$out/reference_torch.log" 2>&1
  echo "test_reference_torch: exit $?"; tail -12 "$out/reference_torch.log"
fi

[ "${SKIP_CEILINGS:-0}" = 1 ] || timeout 120 python3 analysis/torch_baseline.py --ceilings --out "$out/torch.jsonl" >>"$out/torch.log" 2>&1
tail -1 "$out/torch.jsonl"

# llmhpc's sweep (default: every size at context 128 and 512, fp32 and bf16).
[ $# -gt 0 ] || set -- --model small,medium,large,xl,2.7B --context-length 128,512 --precision fp32,bf16
timeout "${LLMHPC_TIMEOUT:-300}" "$bin/llmhpc" --mode bench --device cuda "$@" --out "$out/llmhpc" >"$out/llmhpc.log" 2>&1
echo "llmhpc bench: exit $?"; sed -n '/bench summary/,$p' "$out/llmhpc.log" | cut -c1-170

deadline=$((SECONDS + ${TORCH_TIMEOUT:-300}))
IFS=';' read -ra runs <<<"${TORCH_RUNS:---context-length 128,512 --precision fp32,bf16 --setup eager,compiled}"
for args in "${runs[@]}"; do
  left=$((deadline - SECONDS)); [ $left -gt 10 ] || { echo "torch: no time left for: $args"; continue; }
  # shellcheck disable=SC2086
  timeout $left python3 analysis/torch_baseline.py $args --out "$out/torch.jsonl" >>"$out/torch.log" 2>&1
  echo "torch baseline ($args): exit $?"
done
python3 analysis/model_bench.py "$out/llmhpc" "$out/torch.jsonl" | tee "$out/model_bench.md"

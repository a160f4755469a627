#!/usr/bin/env bash
# Modes memory and precision on a GPU host, and the default plan's memory against PyTorch's
# strongest setup, in one run (about 8 minutes on an H100). Run from the repository root:
#   scripts/gpu/memory_check.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR (default build/) holds llmhpc and test_cuda_memory, in it or its tests/ (a build folder,
# or one made by scripts/gpu/pack_binaries.sh).
# Parts, each with a time limit, every one run whatever the others did; the exit status is
# non-zero if any failed:
#   1. test_cuda_memory (AdamW in backward bitwise the separate optimizer, the trace, precision);
#   2. mode precision (the accumulation experiment on the GPU; the bf16 dtype table);
#   3. mode memory over the reference memory study's grid: 2.7B and xl x context
#      128/256/512/1024 x forward and train step x fp32 and bf16 (flash attention), and one --snapshot (xl, 256, bf16, train
#      step) checked with pickle.load (and torch.cuda._memory_viz, which PyTorch has);
#      analysis/memory.py's tables and PNG timelines;
#   4. llmhpc's default plan (bench: train step, flash) and PyTorch's strongest setup
#      (analysis/torch_baseline.py: torch.compile + SDPA + fused AdamW, gradients freed before
#      forward, max_memory_allocated) at every size x context 128/256/512/1024 x bf16/fp32,
#      2 warm-up + 3 timed steps; PyTorch gets TORCH_DEADLINE s (default 210; bf16 first, the
#      configurations it does not reach are recorded "not run"); analysis/model_bench.py's
#      step and peak-memory tables.
# PARTS (default "tests precision memory bench") selects parts, e.g. PARTS=bench; part 4's grid
# takes MODELS (default small,medium,large,xl,2.7B), CONTEXTS (128,256,512,1024) and PRECISIONS
# (bf16,fp32), e.g. PARTS=bench MODELS=2.7B CONTEXTS=512,1024 for configurations PyTorch missed.
# Everything goes to OUT_DIR (default results/memory_check-<time>): logs, rank files, tables
# (*.md), PNGs (png/), the snapshot.
set -uo pipefail
source "$(dirname "$0")/setup.sh" memory_check "${1:-}" "${2:-}"
cd "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
failed=()
parts=" ${PARTS:-tests precision memory bench} "
want() { [[ $parts == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT_S COMMAND...: runs it with its log in OUT_DIR/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)"
  [ $rc -eq 0 ] || failed+=("$name")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ >>"$out/device.txt"

# 1. GPU tests.
if want tests; then
  step test_cuda_memory 120 "$(find_exe test_cuda_memory)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/test_cuda_memory.log"
fi

# 2. Mode precision.
want precision && step precision 60 "$bin/llmhpc" --mode precision --device cuda --model small --precision bf16 --out "$out/precision"
want precision && sed -n '/accumulation experiment:/,$p' "$out/precision.log"

# 3. Mode memory: the reference memory study's grid, then one snapshot.
if want memory; then
step memory 480 "$bin/llmhpc" --mode memory --device cuda --model 2.7B,xl --context-length 128,256,512,1024 \
  --precision fp32,bf16 --attention flash --phase forward,train-step --out "$out/memory"
sed -n '/peak memory by context length/,$p' "$out/memory.log"
step snapshot 60 "$bin/llmhpc" --mode memory --device cuda --model xl --context-length 256 --precision bf16 \
  --attention flash --phase train-step --snapshot "$out/xl_T256_bf16_train-step.pickle" --out "$out/memory-snapshot"
sed -n '/memory summary/,$p' "$out/snapshot.log"
step snapshot_load 60 python3 - "$out/xl_T256_bf16_train-step.pickle" <<'EOF'
import pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
trace = snap["device_traces"][0]
print(len(snap["segments"]), "live segments,", len(trace), "events:", sorted({e["action"] for e in trace}))
try:
    from torch.cuda import _memory_viz
except ImportError:
    sys.exit("PyTorch not importable: torch.cuda._memory_viz not run")
print(_memory_viz.segsum(snap)[:2000])
html = _memory_viz.trace_plot(snap)
open(sys.argv[1] + ".html", "w").write(html)
print("trace_plot:", len(html), "bytes of HTML; segment_plot:", len(_memory_viz.segment_plot(snap)))
EOF
cat "$out/snapshot_load.log"
step memory_tables 120 python3 analysis/memory.py "$out/memory" "$out/memory-snapshot" --png "$out/png"
cp "$out/memory_tables.log" "$out/memory.md"
fi

# 4. The default plan against PyTorch's strongest setup, side by side.
if want bench; then
grid=(--model "${MODELS:-small,medium,large,xl,2.7B}" --context-length "${CONTEXTS:-128,256,512,1024}" --warmup 2
  --steps 3)
step bench 150 "$bin/llmhpc" --mode bench --device cuda "${grid[@]}" --precision "${PRECISIONS:-bf16,fp32}" --attention flash \
  --out "$out/bench"
sed -n '/bench summary/,$p' "$out/bench.log" | cut -c1-200
step torch $((${TORCH_DEADLINE:-210} + 60)) python3 analysis/torch_baseline.py --setup compiled "${grid[@]}" \
  --precision "${PRECISIONS:-bf16,fp32}" --deadline-s "${TORCH_DEADLINE:-210}" --out "$out/torch.jsonl"
step model_bench 60 python3 analysis/model_bench.py "$out/bench" "$out/torch.jsonl"
cp "$out/model_bench.log" "$out/model_bench.md"
sed -n '/Peak memory/,$p' "$out/model_bench.md"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "memory_check: FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
echo "memory_check: all parts ran; results in $out"

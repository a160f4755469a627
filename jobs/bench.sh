#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-bench
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The seeds' end-to-end benchmark: every size at several context lengths, fp32 and bf16,
# forward, backward and optimizer timed separately, then the markdown table.
#   sbatch jobs/bench.sh            or   NP=1 bash jobs/bench.sh
#   MODELS=small,medium CONTEXTS=128 PRECISIONS=fp32 bash jobs/bench.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
MODELS=${MODELS:-small,medium,large,xl,2.7B}
CONTEXTS=${CONTEXTS:-128,256,512,1024}
PRECISIONS=${PRECISIONS:-fp32,bf16}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-10}
OUT=${OUT:-$OUT_ROOT/bench-$(stamp)}
$LAUNCH "$LLMHPC_BIN" --mode bench --model "$MODELS" --context-length "$CONTEXTS" --precision "$PRECISIONS" \
  --warmup "$WARMUP" --steps "$STEPS" --phase train-step --out "$OUT" ${EXTRA_ARGS:-}
$PYTHON "$LLMHPC_ROOT/analysis/report.py" "$OUT"

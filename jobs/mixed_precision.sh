#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-mixed-precision
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference mixed-precision study's comparison (benchmarking_mixed_precision): every size
# at each context, fp32 and bf16 (PRECISIONS), forward-backward-AdamW steps; $OUT/report.md has the
# fp32 against bf16 table with speed-ups of forward, backward, AdamW and the whole step, the peak
# memory of both, bench.png and bench_speedup_bf16.png. (On CPUs bf16 is computed in fp32 on
# bf16 values: correct, not fast.)
#   sbatch jobs/mixed_precision.sh     or   MODELS=small,xl CONTEXTS=128 bash jobs/mixed_precision.sh
#   DEVICE=cpu MODELS=small CONTEXTS=32 WARMUP=1 STEPS=3 \
#     EXTRA_ARGS="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" bash jobs/mixed_precision.sh   # tiny, on CPUs
# Variables (defaults): MODELS (small,medium,large,xl,2.7B), CONTEXTS (128,256,512,1024),
# PRECISIONS (fp32,bf16), WARMUP (5), STEPS (10), PHASE (train-step), ADAMW_IN_BACKWARD (0).
# As in the reference PyTorch step, AdamW runs after backward, timed as its own phase (llmhpc
# --separate-optimizer, given unless PHASE is forward), so the backward speed-up is backward's
# alone. ADAMW_IN_BACKWARD=1 runs llmhpc's own plan instead: AdamW inside backward (Bwd+AdamW).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-small,medium,large,xl,2.7B}
CONTEXTS=${CONTEXTS:-128,256,512,1024}
PRECISIONS=${PRECISIONS:-fp32,bf16}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-10}
PHASE=${PHASE:-train-step}
ADAMW_IN_BACKWARD=${ADAMW_IN_BACKWARD:-0}
require_flag ADAMW_IN_BACKWARD
optimizer=()  # a forward alone makes no gradients to keep
[ "$ADAMW_IN_BACKWARD" = 0 ] && [ "$PHASE" != forward ] && optimizer=(--separate-optimizer)
llmhpc_run --mode bench --model "$MODELS" --context-length "$CONTEXTS" --precision "$PRECISIONS" --warmup "$WARMUP" \
  --steps "$STEPS" --phase "$PHASE" "${optimizer[@]}" --heat-s "$HEAT_S" --out "$OUT"
job_report

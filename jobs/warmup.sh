#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-warmup
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00
# The reference end-to-end benchmark's warm-up study: the same forward-backward sweep with 0, 1, 2 and 5 warm-up steps
# (WARMUPS), one run each in $OUT/warmup<N>, then $OUT/report.md with one table per setting.
#   sbatch jobs/warmup.sh          or   MODELS=small,medium WARMUPS=0,1 bash jobs/warmup.sh
#   DEVICE=cpu MODELS=small CONTEXTS=32 WARMUPS=0,1 STEPS=3 \
#     EXTRA_ARGS="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" bash jobs/warmup.sh   # a tiny model on CPUs
# Variables (defaults): MODELS (small,medium,large,xl,2.7B), CONTEXTS (128), WARMUPS (0,1,2,5),
# STEPS (10).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-small,medium,large,xl,2.7B}
CONTEXTS=${CONTEXTS:-128}
WARMUPS=${WARMUPS:-0,1,2,5}
STEPS=${STEPS:-10}
require_numbers WARMUPS 0
for w in ${WARMUPS//,/ }; do
  llmhpc_run --mode bench --model "$MODELS" --context-length "$CONTEXTS" --phase forward-backward --warmup "$w" \
    --steps "$STEPS" --out "$OUT/warmup$w"
done
job_report

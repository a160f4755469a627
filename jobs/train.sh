#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=04:00:00
# Training on a token file: DATA=path/to/tokens.bin sbatch jobs/train.sh
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
DATA=${DATA:?set DATA to a .bin (uint16) or .npy token file}
MODEL=${MODEL:-small}
STEPS=${STEPS:-1000}
llmhpc_run --mode train --data "$DATA" --model "$MODEL" --steps "$STEPS" --out "$OUT" --save "$OUT/final.h5"
job_report  # $OUT/report.md: loss and step times, train_loss.png

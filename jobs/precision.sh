#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-precision
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=00:10:00
# The reference mixed-precision study's questions: the accumulation experiment (1000 additions
# of 0.01 in fp32, in fp16, fp16 values into an fp32 sum, fp16 values cast to fp32 before each
# addition, then bf16) on the device in use, and under bf16 the dtype of the parameters, each
# layer's outputs, the logits, the loss and the gradients, beside autocast's rules. The numbers
# go to the rank files, the tables to $OUT/report.md (analysis/precision.py).
#   sbatch jobs/precision.sh       or   DEVICE=cpu bash jobs/precision.sh
# Variables (defaults): MODELS (small; one preset), PRECISIONS (bf16; one precision).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-small}
PRECISIONS=${PRECISIONS:-bf16}
llmhpc_run --mode precision --model "$MODELS" --precision "$PRECISIONS" --out "$OUT"
job_report

#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-profile
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference nsys study (nsys_profile) without Nsight: every kernel of the traced train steps per
# phase (CUPTI), the share of matrix products, attention's parts, then analysis/kernel_profile.py's
# tables (profile_rank0.md) and plot (profile_rank0.png), and the job's report.md.
#   sbatch jobs/profile.sh          or   NP=1 bash jobs/profile.sh
#   MODELS=xl CONTEXTS=256 TRACE=1 bash jobs/profile.sh      # + trace_rank00000.json for ui.perfetto.dev
#   DEVICE=cpu MODELS=small CONTEXTS=32 WARMUP=1 STEPS=2 \
#     EXTRA_ARGS="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" bash jobs/profile.sh   # a tiny model on CPUs (ops, not kernels)
# Variables (defaults): MODELS (small,medium,large,xl,2.7B), CONTEXTS (128,256,512), PRECISIONS
# (fp32), ATTENTIONS (naive), WARMUP (5), STEPS (5), TRACE (0); the phase is train-step.
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-small,medium,large,xl,2.7B}
CONTEXTS=${CONTEXTS:-128,256,512}
PRECISIONS=${PRECISIONS:-fp32}
ATTENTIONS=${ATTENTIONS:-naive}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-5}
TRACE=${TRACE:-0}
require_flag TRACE
trace=()
[ "$TRACE" = 1 ] && trace=(--trace)
llmhpc_run --mode profile --model "$MODELS" --context-length "$CONTEXTS" --precision "$PRECISIONS" \
  --attention "$ATTENTIONS" --warmup "$WARMUP" --steps "$STEPS" --phase train-step "${trace[@]}" --out "$OUT"
"$PYTHON" "$LLMHPC_ROOT/analysis/kernel_profile.py" "$OUT"   # $OUT/profile_rank0.md and .png
job_report

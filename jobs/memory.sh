#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-memory
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference memory study (memory_profiling) without PyTorch's memory viewer: every
# allocation of a forward and of a train step (mode memory), peaks per phase and by category,
# the largest allocations, the peak table by context length x precision; then
# analysis/memory.py's tables and the timeline PNGs (report.md beside the results). SNAPSHOT=1
# also writes snapshot*.pickle for pytorch.org/memory_viz (one per configuration).
#   sbatch jobs/memory.sh          or   MODELS=xl CONTEXTS=256 SNAPSHOT=1 bash jobs/memory.sh
#   DEVICE=cpu MODELS=small CONTEXTS=32 PRECISIONS=fp32 \
#     EXTRA_ARGS="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" bash jobs/memory.sh   # a tiny model on CPUs
# Variables (defaults): MODELS (xl,2.7B), CONTEXTS (128,256,512,1024), PRECISIONS (fp32,bf16),
# PHASES (forward,train-step), SNAPSHOT (0), ADAMW_IN_BACKWARD (0).
# The train step is the reference PyTorch step's: backward keeps a gradient for every parameter,
# then AdamW runs as a phase of its own, with its own peak and its own span in the timelines
# (llmhpc --separate-optimizer, given unless PHASES is forward alone). ADAMW_IN_BACKWARD=1 traces
# llmhpc's own plan instead: AdamW updates each layer inside backward as soon as its gradients
# are final, so backward holds one layer's gradients, not the model's (4 bytes per parameter
# less), and there is no optimizer phase.
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-xl,2.7B}
CONTEXTS=${CONTEXTS:-128,256,512,1024}
PRECISIONS=${PRECISIONS:-fp32,bf16}
PHASES=${PHASES:-forward,train-step}
SNAPSHOT=${SNAPSHOT:-0}
ADAMW_IN_BACKWARD=${ADAMW_IN_BACKWARD:-0}
require_flag SNAPSHOT
require_flag ADAMW_IN_BACKWARD
snapshot=()
[ "$SNAPSHOT" = 1 ] && snapshot=(--snapshot "$OUT/snapshot.pickle")
optimizer=()  # llmhpc refuses it where no phase makes gradients (a forward keeps none either way)
[ "$ADAMW_IN_BACKWARD" = 0 ] && [ "$PHASES" != forward ] && optimizer=(--separate-optimizer)
llmhpc_run --mode memory --model "$MODELS" --context-length "$CONTEXTS" --precision "$PRECISIONS" \
  --phase "$PHASES" "${optimizer[@]}" "${snapshot[@]}" --out "$OUT"
job_report

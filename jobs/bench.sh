#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-bench
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference end-to-end benchmark: every size at several context lengths, fp32 and bf16,
# forward, backward and optimizer timed separately, then the markdown table.
#   sbatch jobs/bench.sh            or   NP=1 bash jobs/bench.sh
#   MODELS=small,medium CONTEXTS=128 PRECISIONS=fp32 bash jobs/bench.sh
#   DEVICE=cpu MODELS=small CONTEXTS=32 PRECISIONS=fp32 WARMUP=1 STEPS=3 \
#     EXTRA_ARGS="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" bash jobs/bench.sh   # a tiny model on CPUs
# Variables (defaults): MODELS (small,medium,large,xl,2.7B), CONTEXTS (128,256,512,1024),
# PRECISIONS (fp32,bf16), WARMUP (5), STEPS (10), PHASE (train-step), ADAMW_IN_BACKWARD (0).
# As in the reference PyTorch step, every gradient is kept and AdamW runs after backward, timed
# as its own phase (llmhpc --separate-optimizer, given unless PHASE is forward): the tables show
# Bwd and Opt. ADAMW_IN_BACKWARD=1 runs llmhpc's own plan instead: AdamW updates each layer inside
# backward as soon as its gradients are final (4 bytes per parameter less, the same weights), so
# the tables show Bwd+AdamW and no Opt.
# With TORCH=1, the identical PyTorch model on the same GPU in the same job
# (analysis/torch_baseline.py, setups TORCH_SETUPS, default compiled,eager; torch.compile
# spends 20-40 s compiling per configuration), then the side-by-side tables of
# analysis/model_bench.py (docs/results/model-bench.md).
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
TORCH=${TORCH:-0}
require_flag ADAMW_IN_BACKWARD
require_flag TORCH
[ "$TORCH" = 0 ] || require_torch
optimizer=()  # a forward alone makes no gradients to keep
[ "$ADAMW_IN_BACKWARD" = 0 ] && [ "$PHASE" != forward ] && optimizer=(--separate-optimizer)
llmhpc_run --mode bench --model "$MODELS" --context-length "$CONTEXTS" --precision "$PRECISIONS" \
  --warmup "$WARMUP" --steps "$STEPS" --phase "$PHASE" "${optimizer[@]}" --heat-s "$HEAT_S" --out "$OUT"
if [ "$TORCH" = 1 ]; then
  $PYTHON "$LLMHPC_ROOT/analysis/torch_baseline.py" --model "$MODELS" --context-length "$CONTEXTS" \
    --precision "$PRECISIONS" --setup "${TORCH_SETUPS:-compiled,eager}" --warmup "$WARMUP" --steps "$STEPS" --heat-s "$HEAT_S" \
    --out "$OUT/torch.jsonl"
  $PYTHON "$LLMHPC_ROOT/analysis/torch_baseline.py" --ceilings --out "$OUT/torch.jsonl"
  $PYTHON "$LLMHPC_ROOT/analysis/model_bench.py" "$OUT" "$OUT/torch.jsonl" | tee "$OUT/model-bench.md"
fi
job_report  # $OUT/report.md: the tables (fp32 against bf16 too) and bench.png

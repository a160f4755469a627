#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-ddp-bucketed
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference DDP study (naive_ddp, minimal_ddp_flat, ddp_overlap_individual_parameters
# and ddp_bucketed benchmarking): the xl model at context 128, global batch 4 over NP ranks,
# every strategy (none, the compute-only baseline; naive; flat; overlap; bucketed at each of
# BUCKETS MiB), 5 warm-up and 10 timed steps; then an all-reduce run (llmhpc --mode comm) for
# the bucket model, and the tables of analysis/ddp.py in $OUT/ddp.md, next to the rank files.
#   sbatch jobs/ddp_bucketed.sh       or   bash jobs/ddp_bucketed.sh        (NP=2 ranks)
#   MODELS=large BUCKETS=1,100 PRECISIONS=fp32,bf16 sbatch jobs/ddp_bucketed.sh
#   NP=2 DEVICE=cpu SHAPE="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4 --vocab-size 256" \
#     CONTEXTS=32 COMM_SIZES=4KB,1MB bash jobs/ddp_bucketed.sh          # a tiny model on CPUs
# Variables (defaults): MODELS (xl), SHAPE (none), CONTEXTS (128), BATCH (4: the global batch),
# PRECISIONS (fp32), STRATEGIES (none,naive,flat,overlap,bucketed), SHARDING (none), BUCKETS
# (1,10,25,100,1000), WARMUP (5), STEPS (10), COMM (1), COMM_SIZES (4KB,1MB,100MB,1000MB), TORCH
# (0), TORCH_SETUPS (eager,compiled), TORCHRUN (torchrun --standalone --nproc_per_node $NP).
# SHAPE (a custom model, given to llmhpc and to PyTorch alike) overrides MODELS; EXTRA_ARGS go
# to llmhpc's ddp run only (not to PyTorch, nor to the all-reduce run, whose mode comm refuses
# model and ddp options), last, so they override the job's values there (EXTRA_ARGS="--steps 2"
# over STEPS: jobs/env.sh). COMM=0 skips the all-reduce run (the bucket model is then fitted to the
# bucketed runs). With TORCH=1, PyTorch's DistributedDataParallel on the same model in the same
# job (analysis/torch_ddp.py under torchrun with NP ranks, setups TORCH_SETUPS, at every bucket
# size, and --single for the baseline) and the side-by-side table. SHARDING (--shard-optimizer,
# default none) is what jobs/sharding.sh sets; jobs/ddp_{naive,flat,overlap}.sh run this script
# with their own STRATEGIES. At the end $OUT/report.md (analysis/report.py) with ddp_breakdown.png.
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
NP=${NP:-${SLURM_NTASKS:-2}}
source "$r/jobs/env.sh"
MODELS=${MODELS:-xl}
SHAPE=${SHAPE:-}
CONTEXTS=${CONTEXTS:-128}
BATCH=${BATCH:-4}
PRECISIONS=${PRECISIONS:-fp32}
STRATEGIES=${STRATEGIES:-none,naive,flat,overlap,bucketed}
SHARDING=${SHARDING:-none}
BUCKETS=${BUCKETS:-1,10,25,100,1000}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-10}
COMM=${COMM:-1}
COMM_SIZES=${COMM_SIZES:-4KB,1MB,100MB,1000MB}
TORCH=${TORCH:-0}
TORCH_SETUPS=${TORCH_SETUPS:-eager,compiled}
TORCHRUN=${TORCHRUN:-torchrun --standalone --nproc_per_node $NP}
require_flag COMM
require_flag TORCH
[ "$TORCH" = 0 ] || require_torch "$TORCHRUN"
mkdir -p "$OUT"
echo "$JOB_NAME: $NP rank(s), results in $OUT"

model=(--model "$MODELS" $SHAPE)
sweep=(--context-length "$CONTEXTS" --batch-size "$BATCH" --precision "$PRECISIONS" --warmup "$WARMUP" --steps "$STEPS")
llmhpc_run --mode ddp "${model[@]}" "${sweep[@]}" --ddp "$STRATEGIES" --bucket-mb "$BUCKETS" \
  --shard-optimizer "$SHARDING" --heat-s "$HEAT_S" --out "$OUT"
report_args=()
if [ "$COMM" = 1 ]; then
  $LAUNCH "$LLMHPC_BIN" --mode comm --device "$DEVICE" --collective allreduce --size "$COMM_SIZES" \
    --out "$OUT/allreduce"
  report_args+=(--comm "$OUT/allreduce")
fi
if [ "$TORCH" = 1 ]; then
  for single in "" --single; do
    $TORCHRUN "$LLMHPC_ROOT/analysis/torch_ddp.py" --device "$DEVICE" "${model[@]}" "${sweep[@]}" \
      --setup "$TORCH_SETUPS" --bucket-mb "$BUCKETS" $single --heat-s "$HEAT_S" --out "$OUT/torch_ddp.jsonl"
  done
  report_args+=(--torch "$OUT/torch_ddp.jsonl")
fi
$PYTHON "$LLMHPC_ROOT/analysis/ddp.py" "$OUT" ${report_args[@]+"${report_args[@]}"} --markdown | tee "$OUT/ddp.md"
job_report

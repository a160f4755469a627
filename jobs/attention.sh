#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-attention
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The reference attention study's two grids, naive against FlashAttention-2, then the markdown tables
# (analysis/attention.py):
#   grid 1 (pytorch_attention): batch 8, one head, no mask, head dim 16..128 x seq 256..16384
#                               x fp32/bf16
#   grid 2 (flash_benchmarking): batch 1, one head, causal, seq 128..65536 x head dim 16..128
#                                x bf16/fp32
# With TORCH=1, PyTorch on the same GPU too (analysis/torch_attention.py), on the shapes of the grids
# that run: its fused attention on their bf16 shapes, for the comparison tables; and on grid 1's
# shapes, its naive attention eager and under torch.compile (compiled once per shape, before the
# warm-up), for the reference study's eager-against-compiled table.
#   sbatch jobs/attention.sh          or   bash jobs/attention.sh
#   GRIDS=2 SEQS2=1024,4096 PRECISIONS2=bf16 ITERS=20 bash jobs/attention.sh
#   DEVICE=cpu HEAD_DIMS=16,32 SEQS1=64,128 PRECISIONS1=fp32 SEQS2=64,128 PRECISIONS2=fp32 \
#     WARMUP=1 ITERS=3 bash jobs/attention.sh   # short sequences on CPUs
#   TORCH=1 GRIDS=1 bash jobs/attention.sh    # grid 1 alone, with PyTorch beside it
# Variables (defaults): GRIDS (1,2), HEAD_DIMS (16,32,64,128, both grids), SEQS1
# (256,1024,4096,8192,16384), PRECISIONS1 (fp32,bf16), SEQS2 (128,256,...,65536), PRECISIONS2
# (bf16,fp32), IMPLS (naive,flash), WARMUP (10), ITERS (100), TORCH (0), COMPILE_PRECISIONS
# (PRECISIONS1: those of PyTorch's eager against compiled runs).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
GRIDS=${GRIDS:-1,2}
HEAD_DIMS=${HEAD_DIMS:-16,32,64,128}
SEQS1=${SEQS1:-256,1024,4096,8192,16384}
PRECISIONS1=${PRECISIONS1:-fp32,bf16}
SEQS2=${SEQS2:-128,256,512,1024,2048,4096,8192,16384,32768,65536}
PRECISIONS2=${PRECISIONS2:-bf16,fp32}
IMPLS=${IMPLS:-naive,flash}
WARMUP=${WARMUP:-10}
ITERS=${ITERS:-100}
TORCH=${TORCH:-0}
COMPILE_PRECISIONS=${COMPILE_PRECISIONS:-$PRECISIONS1}
require_flag TORCH
[ "$TORCH" = 0 ] || require_torch
[[ "$GRIDS" =~ ^[12](,[12])*$ ]] || { echo "$0: GRIDS must list 1 and/or 2 (the reference attention study's two grids), not '$GRIDS'" >&2; exit 2; }
mkdir -p "$OUT"

runs=()
if [[ ",$GRIDS," == *",1,"* ]]; then
  $LAUNCH "$LLMHPC_BIN" --mode attention --device "$DEVICE" --batch-size 8 --num-heads 1 --head-dim "$HEAD_DIMS" \
    --context-length "$SEQS1" --causal off --precision "$PRECISIONS1" --attention "$IMPLS" --warmup "$WARMUP" \
    --steps "$ITERS" --out "$OUT/grid1" ${EXTRA_ARGS:-}
  runs+=("$OUT/grid1")
fi
if [[ ",$GRIDS," == *",2,"* ]]; then
  $LAUNCH "$LLMHPC_BIN" --mode attention --device "$DEVICE" --batch-size 1 --num-heads 1 --head-dim "$HEAD_DIMS" \
    --context-length "$SEQS2" --causal on --precision "$PRECISIONS2" --attention "$IMPLS" --warmup "$WARMUP" \
    --steps "$ITERS" --out "$OUT/grid2" ${EXTRA_ARGS:-}
  runs+=("$OUT/grid2")
fi
torch_args=()
if [ "$TORCH" = 1 ] && [[ ",$GRIDS," == *",2,"* ]]; then
  $PYTHON "$LLMHPC_ROOT/analysis/torch_attention.py" --batch 1 --heads 1 --head-dim "$HEAD_DIMS" --seq "$SEQS2" \
    --precision bf16 --causal --warmup "$WARMUP" --iters "$ITERS" --out "$OUT/torch_attention.json"
  torch_args+=(--torch "$OUT/torch_attention.json")
fi
if [ "$TORCH" = 1 ] && [[ ",$GRIDS," == *",1,"* ]]; then
  $PYTHON "$LLMHPC_ROOT/analysis/torch_attention.py" --batch 8 --heads 1 --head-dim "$HEAD_DIMS" --seq "$SEQS1" \
    --precision bf16 --warmup "$WARMUP" --iters "$ITERS" --out "$OUT/torch_grid1.json"
  torch_args+=(--torch "$OUT/torch_grid1.json")
  # naive attention eager and under torch.compile: the eager-against-compiled table
  $PYTHON "$LLMHPC_ROOT/analysis/torch_attention.py" --batch 8 --heads 1 --head-dim "$HEAD_DIMS" --seq "$SEQS1" \
    --precision "$COMPILE_PRECISIONS" --impl naive,compiled --warmup "$WARMUP" --iters "$ITERS" \
    --out "$OUT/torch_compile.json"
  torch_args+=(--torch "$OUT/torch_compile.json")
fi
$PYTHON "$LLMHPC_ROOT/analysis/attention.py" "${runs[@]}" ${torch_args[@]+"${torch_args[@]}"} | tee "$OUT/attention.md"
job_report  # $OUT/report.md: the same tables, attention_time.png and attention_memory.png

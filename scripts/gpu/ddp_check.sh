#!/usr/bin/env bash
# Data parallelism and optimizer sharding on two GPUs of one host, with PyTorch in the same run:
# the measurements behind docs/results/ddp.md and docs/results/sharding.md.
#   scripts/gpu/ddp_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc and, for the tests part, test_comm, test_ddp and
# test_shard (or tests/test_*). PARTS (default "tests ddp shard torch") picks what runs, in this order:
#   tests     test_comm, test_ddp and test_shard under mpirun -np 2: nccl on the GPUs (bitwise
#             where the reduction is the same), mpi on the CPU
#   ddp       every strategy, xl context 128, global batch 4 and 16, fp32 and bf16, buckets 1-1000 MiB
#   shard     --shard-optimizer none,broadcast,zero1 under flat and bucketed 25 MiB, with
#             --share-weights master,bf16 (the bf16 runs once with each), same grid (SHARD
#             replaces those options, e.g. SHARD="--ddp bucketed --shard-optimizer none,zero1")
#   torch     PyTorch eager: DDP (25 MiB buckets) with AdamW and with ZeroRedundancyOptimizer, and
#             FSDP2 (fully_shard per block: fsdp2, ZeRO-3, and fsdp2-noreshard, ZeRO-2-like), the
#             --shard-optimizer values in TORCH_SHARD (default none,zero,fsdp2,fsdp2-noreshard); and
#             PyTorch alone on one GPU at the local batch (--single), same grid
#   compute   where compute dominates: xl bf16 context 1024 global batch 8, none and bucketed
#             (COMPUTE_BUCKET_MB, default 25,100; COMPUTE_SHARD, default none, e.g. none,zero1:
#             zero1 reduce-scatters during backward, half an all-reduce's traffic beside it, and
#             all-gathers the bf16 copy after it; COMPUTE_ENGINE, default sm, e.g. sm,copy: the
#             gradients (and zero1's bf16 copy) through the copy engines, the log then counting
#             NCCL's "Init CE" lines), once per NCCL_MAX_CTAS in CTAS (default
#             "default 16 8 4": fewer SMs for NCCL), per --gemm-sm-margin in MARGINS (default 0) and
#             per --grad-dtype in COMPUTE_GRAD_DTYPE (default same, e.g. "same bf16": one run each);
#             each configuration first heats the GPUs for HEAT_S seconds (--heat-s, default 30), so
#             that none, which runs first, is not timed at a cold GPU's higher clocks, nor the others
#             in the swings of the power control after the pause in which each is built;
#             MIN_CTAS=N sets NCCL_MIN_CTAS to N instead of 1 (NCCL then uses exactly N);
#             meanwhile nvidia-smi samples clocks, power and throttle reasons of both GPUs every
#             250 ms into compute-smi.csv (is the step slower with the all-reduce beside it
#             because the GPUs clock down at their power limit?)
#   compiled  PyTorch DDP with torch.compile at global batch 16 (minutes of compilation)
#   compiled-single  the same without DDP, one GPU at the local batch
# GRID_PRECISION (default fp32,bf16) sets the precisions of the ddp, shard, torch and compiled parts.
# EXTRA_ARGS is appended to every llmhpc ddp command and TORCH_ARGS to every PyTorch DDP one
# (not the --single ones),
# e.g. EXTRA_ARGS="--grad-reduce-dtype same,bf16" TORCH_ARGS="--grad-reduce-dtype same,bf16".
# MPIRUN (default mpirun --bind-to none) launches the ranks.
# Files in OUT_DIR: log.txt, <part>*/ (rank files), torch.jsonl, tables.md (analysis/ddp.py).
set -uo pipefail
source "$(dirname "$0")/setup.sh" ddp-check "${1:-}" "${2:-}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PARTS=${PARTS:-tests ddp shard torch}
CTAS=${CTAS:-default 16 8 4}
MARGINS=${MARGINS:-0}  # compute part: --gemm-sm-margin values, each with every CTAS value
SHARD=${SHARD:---ddp flat,bucketed --bucket-mb 25 --shard-optimizer none,broadcast,zero1 --share-weights master,bf16}
read -ra extra_args <<<"${EXTRA_ARGS:-}"
read -ra torch_args <<<"${TORCH_ARGS:-}"
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np 2 -x NCCL_NVLS_ENABLE"
# ctas: -x for each of NCCL_MAX_CTAS and NCCL_MIN_CTAS that is set now (the compute part sets and
# unsets them run by run); mpirun warns at every launch of a variable -x names that is unset.
ctas_x() { ctas=(); local v; for v in NCCL_MAX_CTAS NCCL_MIN_CTAS; do [ -z "${!v+set}" ] || ctas+=(-x "$v"); done; }
exec > >(tee -a "$out/log.txt") 2>&1
grid_precision=${GRID_PRECISION:-fp32,bf16}
grid=(--model xl --context-length 128 --batch-size 4,16 --precision "$grid_precision" --attention flash --warmup 3 --steps 10)
torch_grid=(--model xl --context-length 128 --batch-size 4,16 --precision "$grid_precision" --warmup 3 --steps 10)
ddp() {  # name, llmhpc ddp options...
  local dir=$out/$1  # rank files one folder below OUT_DIR
  shift
  step "llmhpc ddp $(basename "$dir"): $*"
  ctas_x
  check timeout 400 "${mpi[@]}" "${ctas[@]}" "$bin/llmhpc" --mode ddp "$@" "${extra_args[@]}" --out "$dir"
}
torch_ddp() {
  step "PyTorch: $*"
  check timeout 400 torchrun --standalone --nproc_per_node 2 "$root/analysis/torch_ddp.py" "$@" --out "$out/torch.jsonl"
}

step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown), parts: $PARTS"
date -u
nvidia-smi -L
nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
python3 -c 'import torch; print("torch", torch.__version__)'
if has tests; then
  for t in test_comm test_ddp test_shard; do
    step "$t np 2"
    # One OpenMP thread per rank, as ctest runs them: the CPU (mpi) cases are tiny, and every
    # core's threads spinning in each rank made the suite crawl past its time limit.
    ctas_x
    check timeout 300 env OMP_NUM_THREADS=1 "${mpi[@]}" "${ctas[@]}" "$(find_exe $t)" --gtest_brief=1
  done
fi
has ddp && ddp ddp "${grid[@]}" --ddp none,naive,flat,overlap,bucketed --bucket-mb 1,10,25,100,1000
read -ra shard_opts <<<"$SHARD"
has shard && ddp shard "${grid[@]}" "${shard_opts[@]}"
if has torch; then
  torch_ddp "${torch_grid[@]}" --setup eager --bucket-mb 25 \
    --shard-optimizer "${TORCH_SHARD:-none,zero,fsdp2,fsdp2-noreshard}" "${torch_args[@]}"
  torch_ddp "${torch_grid[@]}" --setup eager --single
fi
if has compute; then
  nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 250 >"$out/compute-smi.csv" 2>&1 &
  smi=$!
  mpi_compute=("${mpi[@]}")
  if [[ ${COMPUTE_ENGINE:-sm} == *copy* ]]; then
    # NCCL 2.28 falls back to its kernels silently where a copy-engine collective cannot run;
    # its INIT log says "Init CE" where one did.
    export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE="$out/nccl.%h.%p.log"
    mpi=("${mpi[@]}" -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE)
  fi
  for ctas in $CTAS; do
    if [ "$ctas" = default ]; then unset NCCL_MAX_CTAS NCCL_MIN_CTAS; else export NCCL_MAX_CTAS=$ctas NCCL_MIN_CTAS=${MIN_CTAS:-1}; fi
    for margin in $MARGINS; do
      for grads in ${COMPUTE_GRAD_DTYPE:-same}; do
        ddp "compute-ctas-$ctas-sm$margin$([ "$grads" = same ] || echo "-grads-$grads")" --model xl \
          --context-length 1024 --batch-size 8 --precision bf16 --attention flash --ddp none,bucketed \
          --bucket-mb ${COMPUTE_BUCKET_MB:-25,100} --warmup 3 --steps 10 --shard-optimizer ${COMPUTE_SHARD:-none} \
          --collective-engine ${COMPUTE_ENGINE:-sm} --gemm-sm-margin "$margin" --grad-dtype "$grads" \
          --heat-s "${HEAT_S:-30}"
      done
    done
  done
  unset NCCL_MAX_CTAS NCCL_MIN_CTAS
  if [ -n "${NCCL_DEBUG_FILE:-}" ]; then
    step "copy engines: $(cat "$out"/nccl.*.log 2>/dev/null | grep -c 'Init CE') 'Init CE' line(s) in NCCL's log"
    rm -f "$out"/nccl.*.log
    unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE
  fi
  mpi=("${mpi_compute[@]}")
  kill "$smi" 2>/dev/null
fi
if has compiled; then
  torch_ddp --model xl --context-length 128 --batch-size 16 --precision "$grid_precision" --warmup 3 --steps 10 \
    --setup compiled --bucket-mb 25 "${torch_args[@]}"
fi
if has compiled-single; then
  torch_ddp --model xl --context-length 128 --batch-size 16 --precision "$grid_precision" --warmup 3 --steps 10 \
    --setup compiled --single
fi
step "tables"
torch_opt=()
[ -s "$out/torch.jsonl" ] && torch_opt=(--torch "$out/torch.jsonl")
main_runs=()
for d in ddp shard; do [ -f "$out/$d/rank00000.h5" ] && main_runs+=("$out/$d"); done
if [ ${#main_runs[@]} -gt 0 ]; then
  check python3 "$root/analysis/ddp.py" "${main_runs[@]}" "${torch_opt[@]}" --markdown >"$out/tables.md"
fi
for d in "$out"/compute-*; do  # one table each: the runs differ in NCCL's settings only
  [ -f "$d/rank00000.h5" ] && { echo "## $(basename "$d")"; check python3 "$root/analysis/ddp.py" "$d" --markdown; } \
    >>"$out/tables.md"
done
[ -f "$out/tables.md" ] && cat "$out/tables.md"
step "done; failed: ${#failed[@]}"
printf '  %s\n' "${failed[@]}"
[ ${#failed[@]} -eq 0 ]

#!/usr/bin/env bash
# GPUs of one machine as separate hosts for NCCL (scripts/fake_hosts.sh): its network transport
# between them, what ranks on different nodes use, beside NVLink on the same GPUs, in one run.
# The numbers behind docs/results/scaling.md's "GPUs as separate hosts".
#   scripts/gpu/fake_hosts_check.sh [BIN_DIR [OUT_DIR]]
# NP (default 2) ranks, RANKS_PER_HOST (default 1) of them per fake host. For each path of PATHS
# (default "nvlink hosts": NVLink, then the fake hosts; "hosts" alone where NP ranks share fewer
# GPUs, which NCCL connects only across hosts): COLLECTIVES (default allreduce,reducescatter,
# allgather) in fp32 and bf16 at SIZES (default 1MB,16MB,128MB,1GB), checked and timed by mode
# comm; then mode ddp, by default at the compute-bound point of ddp.md (DDP_SHAPE: xl bf16,
# context 1024, global batch 8, flash attention), under none (each rank alone) and bucketed with
# SHARDINGS (default none,zero1), NCCL's kernels, STEPS (default 10) timed steps after 3. The rank
# files name the transports NCCL connected each run's channels with (nccl_transports). Then
# analysis/report.py's report.md: each ddp run's exposed communication and the collectives'
# device time beside the ring model's from the collectives of its own path (tables (e) and (i)),
# the fake hosts' runs labelled "network transport" by their folders' -net. EXTRA_ARGS go to
# every llmhpc command (e.g. --allow-gpu-sharing where NP ranks share fewer GPUs). MPIRUN (default
# mpirun --bind-to none) launches the ranks.
# Files in OUT_DIR: log.txt, comm/ and ddp/ (NVLink), comm-net/ and ddp-net/ (the fake hosts),
# report.md.
set -uo pipefail
source "$(dirname "$0")/setup.sh" fake-hosts-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
NP=${NP:-2}
SIZES=${SIZES:-1MB,16MB,128MB,1GB}
COLLECTIVES=${COLLECTIVES:-allreduce,reducescatter,allgather}
export RANKS_PER_HOST=${RANKS_PER_HOST:-1}
PATHS=${PATHS:-nvlink hosts}
DDP_SHAPE=${DDP_SHAPE:---model xl --context-length 1024 --batch-size 8 --precision bf16 --attention flash}
SHARDINGS=${SHARDINGS:-none,zero1}
STEPS=${STEPS:-10}
read -ra shape <<<"$DDP_SHAPE"
read -ra extra <<<"${EXTRA_ARGS:-}"
llmhpc=("$bin/llmhpc" --device cuda --backend nccl)  # both paths are NCCL's, never MPI on the CPUs
exec > >(tee -a "$out/log.txt") 2>&1
step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1

for path in $PATHS; do
  read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np $NP -x NCCL_NVLS_ENABLE -x RANKS_PER_HOST"
  wrap=() suffix=""
  [ "$path" = hosts ] && wrap=("$root/scripts/fake_hosts.sh") suffix=-net  # analysis/scaling.py's transport()
  step "$path: $COLLECTIVES, $SIZES"
  check timeout 300 "${mpi[@]}" "${wrap[@]}" "${llmhpc[@]}" --mode comm --collective "$COLLECTIVES" --precision fp32,bf16 \
    --size "$SIZES" --check "${extra[@]}" --out "$out/comm$suffix"
  step "$path: ddp, $DDP_SHAPE, $SHARDINGS"
  check timeout 540 "${mpi[@]}" "${wrap[@]}" "${llmhpc[@]}" --mode ddp "${shape[@]}" --ddp none,bucketed \
    --shard-optimizer "$SHARDINGS" --collective-engine sm --warmup 3 --steps "$STEPS" "${extra[@]}" \
    --out "$out/ddp$suffix"
  step "$path: the transports NCCL connected (the rank files' nccl_transports)"
  PYTHONPATH=$root/analysis python3 -c 'import sys; from llmhpc_h5 import open_run
for d in sys.argv[1:]: print(d, open_run(d).nccl_connections())' "$out/comm$suffix" "$out/ddp$suffix"
done
step "report: measured against predicted communication, both paths"
check python3 "$root/analysis/report.py" "$out"
grep -A12 "^(e) bucket model\|^### (e) bucket model\|^### (i) communication model" "$out/report.md" | head -60

step "done"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi

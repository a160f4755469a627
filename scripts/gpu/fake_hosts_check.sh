#!/usr/bin/env bash
# GPUs of one machine as separate hosts for NCCL (scripts/fake_hosts.sh): its network transport
# between them, what ranks on different nodes use, beside NVLink on the same GPUs, in one run.
# The numbers behind docs/results/scaling.md's "GPUs as separate hosts".
#   scripts/gpu/fake_hosts_check.sh [BIN_DIR [OUT_DIR]]
# NP (default 2) GPUs, RANKS_PER_HOST (default 1) of them per fake host. For each of NVLink and
# the fake hosts: the all-reduce (bf16, SIZES, default 1MB,16MB,128MB,1GB) checked and timed by
# mode comm, then mode ddp at the compute-bound point of ddp.md (xl bf16, context 1024, global
# batch 8, flash attention): none (each rank alone), bucketed and bucketed zero1, NCCL's kernels.
# The rank files name the transports NCCL connected each run's channels with (nccl_transports).
# Then analysis/report.py's report.md: each ddp run's exposed communication beside the ring
# model's from the all-reduce of its own path (tables (e) and (i)), the fake hosts' runs labelled
# "network transport" by their folders' -net.
# Files in OUT_DIR: log.txt, comm/ and ddp/ (NVLink), comm-net/ and ddp-net/ (the fake hosts),
# report.md.
set -uo pipefail
source "$(dirname "$0")/setup.sh" fake-hosts-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
NP=${NP:-2}
SIZES=${SIZES:-1MB,16MB,128MB,1GB}
export RANKS_PER_HOST=${RANKS_PER_HOST:-1}
exec > >(tee -a "$out/log.txt") 2>&1
step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1

for path in nvlink hosts; do
  read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np $NP -x NCCL_NVLS_ENABLE -x RANKS_PER_HOST"
  wrap=() suffix=""
  [ "$path" = hosts ] && wrap=("$root/scripts/fake_hosts.sh") suffix=-net  # analysis/scaling.py's transport()
  step "$path: all-reduce, $SIZES"
  check timeout 300 "${mpi[@]}" "${wrap[@]}" "$bin/llmhpc" --mode comm --collective allreduce --precision fp32,bf16 \
    --size "$SIZES" --check --out "$out/comm$suffix"
  step "$path: ddp, xl bf16 context 1024 batch 8"
  check timeout 540 "${mpi[@]}" "${wrap[@]}" "$bin/llmhpc" --mode ddp --model xl --context-length 1024 --batch-size 8 \
    --precision bf16 --attention flash --ddp none,bucketed --shard-optimizer none,zero1 --collective-engine sm \
    --warmup 3 --steps 10 --out "$out/ddp$suffix"
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

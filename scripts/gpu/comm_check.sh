#!/usr/bin/env bash
# The collectives of llmhpc against nccl-tests on the GPUs of one host: the comparison behind
# docs/results/comm.md. At each rank count each of COLLECTIVES by nccl-tests (its *_perf binary)
# and `llmhpc --mode comm --check` take turns REPS times (1 MB to 1 GB, 5 warm-up + 20 timed
# operations each, as nccl-tests counts them); then test_comm at each rank count, the mpi
# backend on host buffers at the largest, llmhpc's table and its bus bandwidth beside
# nccl-tests' (analysis/comm.py --nccl-tests).
# From the repository root:
#   scripts/gpu/comm_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc and, when the tests were built, tests/test_comm (or
# test_comm); OUT_DIR defaults to results/comm-check-<time> (git-ignored). nccl-tests is not
# part of llmhpc: NCCL_TESTS, the folder of its binaries (github.com/NVIDIA/nccl-tests, built
# with MPI=1; or the path of all_reduce_perf, as before), adds it; without it only llmhpc runs.
# Environment: RANKS (default 2 and the GPU count), REPS (3), SIZES (1MB,10MB,100MB,1000MB),
# COLLECTIVES (allreduce; any of allreduce,reducescatter,allgather,broadcast), MPIRUN (mpirun
# --bind-to none).
# Files in OUT_DIR: log.txt (everything printed), nccl-tests/ (its output, one file per binary,
# rank count and repetition), runs/ (the rank files), comm.md (llmhpc's table and, with
# NCCL_TESTS, the comparison).
set -uo pipefail
source "$(dirname "$0")/setup.sh" comm-check "${1:-}" "${2:-}"
mkdir -p "$out/runs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
RANKS=${RANKS:-$([ "$gpus" -gt 2 ] && echo "2,$gpus" || echo 2)}
REPS=${REPS:-3}
SIZES=${SIZES:-1MB,10MB,100MB,1000MB}
COLLECTIVES=${COLLECTIVES:-allreduce}
declare -A perf=([allreduce]=all_reduce_perf [reducescatter]=reduce_scatter_perf [allgather]=all_gather_perf
  [broadcast]=broadcast_perf)
tests_dir=${NCCL_TESTS:-}
[ -f "$tests_dir" ] && tests_dir=$(dirname "$tests_dir")  # the path of all_reduce_perf: its folder
for c in ${COLLECTIVES//,/ }; do
  [ -n "${perf[$c]:-}" ] || { echo "comm_check.sh: COLLECTIVES: '$c' is none of allreduce, reducescatter, allgather, broadcast" >&2; exit 2; }
  [ -z "$tests_dir" ] || [ -x "$tests_dir/${perf[$c]}" ] ||
    { echo "comm_check.sh: NCCL_TESTS=$NCCL_TESTS has no ${perf[$c]} for $c (build it: make MPI=1 in nccl-tests)" >&2; exit 2; }
done
mkdir -p "$out/nccl-tests"
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -x NCCL_NVLS_ENABLE"
exec > >(tee -a "$out/log.txt") 2>&1

step "host: $(hostname), $gpus GPU(s), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
date -u; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1
runs=()
for np in ${RANKS//,/ }; do
  for rep in $(seq "$REPS"); do
    for c in ${COLLECTIVES//,/ }; do
      [ -n "$tests_dir" ] || break
      step "nccl-tests ${perf[$c]} np $np rep $rep"
      timeout 120 "${mpi[@]}" -np "$np" "$tests_dir/${perf[$c]}" -b 1000000 -e 1000000000 -f 10 -g 1 -c 0 -w 5 -n 20 \
        >"$out/nccl-tests/${perf[$c]}-np$np-r$rep.txt"
      grep -v "^#  Rank" "$out/nccl-tests/${perf[$c]}-np$np-r$rep.txt"
    done
    step "llmhpc nccl np $np rep $rep"
    dir=$out/runs/nccl-np$np-r$rep
    timeout 300 "${mpi[@]}" -np "$np" "$bin/llmhpc" --mode comm --device cuda --backend nccl --collective "$COLLECTIVES" \
      --size "$SIZES" --check --out "$dir" | grep -v "^\["
    [ -f "$dir/rank00000.h5" ] && runs+=("$dir")
  done
done
test_comm=$(find_exe test_comm)
if [ -x "$test_comm" ]; then
  for np in ${RANKS//,/ }; do
    step "test_comm np $np"
    timeout 120 "${mpi[@]}" -np "$np" "$test_comm" --gtest_brief=1 2>&1 | tail -4
  done
fi
np=${RANKS##*,}
step "llmhpc mpi np $np (host buffers)"
dir=$out/runs/mpi-np$np
timeout 300 "${mpi[@]}" -np "$np" "$bin/llmhpc" --mode comm --device cpu --backend mpi --size "$SIZES" --warmup 2 --steps 5 \
  --check --out "$dir" | grep -v "^\["
[ -f "$dir/rank00000.h5" ] && runs+=("$dir")
step "table"
if [ ${#runs[@]} -gt 0 ]; then
  theirs=()
  for f in "$out"/nccl-tests/*.txt; do [ -s "$f" ] && theirs+=(--nccl-tests "$f"); done
  python3 "$root/analysis/comm.py" "${runs[@]}" "${theirs[@]}" >"$out/comm.md" && cat "$out/comm.md"
fi
step "done; files in $out"

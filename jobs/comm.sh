#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-comm
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00
# The reference communication study, single node: all-reduce of 1MB..1000MB with nccl (GPU
# buffers) and mpi (host buffers, the CPU baseline) at each rank count, then one markdown
# table of all runs (analysis/comm.py).
#   sbatch jobs/comm.sh                     or   NP=4 bash jobs/comm.sh     (RANKS: 2,4,...,NP)
#   BACKENDS=nccl COLLECTIVES=all SIZES=1MB,1GB CHECK=1 bash jobs/comm.sh
# Variables (defaults): RANKS (2,4,...,NP), BACKENDS (nccl,mpi; mpi with DEVICE=cpu or where
# nvidia-smi lists no GPU), COLLECTIVES (allreduce), SIZES
# (1MB,10MB,100MB,1000MB), PRECISIONS (fp32: llmhpc --precision, fp32 and/or bf16), WARMUP (5),
# ITERS (20: llmhpc --steps), CHECK (0). DTYPE, PRECISIONS' older name, is still read, its float
# meaning fp32.
# mpi moves 1000MB in about a second, so it runs fewer iterations (MPI_WARMUP 2, MPI_ITERS 5).
# Each rank count is a launch of its own, $MPIRUN $MPIRUN_ARGS $NP_OPTION N (LAUNCH, with its fixed count, does not
# apply; MPIRUN="srun --mpi=pmix" launches with srun -n N).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
RANKS=${RANKS:-$(rank_counts | sed 's/^1,//')}  # 2, 4, ... up to the job's tasks
# nccl needs GPUs: a CPU host measures the mpi baseline alone unless BACKENDS asks otherwise.
if [ -z "${BACKENDS:-}" ]; then
  if [ "$on_cpu" = 0 ]; then BACKENDS=nccl,mpi; else  # on_cpu: jobs/env.sh's one look for a GPU
    BACKENDS=mpi
    echo "$0: no GPU here (DEVICE=$DEVICE): BACKENDS=mpi, the host baseline alone"
  fi
fi
COLLECTIVES=${COLLECTIVES:-allreduce}
SIZES=${SIZES:-1MB,10MB,100MB,1000MB}
PRECISIONS=${PRECISIONS:-${DTYPE:-fp32}}
precision=""  # DTYPE=float (mode comm's --dtype float of old) is fp32
for p in ${PRECISIONS//,/ }; do [ "$p" = float ] && p=fp32; precision+=${precision:+,}$p; done
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-20}
MPI_WARMUP=${MPI_WARMUP:-2}
MPI_ITERS=${MPI_ITERS:-5}
CHECK=${CHECK:-0}
require_flag CHECK
require_numbers RANKS 1
for backend in ${BACKENDS//,/ }; do
  [[ "$backend" =~ ^(nccl|mpi)$ ]] || { echo "$0: BACKENDS must list nccl and/or mpi, not '$BACKENDS'" >&2; exit 2; }
done

runs=()
for backend in ${BACKENDS//,/ }; do
  for np in ${RANKS//,/ }; do
    dir=$OUT/$backend-np$np
    # The mpi baseline runs on host buffers: no GPU per rank needed.
    if [ "$backend" = mpi ]; then device=cpu warmup=$MPI_WARMUP iters=$MPI_ITERS; else device=$DEVICE warmup=$WARMUP iters=$ITERS; fi
    $MPIRUN $MPIRUN_ARGS $NP_OPTION "$np" "$LLMHPC_BIN" --mode comm --device "$device" --backend "$backend" --collective "$COLLECTIVES" --size "$SIZES" \
      --precision "$precision" --warmup "$warmup" --steps "$iters" $([ "$CHECK" = 1 ] && echo --check) --out "$dir" \
      ${EXTRA_ARGS:-}
    runs+=("$dir")
  done
done
$PYTHON "$LLMHPC_ROOT/analysis/comm.py" "${runs[@]}" | tee "$OUT/comm.md"
job_report  # $OUT/report.md: the reference communication study's table and comm_busbw.png (bandwidth vs size per rank count)

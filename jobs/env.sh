# Shared settings for the job scripts in jobs/. Every value can be overridden from the
# environment (LLMHPC_BIN=/path/llmhpc sbatch jobs/bench.sh).
LLMHPC_ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
LLMHPC_BIN=${LLMHPC_BIN:-$LLMHPC_ROOT/build/llmhpc}
OUT_ROOT=${OUT_ROOT:-$LLMHPC_ROOT/results}
PYTHON=${PYTHON:-python3}
# srun under Slurm, mpirun elsewhere.
if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=${LAUNCH:-srun}; else LAUNCH=${LAUNCH:-mpirun -np ${NP:-1}}; fi
# Never let NCCL use NVLink multicast (NVLS); it can take a shared host's GPUs down.
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
stamp() { date +%Y%m%d-%H%M%S; }

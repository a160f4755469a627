#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-ddp-naive
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00
# The reference DDP study's naive_ddp_benchmarking: jobs/ddp_bucketed.sh with STRATEGIES=none,naive
# (the compute-only baseline none and what naive is compared with), no all-reduce run (COMM=0).
# Every variable of ddp_bucketed.sh applies (NP, MODELS, SHAPE, CONTEXTS, BATCH, PRECISIONS, ...).
#   sbatch jobs/ddp_naive.sh          or   NP=2 bash jobs/ddp_naive.sh
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
export STRATEGIES=${STRATEGIES:-none,naive} COMM=${COMM:-0}
source "$r/jobs/ddp_bucketed.sh"

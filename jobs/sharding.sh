#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-sharding
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00
# The reference DDP study's optimizer_state_sharding: jobs/ddp_bucketed.sh with the bucketed
# strategy (BUCKETS, default 25 MiB) under --shard-optimizer none, broadcast (the reference
# study's scheme) and zero1 (SHARDING); $OUT/report.md has table (f): step, exposed
# communication and each rank's memory after init, before and after the optimizer, its
# optimizer state and peak.
#   sbatch jobs/sharding.sh        or   NP=2 MODELS=large bash jobs/sharding.sh
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
export STRATEGIES=${STRATEGIES:-bucketed} BUCKETS=${BUCKETS:-25} SHARDING=${SHARDING:-none,broadcast,zero1} COMM=${COMM:-0}
source "$r/jobs/ddp_bucketed.sh"

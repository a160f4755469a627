#!/usr/bin/env bash
# Runs one rank of an MPI job as if its GPU sat on a host of its own, for NCCL only: NCCL_HOSTID
# names the host ("fake<k>", k = the rank's index on its node / RANKS_PER_HOST), so NCCL connects
# the fake hosts with its network transport (sockets, or InfiniBand where the machine has it), as
# it connects nodes, instead of NVLink or shared memory; ranks of one fake host keep those. MPI,
# and so llmhpc's node attributes and its copy-engine default, still see one node: give
# --collective-engine sm. On 2 GPUs this exercises the inter-node path of NCCL on one machine.
#   mpirun -np 2 scripts/fake_hosts.sh llmhpc --mode comm --collective allreduce
#   RANKS_PER_HOST=2 mpirun -np 4 scripts/fake_hosts.sh llmhpc --mode ddp ... --collective-engine sm
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
[ $# -gt 0 ] || { echo "usage: mpirun -np N $0 COMMAND [ARGS...] (--help for more)" >&2; exit 2; }
per_host=${RANKS_PER_HOST:-1}
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "$0: RANKS_PER_HOST must be a whole number >= 1, not '$per_host'" >&2; exit 2; }
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-}}}
[ -n "$local_rank" ] || { echo "$0: run it under mpirun or srun (no local rank in the environment)" >&2; exit 2; }
export NCCL_HOSTID="fake$((local_rank / per_host))"
exec "$@"

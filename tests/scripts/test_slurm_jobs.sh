#!/usr/bin/env bash
# The job scripts under a real Slurm, as a user submits them: a single-node cluster of this
# host started here (munged, slurmctld, slurmd, no systemd, no accounting, everything in a
# temporary folder, ports of its own so it disturbs no other Slurm), then
#   sbatch --wait jobs/ddp_bucketed.sh     and     sbatch --wait jobs/comm.sh
# with 2 tasks on the CPU backend and a tiny model, each checked by sbatch's exit code (the
# job's) and the files it leaves: both rank files, the all-reduce run, ddp.md, report.md and
# its PNG in results/<job name>-<job id>; scaling.sh over 1 and 2 ranks, unsharded and ZeRO-3;
# and ddp_bucketed.sh again with EXTRA_ARGS overriding
# the job's --warmup and --steps, its rank files recording EXTRA_ARGS' values. Then jobs/train.sh stopped mid-run by SIGUSR1 as
# Slurm sends it before a time limit (scancel --signal=USR1 --batch): its checkpoint and rank
# files at one step, its report saying so. Then the same ddp job, and comm.sh, launched by srun --mpi=pmix
# where Slurm has PMIx. Every daemon is stopped by its pid and the folder removed, also on
# failure. Needs root (daemons, and apt-get to install slurm-wlm and munge when missing):
# otherwise skipped (exit 77) with the reason.
set -euo pipefail
: "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}"
LLMHPC_BIN=$(realpath -m "$LLMHPC_BIN")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
export PYTHON=${LLMHPC_PYTHON:-python3}
skip() { echo "SKIP: Slurm tests skipped: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "they start munged, slurmctld and slurmd, which needs root"
"$PYTHON" -c "import h5py, pandas, matplotlib" 2>/dev/null || skip "$PYTHON has no h5py, pandas or matplotlib (make deps)"
# slurm_install, slurm_conf, munge_up (sourced, the script runs nothing).
# shellcheck source=SCRIPTDIR/slurm_cluster.sh
source "$ROOT/tests/scripts/slurm_cluster.sh"
slurm_install || skip "$SLURM_MISSING"

tmp=$(mktemp -d /tmp/llmhpc-slurm.XXXXXX)
chmod 755 "$tmp"  # munged wants every folder above its socket searchable by all
pids=()
cleanup() {
  set +e
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ]; then
    scancel --quiet --full "--user=$(id -un)" 2>/dev/null  # jobs of this cluster only (its own config)
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for log in "$tmp"/*.log; do echo "--- $log"; tail -n 20 "$log"; done; exit 1; }

# ---- the cluster: this host, its cores and memory, one partition ----
node=$(hostname -s)
ports=$("$PYTHON" -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
read -r ctld_port d_port <<<"$ports"
hw=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')  # CPUs=2 Boards=1 ... RealMemory=N
mkdir -p "$tmp/spool-$node"
{
  slurm_conf "$tmp" llmhpctest "$node(127.0.0.1)"
  echo "SlurmctldPort=$ctld_port"
  echo "SlurmdPort=$d_port"
  echo "NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN"
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP"
} >"$tmp/slurm.conf"
export SLURM_CONF=$tmp/slurm.conf
munge_up "$tmp" || fail "munged did not start"
slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >>"$tmp/slurmd-$node.log" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "the node is '$state', not idle, after 30 s"
echo "ok   a Slurm of one node ($node: $hw), ports $ctld_port/$d_port"

# ---- the jobs, as a user submits them: from the repository, 2 tasks, no GPUs ----
export LLMHPC_BIN DEVICE=cpu OMP_NUM_THREADS=1 OUT_ROOT=$tmp/results
export SHAPE="--d-model 32 --d-ff 64 --num-layers 2 --num-heads 4 --vocab-size 64"
export CONTEXTS=16 WARMUP=1 STEPS=2 BUCKETS=0.0001,1000 COMM_SIZES=4KB,64KB
export BACKENDS=mpi SIZES=4KB,64KB ITERS=3 MPI_ITERS=3
unset NP LLMHPC_ROOT RANKS  # as a user's shell has them: the job takes its tasks from Slurm
submit() {  # submit NAME SCRIPT [sbatch options]: sbatch --wait from the repository; prints the job id
  local name=$1 script=$2
  shift 2
  (cd "$ROOT" && timeout 150 sbatch --wait --parsable --ntasks-per-node=2 --gpus-per-task=0 --time=5 \
     --output="$tmp/$name-%j.log" "$@" "$script") >"$tmp/$name.id" 2>"$tmp/$name.sbatch.log"
}
check_ddp() {  # check_ddp DIR: what a finished ddp_bucketed job leaves
  local dir=$1
  [ -f "$dir/rank00000.h5" ] && [ -f "$dir/rank00001.h5" ] || fail "$dir lacks the 2 rank files: $(ls "$dir" 2>&1)"
  [ -f "$dir/allreduce/rank00001.h5" ] || fail "$dir lacks the 2-rank all-reduce run"
  grep -q "^| bucketed |" "$dir/ddp.md" || fail "$dir/ddp.md has no bucketed row"
  grep -q "^## ddp" "$dir/report.md" && grep -q "^## comm" "$dir/report.md" || fail "$dir/report.md lacks a section"
  [ -s "$dir/ddp_breakdown.png" ] || fail "$dir has no ddp_breakdown.png"
  python3 -c 'import h5py, sys
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/rank{r:05d}.h5") as f:
        assert f.attrs["status"] == "complete" and f.attrs["world_size"] == 2, dict(f.attrs)' "$dir" ||
    fail "$dir: rank files not complete or not of 2 ranks"
}

submit ddp jobs/ddp_bucketed.sh || fail "sbatch --wait jobs/ddp_bucketed.sh: exit $? ($(cat "$tmp/ddp.sbatch.log"))"
id=$(cut -d';' -f1 "$tmp/ddp.id")
check_ddp "$tmp/results/llmhpc-ddp-bucketed-$id"
grep -q "llmhpc-ddp-bucketed: 2 rank(s)" "$tmp"/ddp-"$id".log || fail "the job did not run 2 ranks (SLURM_NTASKS)"
echo "ok   sbatch --wait jobs/ddp_bucketed.sh -> results/llmhpc-ddp-bucketed-$id"

# EXTRA_ARGS override the job's own values under sbatch too: the job passes --warmup 3 --steps 5,
# EXTRA_ARGS (in the job's environment) --warmup 1 --steps 2, which every configuration records.
submit extra jobs/ddp_bucketed.sh --export="ALL,WARMUP=3,STEPS=5,COMM=0,EXTRA_ARGS=--warmup 1 --steps 2" ||
  fail "EXTRA_ARGS='--warmup 1 --steps 2' sbatch --wait jobs/ddp_bucketed.sh: exit $? ($(cat "$tmp/extra.sbatch.log"))"
id=$(cut -d';' -f1 "$tmp/extra.id")
python3 -c 'import h5py, sys
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/rank{r:05d}.h5") as f:
        recs = list(f["ddp"].values())
        assert recs and f.attrs["status"] == "complete" and f.attrs["world_size"] == 2, dict(f.attrs)
        for g in recs:
            assert g.attrs["steps"] == 2 and len(g["step_ms"]) == 2 and g.attrs["warmup"] == 1, (r, g.name, dict(g.attrs))' \
  "$tmp/results/llmhpc-ddp-bucketed-$id" || fail "EXTRA_ARGS did not override the job's --warmup 3 --steps 5 under sbatch"
echo "ok   sbatch --wait jobs/ddp_bucketed.sh with EXTRA_ARGS='--warmup 1 --steps 2' over STEPS=5: 2 steps recorded"

submit comm jobs/comm.sh || fail "sbatch --wait jobs/comm.sh: exit $? ($(cat "$tmp/comm.sbatch.log"))"
id=$(cut -d';' -f1 "$tmp/comm.id")
dir=$tmp/results/llmhpc-comm-$id
[ -f "$dir/mpi-np2/rank00000.h5" ] && [ -f "$dir/mpi-np2/rank00001.h5" ] || fail "$dir lacks mpi-np2's 2 rank files"
grep -q "^| mpi | 2 | allreduce | 4000 |" "$dir/comm.md" || fail "$dir/comm.md has no 2-rank 4KB row"
grep -q "^| mpi | cpu | 2 | allreduce |" "$dir/report.md" || fail "$dir/report.md lacks the reference communication study's table"
[ -s "$dir/comm_busbw.png" ] || fail "$dir has no comm_busbw.png"
echo "ok   sbatch --wait jobs/comm.sh -> results/llmhpc-comm-$id"

# scaling.sh over 1 and 2 of the job's ranks, unsharded and ZeRO-3, and tensor parallelism where
# it divides the ranks (TP=1,2: tp 2 at 2 ranks): a scaling table per stage with tokens/s per rank
# and MFU in its report.
SHARDINGS=none,zero3 TP=1,2 submit scaling jobs/scaling.sh ||
  fail "sbatch --wait jobs/scaling.sh: exit $? ($(cat "$tmp/scaling.sbatch.log"))"
id=$(cut -d';' -f1 "$tmp/scaling.id")
dir=$tmp/results/llmhpc-scaling-$id
[ -f "$dir/strong-np2/rank00001.h5" ] && [ -f "$dir/weak-np1/rank00000.h5" ] || fail "$dir lacks its runs: $(ls "$dir" 2>&1)"
grep -q "^### Scaling, strong: .*, zero3$" "$dir/report.md" && grep -q "| Tokens/s per rank | MFU |" "$dir/report.md" ||
  fail "$dir/report.md lacks the zero3 scaling table with tokens/s and MFU"
"$PYTHON" -c 'import h5py, sys
with h5py.File(sys.argv[1] + "/strong-np2/rank00001.h5", "r") as f:
    tp = sorted(int(g.attrs["tp"]) for g in f["ddp"].values())
with h5py.File(sys.argv[1] + "/strong-np1/rank00000.h5", "r") as f:
    one = sorted(int(g.attrs["tp"]) for g in f["ddp"].values())
assert set(tp) == {1, 2} and set(one) == {1}, (tp, one)' "$dir" || fail "scaling.sh TP=1,2: not tp 1 and 2 at 2 ranks, tp 1 at 1"
echo "ok   sbatch --wait jobs/scaling.sh (SHARDINGS=none,zero3 TP=1,2) -> results/llmhpc-scaling-$id"

# ---- a long training stopped as Slurm stops one at its time limit (--signal=B:USR1@...) ----
"$PYTHON" -c "import numpy as np; np.random.default_rng(0).integers(0, 64, 20000, dtype=np.uint16).tofile('$tmp/tokens.bin')"
(cd "$ROOT" && timeout 30 sbatch --parsable --ntasks-per-node=2 --gpus-per-task=0 --time=5 --signal=B:USR1@10 \
   --output="$tmp/train-%j.log" \
   --export="ALL,DATA=$tmp/tokens.bin,STEPS=1000000,MODEL=tiny,EXTRA_ARGS=--vocab-size 64 --log-every 1" \
   jobs/train.sh) >"$tmp/train.id" 2>"$tmp/train.sbatch.log" || fail "sbatch jobs/train.sh: $(cat "$tmp/train.sbatch.log")"
id=$(cut -d';' -f1 "$tmp/train.id")
for _ in $(seq 120); do grep -q "^step" "$tmp/train-$id.log" 2>/dev/null && break; sleep 0.5; done
grep -q "^step" "$tmp/train-$id.log" || fail "the training job did not start stepping within 60 s"
scancel --signal=USR1 --batch "$id"  # what --signal=B:USR1@SECONDS does before the time limit
for _ in $(seq 120); do [ -z "$(squeue -h -j "$id" 2>/dev/null)" ] && break; sleep 0.5; done
[ -z "$(squeue -h -j "$id" 2>/dev/null)" ] || fail "the training job did not end within 60 s of SIGUSR1"
dir=$tmp/results/llmhpc-train-$id
grep -q "train: stopped by SIGUSR1 after step" "$tmp/train-$id.log" || fail "the job's log does not say where it stopped"
[ -s "$dir/model.h5" ] && grep -q "INTERRUPTED: SIGUSR1 after step" "$dir/report.md" ||
  fail "$dir lacks model.h5, or its report does not say it was interrupted: $(ls "$dir" 2>&1)"
"$PYTHON" -c 'import h5py, sys
steps = []
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/rank{r:05d}.h5") as f:
        assert f.attrs["status"].startswith("interrupted: SIGUSR1"), dict(f.attrs)
        steps.append(len(f["train/loss"]))
with h5py.File(f"{sys.argv[1]}/model.h5") as f:
    assert steps[0] == steps[1] == int(f["optimizer/step"][()]), (steps, f["optimizer/step"][()])' "$dir" ||
  fail "$dir: the ranks did not stop at the checkpoint's step"
code=$(scontrol show job "$id" 2>/dev/null | grep -o " ExitCode=[0-9:]*" | cut -d= -f2)
[ -z "$code" ] || [ "$code" = "138:0" ] || fail "the stopped job's exit code is $code, not 138:0 (128 + SIGUSR1)"
echo "ok   sbatch jobs/train.sh, stopped by SIGUSR1: every rank at the same step, model.h5 written, exit ${code:-(gone)}"

# ---- a failing job fails sbatch --wait: a binary that is not there ----
set +e
(cd "$ROOT" && LLMHPC_BIN=$tmp/missing timeout 60 sbatch --wait --ntasks-per-node=2 --gpus-per-task=0 \
   --output="$tmp/missing-%j.log" jobs/comm.sh) >/dev/null 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || fail "a job without its binary: sbatch --wait exited 0"
grep -q "no llmhpc binary" "$tmp"/missing-*.log || fail "the failed job's log does not say why"
echo "ok   a job without its binary: sbatch --wait exit $rc, the log says why"

# ---- srun as the launcher, where Slurm has PMIx ----
if srun --mpi=list 2>&1 | grep -q pmix; then
  submit srun jobs/ddp_bucketed.sh --export="ALL,LAUNCH=srun --mpi=pmix,COMM=0" ||
    fail "LAUNCH='srun --mpi=pmix' sbatch --wait jobs/ddp_bucketed.sh: exit $?"
  id=$(cut -d';' -f1 "$tmp/srun.id")
  dir=$tmp/results/llmhpc-ddp-bucketed-$id
  [ -f "$dir/rank00001.h5" ] && grep -q "^| bucketed |" "$dir/ddp.md" || fail "the srun-launched job left no 2-rank run"
  echo "ok   LAUNCH='srun --mpi=pmix': the same job, srun starting the ranks"
  # comm.sh launches each rank count itself: with MPIRUN=srun, as srun -n N.
  submit srun_comm jobs/comm.sh --export="ALL,MPIRUN=srun --mpi=pmix" ||
    fail "MPIRUN='srun --mpi=pmix' sbatch --wait jobs/comm.sh: exit $? ($(cat "$tmp/srun_comm.sbatch.log"))"
  id=$(cut -d';' -f1 "$tmp/srun_comm.id")
  [ -f "$tmp/results/llmhpc-comm-$id/mpi-np2/rank00001.h5" ] || fail "the srun-launched comm job left no 2-rank run"
  echo "ok   MPIRUN='srun --mpi=pmix': comm.sh, srun -n 2 starting the ranks"
else
  echo "note srun --mpi=list has no pmix here: srun cannot start MPI ranks, mpirun (the default) does"
fi
echo "PASS"

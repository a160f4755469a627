#!/usr/bin/env bash
# Reliability on the GPUs of one host (2 ranks, nccl): the numbers behind
# docs/results/reliability.md. About 8 minutes:
#   1. faults: a stall injected into an NCCL collective (comm, then ddp), and a rank stopped by
#      SIGSTOP in the comm benchmark (a process that never answers), must end the job within
#      --comm-timeout + 30 s with exit code 4 and the watchdog's report, which names the stalled
#      rank as not having reached the stuck collective and the stopped one as not answering; a rank
#      killed mid-benchmark must end the job; a rank that issues a host barrier where the other
#      issues an NCCL collective is named as having issued it differently; every rank file stays
#      readable (finished configurations ok; the one being measured reads "aborted by the
#      watchdog" where that rank's watchdog fired, else interrupted).
#   2. the watchdog's cost: comm busbw with the watchdog (--comm-timeout 600) and without it
#      (--comm-timeout 0: blocking communicator, no thread, no events), alternating REPS times.
#   3. soak: a comm run (all-reduce at SOAK_SIZES, SOAK_COMM_S seconds each) and a ddp run
#      (SOAK_MODEL bf16, bucketed 25 MiB, SOAK_DDP_S seconds), timed by --duration-s; per
#      iteration times checked for drift and memory (device allocator, driver, host RSS, sampled
#      by llmhpc between iterations) for growth by analysis/soak.py: about 4 minutes.
#   4. stragglers: a rank 10% slower (a host delay before each collective) named by
#      analysis/stragglers.py over NCCL, rank 1 and then rank 0; and the verdict with no fault.
# From the repository root:
#   scripts/gpu/reliability_check.sh [BIN_DIR [OUT_DIR]]
#   PARTS=soak scripts/gpu/reliability_check.sh build results/soak     # the soak alone
# BIN_DIR (default build) holds llmhpc. Environment: PARTS (default "faults cost soak stragglers"),
# STALL_TIMEOUT (15 s), REPS (3), SIZES (1MB,16MB,256MB,1GB), SOAK_SIZES (1MB,256MB),
# SOAK_COMM_S (45, per size), SOAK_MODEL (xl), SOAK_DDP_S (90), MPIRUN.
# Files in OUT_DIR: log.txt (everything), runs/ (rank files), faults.txt, cost.txt, stragglers.txt, soak.md
# (analysis/soak.py's table, also printed), soak.jsonl (its rows). Exits non-zero if any check
# failed (speed is reported, not judged).
set -uo pipefail
source "$(dirname "$0")/setup.sh" reliability-check "${1:-}" "${2:-}"
mkdir -p "$out/runs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
STALL_TIMEOUT=${STALL_TIMEOUT:-15}
REPS=${REPS:-3}
SIZES=${SIZES:-1MB,16MB,256MB,1GB}
PARTS=${PARTS:-faults cost soak stragglers}
SOAK_SIZES=${SOAK_SIZES:-1MB,256MB}
SOAK_COMM_S=${SOAK_COMM_S:-45}
SOAK_MODEL=${SOAK_MODEL:-xl}
SOAK_DDP_S=${SOAK_DDP_S:-90}
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np 2 -x NCCL_NVLS_ENABLE -x LLMHPC_FAULT"
llmhpc=("$bin/llmhpc" --device cuda --backend nccl)  # every check is of NCCL's, never MPI on the CPUs
exec > >(tee -a "$out/log.txt") 2>&1
failures=0
fail() { echo "FAIL: $*" | tee -a "$out/faults.txt"; failures=$((failures + 1)); }
export PYTHONPATH=$root/analysis${PYTHONPATH:+:$PYTHONPATH}

step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown), parts: $PARTS"
nvidia-smi -L 2>&1; nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1

# ---- 1. faults ----
source "$root/scripts/fault_leftovers.sh"
# fault NAME LLMHPC_FAULT "words" args...: the job must end non-zero within the bound.
fault() {
  local name=$1 spec=$2 words=$3; shift 3
  step "fault $name: LLMHPC_FAULT=$spec"
  local start=$SECONDS
  LLMHPC_FAULT=$spec LLMHPC_FAULT_RUN=$$-$name timeout $((STALL_TIMEOUT + 120)) "${mpi[@]}" "${llmhpc[@]}" "$@" \
    --out "$out/runs/$name" >"$out/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  last_rc=$rc
  leftovers "$$-$name"
  grep -v "^\[" "$out/$name.log" | tail -12
  echo "$name: rc $rc after ${took}s" | tee -a "$out/faults.txt"
  if [ $rc -eq 0 ]; then fail "$name: exit code 0";
  elif [ $rc -eq 124 ]; then fail "$name: hung (killed after ${took}s)";
  elif [ $took -gt $((STALL_TIMEOUT + 30 + 15)) ]; then fail "$name: ${took}s > timeout + 30 s (+15 s start-up)";
  elif ! grep -q -- "$words" "$out/$name.log"; then fail "$name: the output lacks '$words'"; fi
  python3 - "$out/runs/$name" <<'EOF' || fail "$name: the rank files are not readable as they should be"
import sys
from llmhpc_h5 import open_run
run = open_run(sys.argv[1])
statuses = {}
for r in run.records(None, rank=None):
    statuses[r.status] = statuses.get(r.status, 0) + 1
    if r.ok:
        for name in r.arrays:
            r.arrays[name]  # every array of a finished record reads
print(f"{sys.argv[1]}: ranks {run.ranks}, records by status {statuses}")
# the record being measured reads "aborted by the watchdog" where that rank's watchdog fired (the
# report is in the file's own status), else interrupted
assert set(statuses) <= {"ok", "interrupted", "aborted by the watchdog"} and statuses.get("ok"), statuses
EOF
}
COMM=(--mode comm --size 1MB,16MB,64MB --steps 200 --warmup 5 --comm-timeout "$STALL_TIMEOUT")
DDP=(--mode ddp --model small --context-length 128 --batch-size 8 --ddp bucketed,overlap --warmup 2 --steps 20
  --comm-timeout "$STALL_TIMEOUT")
if has faults; then
  fault nccl_comm_stall "rank=1,config=3,step=50,action=stall" "not reached: rank 1 on $(hostname) (last issued #" "${COMM[@]}"
  [ "$last_rc" -eq 4 ] || fail "nccl_comm_stall: exit code $last_rc, not the watchdog's 4"
  fault nccl_ddp_stall "rank=0,config=2,step=10,action=stall" "not reached: rank 0 on $(hostname) (last issued #" "${DDP[@]}"
  [ "$last_rc" -eq 4 ] || fail "nccl_ddp_stall: exit code $last_rc, not the watchdog's 4"
  fault nccl_comm_kill "rank=1,config=3,step=50,action=signal:9" "rank 1" "${COMM[@]}"
  # SIGSTOP (19) before a 64 MB NCCL all-reduce: config 5 (64MB out of place) begins near
  # collective #1657 (a host barrier; 411 collectives a configuration: 3 barriers, 5 warm-up, 200
  # timed, 200 back to back), so #1700 is one of its timed all-reduces (a step= condition would
  # meet that first barrier, which still carries the last configuration's step). Rank 0's
  # watchdog reports at --comm-timeout, waits Watchdog::kAskS for rank 1's answer (none), then
  # MPI_Abort ends the job, the stopped rank too; no crash on the way (exit code 4, not 134).
  fault nccl_comm_sigstop "rank=1,config=5,op=1700,action=signal:19" "no answer: rank 1" "${COMM[@]}"
  [ "$last_rc" -eq 4 ] || fail "nccl_comm_sigstop: exit code $last_rc, not the watchdog's 4"
  grep -q "tcache\|core dumped" "$out/nccl_comm_sigstop.log" && fail "nccl_comm_sigstop: a rank crashed while aborting"
  grep -q "rank 1 raises signal 19 before collective #[0-9]* allreduce (nccl, 64000000 bytes)" \
    "$out/nccl_comm_sigstop.log" || fail "nccl_comm_sigstop: rank 1 did not stop before a 64 MB NCCL all-reduce"
  # Calls that no longer match: rank 1 issues a host barrier where rank 0 issues an NCCL
  # collective; rank 0's watchdog names rank 1's call beside its own. The faults above, where
  # the ranks' calls do match, must not say so.
  fault nccl_ddp_diverge "rank=1,config=2,step=10,action=diverge" \
    "issued differently: rank 1 on $(hostname) issued #[0-9]* as barrier (mpi (host), 0 bytes), this rank as" "${DDP[@]}"
  [ "$last_rc" -eq 4 ] || fail "nccl_ddp_diverge: exit code $last_rc, not the watchdog's 4"
  for name in nccl_comm_stall nccl_ddp_stall nccl_comm_sigstop; do
    grep -q "issued differently" "$out/$name.log" && fail "$name: matching calls reported as issued differently"
  done
fi

# ---- 2. the watchdog's cost ----
if has cost; then
  step "watchdog cost: comm $SIZES, with (--comm-timeout 600) and without (0), $REPS rounds"
  cost_runs=()
  for rep in $(seq "$REPS"); do
    for timeout_s in 600 0; do
      dir=$out/runs/cost-t$timeout_s-r$rep
      timeout 300 "${mpi[@]}" "${llmhpc[@]}" --mode comm --size "$SIZES" --comm-timeout "$timeout_s" --out "$dir" |
        grep "^allreduce\|^#"
      [ -f "$dir/rank00000.h5" ] && cost_runs+=("$dir") || fail "cost run $dir failed"
    done
  done
  python3 - "${cost_runs[@]}" <<'EOF' | tee "$out/cost.txt"
import statistics, sys
from llmhpc_h5 import open_run
rows = {}  # (bytes, placement, watchdog) -> [busbw of each run, from the back-to-back time]
for d in sys.argv[1:]:
    run = open_run(d)
    on = float(run.config["comm-timeout"]) > 0
    for r in run.records("comm", 0):
        if r.ok:
            a = r.attrs
            bus = a["bytes"] / (r.arrays["time_us_back_to_back"][0] * 1e-6) / 1e9 * a["bus_factor"]
            rows.setdefault((a["bytes"], a["placement"], on), []).append(bus)
print("all-reduce busbw (GB/s), median of the runs; spread = (max - min) / median of the runs without")
print(f"{'bytes':>12} {'placement':>10} {'with':>8} {'without':>8} {'change':>8} {'spread':>8}")
for (size, placement) in sorted({(b, p) for b, p, _ in rows}):
    w, wo = rows.get((size, placement, True), []), rows.get((size, placement, False), [])
    if not w or not wo:
        continue
    mw, mwo = statistics.median(w), statistics.median(wo)
    spread = (max(wo) - min(wo)) / mwo * 100
    print(f"{size:>12} {placement:>10} {mw:8.1f} {mwo:8.1f} {100 * (mw / mwo - 1):+7.1f}% {spread:7.1f}%")
EOF
fi

# ---- 3. soak ----
# Each run timed by --duration-s; the rank files hold per-iteration times and memory samples
# (device allocator, the driver's device memory in use, host RSS); analysis/soak.py judges them.
# Its table goes to stdout and to soak.md, its rows to soak.jsonl, both flat in OUT_DIR.
soak() {  # NAME args...
  local name=$1; shift
  step "soak $name: $*"
  local start=$SECONDS
  timeout 600 "${mpi[@]}" "${llmhpc[@]}" "$@" --out "$out/runs/soak-$name"
  local rc=$?
  echo "soak $name: rc $rc after $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || fail "soak $name: rc $rc"
}
if has soak; then
  soak comm --mode comm --size "$SOAK_SIZES" --inplace no --warmup 20 --duration-s "$SOAK_COMM_S"
  soak ddp --mode ddp --model "$SOAK_MODEL" --context-length 128 --batch-size 16 --precision bf16 --attention flash \
    --ddp bucketed --bucket-mb 25 --warmup 5 --duration-s "$SOAK_DDP_S"
  step "soak verdicts (analysis/soak.py)"
  rm -f "$out/soak.jsonl"
  python3 "$root/analysis/soak.py" "$out"/runs/soak-* --jsonl "$out/soak.jsonl" | tee "$out/soak.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "soak: a record did not hold, or no records (soak.md, log.txt)"
fi

# ---- 4. stragglers ----
# The straggler report over NCCL: every rank "works" 50 ms on the host before each collective
# (LLMHPC_FAULT delay), the slow one 55 ms, 10% longer (rank 1, then rank 0); one collective a
# step (ddp flat), so the slow rank arrives 10% of a step late. It must be named, the other not.
# Then the same configuration with no fault, whose verdict is printed, not judged (two GPUs
# that differ, one at its power cap, may make a rank late).
if has stragglers; then
  STRAG=(--mode ddp --model small --context-length 128 --batch-size 8 --ddp flat --warmup 2 --steps 24)
  for slow in 1 0 none; do
    name=stragglers-$slow
    case $slow in
      1) spec="rank=0,step=1,action=delay:50;rank=1,step=1,action=delay:55" ;;
      0) spec="rank=0,step=1,action=delay:55;rank=1,step=1,action=delay:50" ;;
      *) spec="" ;;
    esac
    step "straggler $name: LLMHPC_FAULT=$spec"
    LLMHPC_FAULT=$spec timeout 300 "${mpi[@]}" "${llmhpc[@]}" "${STRAG[@]}" --out "$out/runs/$name" >"$out/$name.log" 2>&1 ||
      { fail "$name: the run failed"; tail -5 "$out/$name.log"; continue; }
    verdict=$(python3 "$root/analysis/stragglers.py" "$out/runs/$name" 2>&1)
    echo "$verdict" | grep -- "^- \*\*rank\|^| \`" | tee -a "$out/stragglers.txt"
    if [ "$slow" != none ]; then
      other=$((1 - slow))
      grep -q -- "^- \*\*rank $slow\*\* in" <<<"$verdict" || fail "$name: rank $slow is not named"
      grep -q -- "^- \*\*rank $other\*\* in" <<<"$verdict" && fail "$name: rank $other, not slowed, is named"
    fi
  done
fi

step "summary"
cat "$out/faults.txt" 2>/dev/null
echo "failures: $failures; results in $out"
[ "$failures" -eq 0 ]

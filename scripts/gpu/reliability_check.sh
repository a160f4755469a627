#!/usr/bin/env bash
# Reliability on the GPUs of one host (2 ranks, nccl): the numbers behind
# docs/results/reliability.md. About 8 minutes:
#   1. faults: a stall injected into an NCCL collective (comm, then ddp) must end the job within
#      --comm-timeout + 30 s with the watchdog's report; a rank killed mid-benchmark must end the
#      job; every rank file stays readable (finished configurations ok, the interrupted one marked).
#   2. the watchdog's cost: comm busbw with the watchdog (--comm-timeout 600) and without it
#      (--comm-timeout 0: blocking communicator, no thread, no events), alternating REPS times.
#   3. soak: one long comm configuration and one long ddp run; per-iteration times checked for
#      drift (the last tenth against the first), GPU memory and the ranks' host memory (sampled
#      every 2 s) for growth; a verdict per run in soak.txt.
# From the repository root:
#   scripts/gpu/reliability_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc. Environment: STALL_TIMEOUT (15 s), REPS (3), SIZES
# (1MB,16MB,256MB,1GB), SOAK_SIZE (256MB), SOAK_ITERS (30000), SOAK_STEPS (3000), MPIRUN.
# Files in OUT_DIR: log.txt (everything), runs/ (rank files), faults.txt, cost.txt, soak.txt,
# memory-*.txt (the samples). Exits non-zero if any check failed (speed is reported, not judged).
set -uo pipefail
source "$(dirname "$0")/setup.sh" reliability-check "${1:-}" "${2:-}"
mkdir -p "$out/runs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
STALL_TIMEOUT=${STALL_TIMEOUT:-15}
REPS=${REPS:-3}
SIZES=${SIZES:-1MB,16MB,256MB,1GB}
SOAK_SIZE=${SOAK_SIZE:-256MB}
SOAK_ITERS=${SOAK_ITERS:-30000}
SOAK_STEPS=${SOAK_STEPS:-3000}
read -ra mpi <<<"${MPIRUN:-mpirun} -np 2 -x NCCL_NVLS_ENABLE -x LLMHPC_FAULT"
exec > >(tee -a "$out/log.txt") 2>&1
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
failures=0
fail() { echo "FAIL: $*" | tee -a "$out/faults.txt"; failures=$((failures + 1)); }
export PYTHONPATH=$root/analysis${PYTHONPATH:+:$PYTHONPATH}

step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1; nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1

# ---- 1. faults ----
# fault NAME LLMHPC_FAULT "words" args...: the job must end non-zero within the bound.
fault() {
  local name=$1 spec=$2 words=$3; shift 3
  step "fault $name: LLMHPC_FAULT=$spec"
  local start=$SECONDS
  LLMHPC_FAULT=$spec timeout $((STALL_TIMEOUT + 120)) "${mpi[@]}" "$bin/llmhpc" "$@" --out "$out/runs/$name" \
    >"$out/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
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
assert set(statuses) <= {"ok", "interrupted"} and statuses.get("ok"), statuses
EOF
}
COMM=(--mode comm --size 1MB,16MB,64MB --iters 200 --warmup 5 --comm-timeout "$STALL_TIMEOUT")
DDP=(--mode ddp --model small --context-length 128 --batch-size 8 --ddp bucketed,overlap --warmup 2 --steps 20
  --comm-timeout "$STALL_TIMEOUT")
fault nccl_comm_stall "rank=1,config=3,step=50,action=stall" "watchdog on rank" "${COMM[@]}"
fault nccl_ddp_stall "rank=0,config=2,step=10,action=stall" "watchdog on rank" "${DDP[@]}"
fault nccl_comm_kill "rank=1,config=3,step=50,action=signal:9" "rank 1" "${COMM[@]}"

# ---- 2. the watchdog's cost ----
step "watchdog cost: comm $SIZES, with (--comm-timeout 600) and without (0), $REPS rounds"
cost_runs=()
for rep in $(seq "$REPS"); do
  for timeout_s in 600 0; do
    dir=$out/runs/cost-t$timeout_s-r$rep
    timeout 300 "${mpi[@]}" "$bin/llmhpc" --mode comm --size "$SIZES" --comm-timeout "$timeout_s" --out "$dir" |
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

# ---- 3. soak ----
# Samples every 2 s: seconds, each GPU's used MiB, the llmhpc processes' summed RSS in KiB.
sample_memory() {
  while :; do
    echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | paste -sd' ')" \
      "$(ps -C llmhpc -o rss= | awk '{s += $1} END {print s + 0}')"
    sleep 2
  done
}
soak() {  # NAME args...
  local name=$1; shift
  step "soak $name: $*"
  sample_memory >"$out/memory-$name.txt" &
  local sampler=$!
  local start=$SECONDS
  timeout 300 "${mpi[@]}" "$bin/llmhpc" "$@" --out "$out/runs/soak-$name" | grep -v "^\[" | tail -6
  local rc=${PIPESTATUS[0]}
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  echo "soak $name: rc $rc after $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || fail "soak $name: rc $rc"
}
soak comm --mode comm --size "$SOAK_SIZE" --inplace no --warmup 20 --iters "$SOAK_ITERS"
soak ddp --mode ddp --model small --context-length 128 --batch-size 8 --ddp bucketed --warmup 10 --steps "$SOAK_STEPS"
python3 - "$out" <<'EOF' | tee "$out/soak.txt"
import os, statistics, sys
from llmhpc_h5 import open_run
out = sys.argv[1]
bad = 0
def verdict(name, ok, text):
    global bad
    bad += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {text}")
for name, key in (("comm", "time_us"), ("ddp", "step_ms")):
    d = os.path.join(out, "runs", f"soak-{name}")
    if not os.path.exists(os.path.join(d, "rank00000.h5")):
        verdict(name, False, "no results"); continue
    run = open_run(d)
    for r in run.records(name, rank=None):
        t = list(r.arrays[key]) if r.ok else []
        if len(t) < 100:
            verdict(f"{name} rank {r.rank}", False, f"status {r.status}, {len(t)} samples"); continue
        tenth = len(t) // 10
        first, last = statistics.median(t[tenth:2 * tenth]), statistics.median(t[-tenth:])
        drift = last / first - 1
        verdict(f"{name} rank {r.rank} time drift", abs(drift) < 0.10,
                f"median {key} {first:.4g} (2nd tenth) -> {last:.4g} (last tenth), {100 * drift:+.1f}% (bound 10%)")
    samples = [line.split() for line in open(os.path.join(out, f"memory-{name}.txt")) if line.strip()]
    samples = [s for s in samples if len(s) >= 3 and int(s[-1]) > 0]  # while the ranks ran
    if len(samples) < 10:
        verdict(f"{name} memory", False, f"only {len(samples)} samples"); continue
    early, late = samples[len(samples) // 4], samples[-2]  # after start-up, just before the end
    for col, label, unit, slack in ((1, "GPU 0", "MiB", 64), (2, "GPU 1", "MiB", 64), (-1, "host RSS", "KiB", 65536)):
        if col >= len(early) and col > 0:
            continue
        a, b = int(early[col]), int(late[col])
        verdict(f"{name} {label} memory", b - a <= max(slack, a * 0.02),
                f"{a} -> {b} {unit} from a quarter of the run to its end (bound +max({slack}, 2%))")
sys.exit(1 if bad else 0)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "soak verdict (soak.txt)"

step "summary"
cat "$out/faults.txt" 2>/dev/null
echo "failures: $failures; results in $out"
[ "$failures" -eq 0 ]

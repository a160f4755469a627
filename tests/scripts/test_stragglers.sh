#!/usr/bin/env bash
# The straggler report names a slow rank. Under mpirun, one rank sleeps before each of its
# collectives from step 1 on (LLMHPC_FAULT action=delay, test only: src/core/watchdog.h):
# - 40 ms, several times a tiny step, on rank 2 of 3, in a CPU ddp sweep and a CPU train run;
# - a rank 10% slower than the others: every rank of 2 "works" 50 ms per step (a sleep: the
#   cores of a shared machine differ by more than 10% from one run to the next), the slow one
#   55 ms, rank 1 in one run and rank 0 in another.
# Every rank file must hold the clock offset and the per-step arrival times, and
# analysis/stragglers.py (and report.py's Stragglers section) must name the slow rank and no
# other. Then the naming rule on made-up arrivals.
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN}")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
MPIEXEC=${MPIEXEC:-mpirun}
PY=${LLMHPC_PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
source "$(dirname "$0")/cli_check.sh" || exit 1  # before the cd: $0 may be a relative path
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

TINY=(--device cpu --d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 64 --context-length 8)
"$PY" -c "import numpy as np; np.random.default_rng(0).integers(0, 64, 4000, dtype=np.uint16).tofile('tokens.bin')"

# slow NAME NP SLOW FAULT args...: the run of NP ranks under LLMHPC_FAULT=FAULT must succeed, and
# the report must name rank SLOW alone.
slow() {
  local name=$1 np=$2 rank=$3 fault=$4; shift 4
  LLMHPC_FAULT=$fault timeout 120 "$MPIEXEC" --oversubscribe -np "$np" "$BIN" "$@" \
    --out "$WORK/$name" >"$WORK/$name.log" 2>&1 || { fail "$name: the run failed"; tail -15 "$WORK/$name.log"; return; }
  grep -q "rank $rank sleeps [0-9]* ms before each collective from" "$WORK/$name.log" || fail "$name: the delay was not announced"
  PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/$name" <<'EOF' || fail "$name: the files lack the arrival times"
import sys
from llmhpc_h5 import open_run
run = open_run(sys.argv[1])
for rf in run.files:
    assert "clock_offset_s" in rf.attrs and rf.attrs["clock_offset_uncertainty_s"] >= 0, rf.attrs
    assert rf.rank != 0 or rf.attrs["clock_offset_s"] == 0
recs = [r for r in run.records(rank=None) if r.ok and "arrival_index" in r.arrays]
assert recs, "no record with arrival_* datasets"
for r in recs:
    a = r.arrays
    n = len(a["arrival_index"])
    assert n > 0 and all(len(a[k]) == n for k in ("arrival_step", "arrival_start_s", "arrival_first_s",
                                                  "arrival_last_s", "arrival_collectives")), r.path
    assert (a["arrival_first_s"] >= a["arrival_start_s"]).all() and (a["arrival_last_s"] >= a["arrival_first_s"]).all()
    assert (a["arrival_collectives"] >= 1).all()
print(f"    {len(recs)} records with arrival times")
EOF
  local out others
  others=$(seq 0 $((np - 1)) | grep -vx "$rank" | paste -sd '|')
  out=$("$PY" "$ROOT/analysis/stragglers.py" "$WORK/$name" 2>&1)
  if ! grep -q -- "- \*\*rank $rank\*\* in" <<<"$out"; then fail "$name: rank $rank is not named a straggler"; echo "$out" | tail -8;
  elif grep -E -q -- "- \*\*rank ($others)\*\* in" <<<"$out"; then fail "$name: a rank that was not slowed is named"; echo "$out" | tail -8;
  else echo "ok   $name: $(grep -m1 -- "- \*\*rank $rank\*\*" <<<"$out" | cut -c1-160)"; fi
  "$PY" "$ROOT/analysis/report.py" "$WORK/$name" -o "$WORK/$name-report/report.md" >"$WORK/$name-report.log" 2>&1 &&
    grep -q "^## Stragglers" "$WORK/$name-report/report.md" && grep -q -- "- \*\*rank $rank\*\*" "$WORK/$name-report/report.md" ||
    fail "$name: report.py's Stragglers section does not name rank $rank"
}

DDP=(--mode ddp "${TINY[@]}" --ddp flat --warmup 1 --comm-timeout 60)
slow ddp 3 2 "rank=2,step=1,action=delay:40" "${DDP[@]}" --batch-size 3 --steps 12
slow train 3 2 "rank=2,step=1,action=delay:40" --mode train "${TINY[@]}" --data tokens.bin --batch-size 3 --steps 14 \
  --comm-timeout 60
# 10% slower: one collective per step (ddp flat), so the 5 ms more are 10% of the slow rank's step.
slow ddp-10pct-rank1 2 1 "rank=0,step=1,action=delay:50;rank=1,step=1,action=delay:55" "${DDP[@]}" --batch-size 2 --steps 16
slow ddp-10pct-rank0 2 0 "rank=0,step=1,action=delay:55;rank=1,step=1,action=delay:50" "${DDP[@]}" --batch-size 2 --steps 16

# Faults for several ranks: two for one rank, or an empty one, are refused on every rank (exit 2,
# one message, no files: tests/scripts/cli_check.sh).
LLMHPC_FAULT="rank=0,step=1,action=delay:50;rank=0,step=1,action=delay:55" \
  cli_check 2 "two faults for rank 0" "${DDP[@]}" --steps 1
LLMHPC_FAULT="rank=0,step=1,action=delay:50;" cli_check 2 "an empty fault" "${DDP[@]}" --steps 1
# A fault that could never act, or not as written, is refused naming its part.
for bad in "rank=2,step=1,action=stall|rank 2 is outside 0..1" "rank=1,step=1,action=signal:99|signal 99 is outside" \
  "rank=1,step=1,action=exit:300|exit code 300 is outside 1..255" "rank=1,step=1,action=delay:-5|delay (ms) -5" \
  "rank=1,step=1,action=delay:20ms|delay (ms) '20ms' is not a whole number" "rank=1,step=1,action=stal|unknown action 'stal'" \
  "rank=1,stpe=1,action=stall|unknown key 'stpe'" "rank=1,action=stall|no op=N, config=C or step=S"; do
  LLMHPC_FAULT=${bad%%|*} cli_check 2 "${bad#*|}" "${DDP[@]}" --steps 1
done
# A run that ends well without its fault firing says so.
LLMHPC_FAULT="rank=1,step=99,action=stall" "$MPIEXEC" --oversubscribe -np 2 -x LLMHPC_FAULT "$BIN" "${DDP[@]}" \
  --batch-size 2 --steps 2 --out "$WORK/unfired" >"$WORK/unfired.log" 2>&1 &&
  grep -q "LLMHPC_FAULT for rank 1 never fired" "$WORK/unfired.log" ||
  fail "a fault whose step never came: not said ($(tail -3 "$WORK/unfired.log"))"

# The naming rule on made-up arrivals (2 ranks, 100 ms steps, rank 1 20 ms late in the steps
# given, rank 0 in the others): last in most steps is not enough where chance could do it (3 of 3,
# 12 of 15); 8 of 8 and 13 of 15 are named.
PYTHONPATH="$ROOT/analysis" "$PY" - <<'EOF' || fail "the straggler rule on made-up arrivals"
import types
import numpy as np
from stragglers import chance_of_last, chance_text, report_section, summarize

assert chance_of_last(7, 7, 2) == 0.5 ** 7 and chance_of_last(0, 9, 4) == 1.0
assert abs(chance_of_last(2, 3, 3) - 7 / 27) < 1e-12  # 3 (1/3)^2 (2/3) + (1/3)^3
# A soak's thousands of steps: no overflow, and the tail where the normal curve puts it (+1.34 sd).
assert 0.08 < chance_of_last(1030, 2000, 2) < 0.11 and chance_of_last(60000, 65536, 2) == 0.0
assert chance_text(0.0) == "< 1e-300" and chance_text(0.0812) == "0.08"  # a tail that underflows is not "0"


def run_of(steps, late_in, by=0.02):
    def record(rank):
        t0 = np.arange(steps) * 0.1
        late = np.array([by if (rank == 1) == (i in late_in) else 0.0 for i in range(steps)])
        arrays = dict(arrival_index=np.arange(steps), arrival_step=np.arange(steps), arrival_start_s=t0,
                      arrival_first_s=t0 + 0.05 + late, arrival_last_s=t0 + 0.06 + late)
        return types.SimpleNamespace(rank=rank, ok=True, status="ok", path="ddp/made-up", arrays=arrays)
    recs = [record(0), record(1)]
    files = [types.SimpleNamespace(attrs={"clock_offset_uncertainty_s": 1e-6})] * 2
    return types.SimpleNamespace(files=files, records=lambda rank=None: recs, directory=f"made-up-{by}",
                                 nodes=lambda: [])


for steps, late_in, named in ((3, range(3), False), (8, range(8), True), (15, range(12), False), (15, range(13), True)):
    (s,) = summarize(run_of(steps, set(late_in)))
    got = [r for r, *_ in s["stragglers"]]
    assert got == ([1] if named else []), (steps, len(late_in), got, s["stragglers"])
    assert s["most_last"] == 1 and abs(s["late_s"] - 0.02) < 1e-9, s
    # The share's chance, named or not: 12 of 15 is near the rule's 0.01, a hint that a longer run tells.
    assert abs(s["chance"] - chance_of_last(len(late_in), steps, 2)) < 1e-15, s
# Last in every step but 1% of the step late: not named, and no chance shown (no run length would name it).
(s,) = summarize(run_of(60, set(range(60)), by=0.001))
assert s["most_last"] == 1 and not s["stragglers"] and np.isnan(s["chance"]), s
print("ok   the rule on made-up arrivals: 3 of 3 and 12 of 15 not named, 8 of 8 and 13 of 15 named")
# report.py's section: the verdict first; the quiet record counted, not listed (every=True lists it).
runs = [run_of(8, set(range(8))), run_of(60, set(range(60)), by=0.001)]
short, whole = report_section(runs, every=False), report_section(runs)
assert short.startswith("Stragglers: 1 named.\n- **rank 1** in `made-up-0.02`"), short
assert "`made-up-0.001`" not in short and "1 other record of several ranks: no rank late by 5% of the step or more beyond the clocks'" in short, short
assert "| `made-up-0.001` |" in whole and "other record" not in whole, whole
print("ok   the report's section: the verdict first, the quiet record counted")
# A hang's stopped rank ends without arrival times: the others are compared, the row says which lacks them.
made = run_of(8, set(range(8)))
stopped = types.SimpleNamespace(rank=2, ok=False, status="interrupted", path="ddp/made-up", arrays={})
recs = made.records() + [stopped]
made.records = lambda rank=None: recs
(s,) = summarize(made)
assert s["ranks"] == 2 and s["without"] == [2] and [r for r, *_ in s["stragglers"]] == [1], s
text = report_section([made], every=False)
assert "| 2 (rank 2 kept no arrival times) | 8 |" in text and "among the 2 ranks with arrival times" in text, text
print("ok   a rank without arrival times: the others compared, the row names it")
EOF

if [ $failures -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "stragglers ok"

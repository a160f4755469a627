#!/usr/bin/env bash
# Faults injected under mpirun -np 3 (LLMHPC_FAULT, test only: src/core/watchdog.h): a rank
# killed by a signal in the middle of a comm benchmark, a rank that exits in the middle of a
# ddp run, a rank that stalls inside a collective (comm and ddp), a rank stopped by SIGSTOP
# (a process that answers nothing, not even the launcher's SIGTERM), a rank of tp 2 x dp 2 (-np 4)
# that stalls in its tensor-parallel group, a rank that issues another
# collective than the others (calls that no longer match), rank 0 interrupted by SIGINT in a
# sweep. Each job must end non-zero
# within --comm-timeout + 30 s, with a message naming the failed rank (a watchdog's report: the
# stalled rank as the one that had not reached the stuck collective, the stopped one as giving no
# answer; exit code 4), leave no rank process behind, and leave every rank's file readable: the finished configurations "ok" with their
# arrays, the interrupted one marked. Then damaged inputs (checkpoint, token file, result file) give clear errors, and a
# sweep that runs out of memory goes on with nothing of the failed configuration left live; a rank
# of a tensor-parallel group that runs out of memory alone ends the job at once.
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN}")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
MPIEXEC=${MPIEXEC:-mpirun}
PY=${LLMHPC_PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

TIMEOUT=3  # --comm-timeout in seconds
COMM=(--mode comm --device cpu --size 1KB,16KB,64KB --steps 20 --warmup 2 --comm-timeout $TIMEOUT)
DDP=(--mode ddp --device cpu --d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 64 --context-length 8
  --batch-size 3 --ddp naive,flat,overlap --warmup 1 --steps 4 --comm-timeout $TIMEOUT)

source "$ROOT/scripts/fault_leftovers.sh"

# run NAME FAULT "words the output must contain" args...: the job must fail in time, on NP ranks (3).
run() {
  local name=$1 fault=$2 words=$3; shift 3
  local start=$SECONDS
  LLMHPC_FAULT=$fault LLMHPC_FAULT_RUN=$WORK/$name timeout $((TIMEOUT + 60)) "$MPIEXEC" --oversubscribe -np "${NP:-3}" "$BIN" "$@" \
    --out "$WORK/$name" >"$WORK/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  last_rc=$rc
  leftovers "$WORK/$name"
  if [ $rc -eq 0 ]; then fail "$name: exit code 0 after the fault $fault";
  elif [ $rc -eq 124 ]; then fail "$name: the job hung (killed by timeout after ${took}s)";
  elif [ $took -gt $((TIMEOUT + 30)) ]; then fail "$name: took ${took}s, more than --comm-timeout + 30 s";
  elif ! grep -q -- "$words" "$WORK/$name.log"; then fail "$name: the output lacks '$words'";
  else echo "ok   $name: rc $rc after ${took}s; $(grep -m1 -- "$words" "$WORK/$name.log" | cut -c1-150)"; return; fi
  sed 's/^/    /' "$WORK/$name.log" | tail -15
}

# readable NAME KIND: every rank's file opens; finished records are ok with complete arrays,
# nothing is left "running", and at least one configuration finished before the fault.
readable() {
  PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/$1" "$2" <<'EOF' || fail "$1: the files are not as they should be"
import sys
from llmhpc_h5 import ABORTED, open_run
run = open_run(sys.argv[1])
kind = sys.argv[2]
assert run.ranks == [0, 1, 2], run.ranks
assert not run.complete, "a killed run must not read as complete"
statuses = {}
for r in run.records(kind, rank=None):  # "interrupted: SIGTERM": a signal ended the rank (the launcher's after a fault)
    statuses.setdefault("interrupted" if r.status.startswith("interrupted") else r.status, []).append(r.name)
    if r.ok:
        key = "time_us" if kind == "comm" else "step_ms"
        want = r.attrs["iters"] if kind == "comm" else r.attrs["steps"]
        assert len(r.arrays[key]) == want, (r.rank, r.name, len(r.arrays[key]))
assert set(statuses) <= {"ok", "interrupted", ABORTED}, statuses  # ABORTED: what the watchdog's run was measuring
assert statuses.get("ok"), f"no configuration finished before the fault: {statuses}"
print(f"    {sys.argv[1].rsplit('/', 1)[1]}: {len(statuses['ok'])} finished records readable, "
      f"{len(statuses.get('interrupted', []))} marked interrupted")
EOF
}

# hang_files NAME WHO FIELD: the rank files of every other rank keep its watchdog's report (all
# of them waited, so all of them fired, and none ended the job before another had kept its own:
# status "aborted by the watchdog: ...", FIELD (hang_not_reached or hang_no_answer) = WHO with
# this host); rank WHO's own file keeps no report of its own watchdog, and, stalled
# (hang_not_reached), keeps its account of the hang: the firing rank, the collective it had not
# issued, itself among those that had not; report.py's Hangs section and run line name WHO.
hang_files() {
  PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/$1" "$2" "$3" "$(hostname)" "$ROOT/analysis/report.py" <<'EOF' ||
import subprocess, sys
from llmhpc_h5 import open_run
directory, who, field, host, report = sys.argv[1:]
run = open_run(directory)
hangs = run.hang_reports()
assert hangs, f"no rank file says the watchdog ended the run: {[rf.status for rf in run.files]}"
waiting = set(range(run.world_size)) - {int(who)}
own = [h for h in hangs if h["fired_on"] == h["rank"]]
assert {h["rank"] for h in own} == waiting, f"own reports kept by ranks {sorted(h['rank'] for h in own)}, not {sorted(waiting)}"
notes = [h for h in hangs if h["fired_on"] != h["rank"]]
if field == "hang_not_reached":  # the stalled rank's own account, learnt from a firing rank
    assert [h["rank"] for h in notes] == [int(who)], f"rank {who}'s file keeps no account of the hang: {notes}"
    (note,) = notes
    assert note["fired_on"] in waiting and note["collective"] in {h["collective"] for h in own}, (note, own)
    assert who in note["not_reached"].split(",") and "this rank had not issued it" in note["what"], note
    assert note["report"].startswith(f"llmhpc: rank {who} (host {host}): the watchdog of rank "), note["report"][:120]
else:  # a stopped rank answers nobody; resumed by the launcher's kill (SIGCONT before SIGTERM),
    # it may still note the hang before it ends, as the rank that had not issued the collective
    assert all(h["rank"] == int(who) and "this rank had not issued it" in h["what"] for h in notes), \
        f"an account of the hang on a rank other than the stopped one, or a wrong one: {notes}"
key = field.replace("hang_", "")
for h in own:
    assert h[key] == who and h[key + "_hosts"] == host and h["collective"] > 0 and f"#{h['collective']}" in h["what"], h
    assert h["report"].startswith(f"llmhpc: watchdog on rank {h['rank']} "), h["report"][:80]
subprocess.run([sys.executable, report, directory, "-o", directory + "-report/report.md"], check=True, capture_output=True)
text = open(directory + "-report/report.md").read()
assert "## Hangs" in text and f"(ABORTED by the watchdog of rank {own[0]['rank']}" in text, text[:600]
print(f"    {len(own)} rank file(s) keep the report: {field} = rank {who} on {host}"
      + (f"; rank {who}'s own file names rank {notes[0]['fired_on']}'s watchdog" if notes else ""))
EOF
    fail "$1: the rank files do not keep the hang report"
}

# hang_report LOG RANK WHO: the watchdog of rank RANK says, with the stuck collective's number,
# that rank WHO had not reached it (a stalled rank's last issued collective is the one before).
hang_report() {
  local log=$1 rank=$2 who=$3
  local seq
  seq=$(grep -m1 -A1 "watchdog on rank $rank " "$log" | grep -o "collective #[0-9]*" | head -1 | tr -dc 0-9)
  if [ -z "$seq" ]; then fail "$log: no watchdog report of rank $rank"; return; fi
  if grep -q "collective #$seq on every rank" "$log" &&
    grep -q "not reached: rank $who on $(hostname) (last issued #$((seq - 1))" "$log"; then
    echo "ok   rank $rank's watchdog: rank $who had not reached collective #$seq"
  else
    fail "$log: rank $rank's report does not name rank $who as not having reached collective #$seq"
    grep -A6 "watchdog on rank" "$log" | sed 's/^/    /' | head -20
  fi
}

# The comm faults run beside the others: most of a fault's time is waiting, for --comm-timeout and
# for the ranks' answers (one after another the faults took 95 s of a 2-core machine, at a third
# of a core). Their report follows the others'.
comm_faults() {
run comm_kill "rank=1,config=3,step=5,action=signal:9" "rank 1" "${COMM[@]}"
readable comm_kill comm
run comm_stall "rank=1,config=3,step=5,action=stall" "watchdog on rank" "${COMM[@]}"
grep -q "no progress within --comm-timeout" "$WORK/comm_stall.log" || fail "comm_stall: no timeout report"
grep -q "last enqueued collective #[0-9]*, last completed #[0-9]*" "$WORK/comm_stall.log" ||
  fail "comm_stall: the report lacks the sequence numbers"
grep -q "rank 1 stalls" "$WORK/comm_stall.log" || fail "comm_stall: the stalled rank is not named"
hang_report "$WORK/comm_stall.log" 0 1
[ "$last_rc" -eq 4 ] || fail "comm_stall: exit code $last_rc, not the watchdog's 4"
readable comm_stall comm
hang_files comm_stall 1 hang_not_reached
# Calls that no longer match: rank 1 issues a barrier where the others issue the benchmark's
# all-reduce. Every rank's watchdog names the mismatch, the others' files name rank 1, rank 1's
# names the others, and report.py's Hangs table has them.
run comm_diverge "rank=1,config=2,step=4,action=diverge" "issued differently: rank 1 on $(hostname) issued #" \
  "${COMM[@]}"
[ "$(grep -c "issued differently: rank [02] on $(hostname) issued #[0-9]* as allreduce (mpi, [0-9]* bytes), this rank as barrier (mpi (host), 0 bytes)" "$WORK/comm_diverge.log")" -eq 2 ] ||
  fail "comm_diverge: rank 1's watchdog does not name both others' calls"
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/comm_diverge" "$ROOT/analysis/report.py" <<'EOF' ||
import subprocess, sys
from llmhpc_h5 import open_run
directory, report = sys.argv[1:]
hangs = {h["rank"]: h for h in open_run(directory).hang_reports()}
assert set(hangs) == {0, 1, 2}, sorted(hangs)
assert hangs[0]["mismatched"] == hangs[2]["mismatched"] == "1" and hangs[1]["mismatched"] == "0,2", hangs
assert all(h["not_reached"] == "" for h in hangs.values()), hangs
subprocess.run([sys.executable, report, directory, "-o", directory + "-report/report.md"], check=True, capture_output=True)
text = open(directory + "-report/report.md").read()
assert "issued it as another collective" in text and "| issued differently |" in text, text[:800]
print("    every rank file names the ranks whose calls differ; report.py says so")
EOF
  fail "comm_diverge: the rank files or the report do not name the mismatch"
# SIGSTOP: rank 1 stops before a collective and stays stopped; the others' watchdogs report at
# --comm-timeout, wait Watchdog::kAskS for the ranks' answers (the stopped one gives none), and
# MPI_Abort's kill of the job must reach the stopped process too.
run comm_sigstop "rank=1,config=3,step=5,action=signal:19" "watchdog on rank" "${COMM[@]}"
grep -q "rank 1 raises signal 19" "$WORK/comm_sigstop.log" || fail "comm_sigstop: the fault was not announced"
grep -q "no progress within --comm-timeout" "$WORK/comm_sigstop.log" || fail "comm_sigstop: no timeout report"
grep -q "no answer: rank 1 on $(hostname) (rank 1: no reply within" "$WORK/comm_sigstop.log" ||
  fail "comm_sigstop: the report does not name the stopped rank as giving no answer"
grep -q "tcache\|Aborted\|core dumped" "$WORK/comm_sigstop.log" && fail "comm_sigstop: a rank crashed while aborting"
[ "$last_rc" -eq 4 ] || fail "comm_sigstop: exit code $last_rc, not the watchdog's 4"
readable comm_sigstop comm
hang_files comm_sigstop 1 hang_no_answer
}
(failures=0; comm_faults; echo "$failures" >"$WORK/comm_faults.failures") >"$WORK/comm_faults.out" 2>&1 &
comm_faults_pid=$!

run ddp_exit "rank=2,config=2,step=2,action=exit:3" "rank 2" "${DDP[@]}"
readable ddp_exit ddp
# Ctrl-C in a sweep (rank 0, as a terminal's SIGINT reaches it): rank 0 says where the
# finished records are before the signal ends it, and they stay readable.
run ddp_sigint "rank=0,config=2,step=2,action=signal:2" "SIGINT ends this run: the records finished are in $WORK/ddp_sigint" "${DDP[@]}"
readable ddp_sigint ddp
# The files say so themselves: rank 0's root "interrupted: SIGINT" and the record it was measuring
# when its file was marked (the main thread goes on meanwhile: it may have finished one).
"$PY" - "$WORK/ddp_sigint/rank00000.h5" <<'EOF' || fail "ddp_sigint: rank 0's file does not say it was interrupted by SIGINT"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    root = f.attrs["status"]
    status = {name: g.attrs["status"] for name, g in f["ddp"].items()}
    marked = [name for name, s in status.items() if s == "interrupted: SIGINT"]
    assert root.startswith("interrupted: SIGINT") and "end_time" in f.attrs, root
    assert set(status.values()) <= {"ok", "interrupted: SIGINT"}, status
    assert marked == ([root.rsplit("/", 1)[1]] if " while measuring ddp/" in root else []), (root, status)
    print(f"    ddp_sigint: rank 0's file says '{root}'")
EOF
run ddp_stall "rank=0,config=2,step=3,action=stall" "watchdog on rank" "${DDP[@]}"
grep -q "allreduce (mpi, [0-9]* bytes) in 'ddp/" "$WORK/ddp_stall.log" ||
  fail "ddp_stall: the report does not name the collective, its bytes and the configuration"
hang_report "$WORK/ddp_stall.log" 1 0
readable ddp_stall ddp
hang_files ddp_stall 0 hang_not_reached
# The configuration that hung keeps, on every rank, the steps measured before it (timed steps 1
# and 2; step 0 is the warm-up), as of the rank's last snapshot, with their arrivals.
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/ddp_stall" <<'EOF' || fail "ddp_stall: the hung configuration kept no steps"
import sys
from llmhpc_h5 import ABORTED, open_run, pooled_status
run = open_run(sys.argv[1])
hung = [r for r in run.records("ddp", rank=None) if r.status == ABORTED]
assert sorted(r.rank for r in hung) == run.ranks, [(r.rank, r.name, r.status) for r in run.records("ddp", rank=None)]
for r in hung:
    kept = int(r.attrs.get("steps_timed", 0))
    assert r.kept_steps and 1 <= kept <= 2 and len(r.arrays["step_ms"]) == kept, (r.rank, kept, list(r.arrays))
    assert len(r.arrays["arrival_index"]) >= kept, (r.rank, "no arrivals of the steps kept")
print(f"    every rank kept the hung configuration's steps: {pooled_status(hung)}")
EOF

# SIGTERM to a rank stuck in a collective (rank 1 stalled, the watchdog off): its main thread never
# reaches a step to keep its steps, so the stop's thread writes them as last kept in memory.
LLMHPC_FAULT="rank=1,config=2,step=3,action=stall" timeout 60 "$MPIEXEC" --oversubscribe -np 3 "$BIN" "${DDP[@]}" \
  --comm-timeout 0 --out "$WORK/ddp_stuck_sigterm" >"$WORK/ddp_stuck_sigterm.log" 2>&1 &
stuck_job=$!
for _ in $(seq 100); do grep -q "rank 1 stalls" "$WORK/ddp_stuck_sigterm.log" && break; sleep 0.2; done
sleep 1  # ranks 0 and 2 are inside the step's all-reduce by now
for pid in $(pgrep -f -- "--out $WORK/ddp_stuck_sigterm"); do
  tr '\0' '\n' </proc/"$pid"/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && kill -TERM "$pid"
done
wait $stuck_job
leftovers "$WORK/ddp_stuck_sigterm"
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/ddp_stuck_sigterm" <<'EOF' || fail "ddp_stuck_sigterm: rank 0 kept no steps"
import sys
from llmhpc_h5 import open_run
run = open_run(sys.argv[1])
(r,) = [r for r in run.records("ddp", rank=0) if r.status != "ok"]
kept = int(r.attrs.get("steps_timed", 0))
assert r.status == "interrupted: SIGTERM" and 1 <= kept <= 2 and len(r.arrays["step_ms"]) == kept, (r.status, kept)
print(f"ok   ddp_stuck_sigterm: rank 0, stuck in a collective, kept its steps ({kept}): {r.status}")
EOF

# Out of memory in a tensor-parallel group: rank 1 alone, part-way through the first step,
# where ranks 0 and 2 go on into the group's next collective. Rank 1 finds them waiting there
# (the progress board) and ends the job at once, not after --comm-timeout (30 s here); where
# every rank runs out at the same point (--memory-limit), the sweep records oom and goes on.
TP3=(--mode profile --device cpu --d-model 24 --d-ff 48 --num-layers 2 --num-heads 3 --vocab-size 64
  --context-length 8 --tp 3 --warmup 0 --steps 2)
start=$SECONDS
run profile_tp_oom "rank=1,config=1,op=40,action=oom" "and waits there for rank 1, which will not issue it" \
  "${TP3[@]}" --batch-size 3 --comm-timeout 30
[ "$last_rc" -eq 4 ] && [ $((SECONDS - start)) -le 15 ] ||
  fail "profile_tp_oom: exit code $last_rc after $((SECONDS - start)) s, not the watchdog's 4 well before --comm-timeout 30"
grep -q "not reached: rank 1 on $(hostname) (this rank, last issued #" "$WORK/profile_tp_oom.log" ||
  fail "profile_tp_oom: rank 1's report does not name itself as not having reached the collective"
timeout 60 "$MPIEXEC" --oversubscribe -np 3 "$BIN" "${TP3[@]}" --batch-size 3,1024,6 --memory-limit 4MB \
  --out "$WORK/profile_tp_oom_all" >"$WORK/profile_tp_oom_all.log" 2>&1 || fail "profile_tp_oom_all: exit code $?"
if grep -q "^\[2/3\] .*_B1024_.* oom$" "$WORK/profile_tp_oom_all.log" &&
  grep -q "^\[3/3\] .*_B6_.* ms/step" "$WORK/profile_tp_oom_all.log"; then
  echo "ok   profile_tp_oom_all: every rank out of memory at the same point: oom recorded, the sweep went on"
else
  fail "profile_tp_oom_all: not oom in configuration 2 with configuration 3 measured"
  tail -8 "$WORK/profile_tp_oom_all.log" | sed 's/^/    /'
fi

# Damaged inputs: clear errors, no hang, no crash.
"$PY" - <<'EOF' || fail "could not write the damaged inputs (numpy)"
import numpy as np
np.random.default_rng(0).integers(0, 64, 4000, dtype=np.uint16).tofile("tokens.bin")
np.save("tokens.npy", np.arange(4000, dtype=np.uint16) % 64)
open("garbage.h5", "wb").write(np.random.default_rng(1).bytes(4096))
EOF
TINY=(--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 64 --context-length 8)
"$BIN" --mode train --device cpu --data tokens.bin "${TINY[@]}" --steps 2 --save ckpt.h5 --out "$WORK/train" \
  >/dev/null 2>&1 || fail "could not write a checkpoint to damage"
head -c $(($(stat -c %s ckpt.h5) / 2)) ckpt.h5 >truncated.h5
head -c $(($(stat -c %s tokens.npy) - 101)) tokens.npy >truncated.npy
compgen -G "ckpt.h5.tmp*" >/dev/null && fail "the checkpoint's temporary file was left behind"
# A hang in train's first steps, long before its first minute's write of the losses: every
# rank's file is there with the run's train record, and the others' files keep the report.
run train_stall "rank=2,step=3,action=stall" "watchdog on rank" --mode train --device cpu --data tokens.bin \
  "${TINY[@]}" --batch-size 3 --steps 200 --comm-timeout $TIMEOUT
hang_report "$WORK/train_stall.log" 0 2
hang_files train_stall 2 hang_not_reached
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/train_stall" <<'EOF' || fail "train_stall: a rank file lacks its train record"
import sys
from llmhpc_h5 import open_run
run = open_run(sys.argv[1])
assert run.ranks == [0, 1, 2] and not run.complete, (run.ranks, run.complete)
for rank in run.ranks:  # with the steps before the hang (1 and 2), as of the rank's last snapshot
    (record,) = run.records("train", rank)
    assert record.status != "ok" and record.attrs["batch_size"] == 3, (rank, record.status)
    assert 1 <= len(record.arrays["loss"]) <= 2, (rank, len(record.arrays["loss"]))
print("    every rank's file holds the train record, not ok, with the steps before the hang")
EOF
# A stall in a tp 2 x dp 2 layout: collectives run among some ranks, and each waiting rank's
# report names its stuck collective's group and the rank of it that it waits for. Rank 1 stalls
# in the tensor-parallel group 0-1: rank 0 waits for it there; ranks 2 and 3 go on into their
# data-parallel reductions (groups 0,2 and 1,3) and wait for rank 0 and rank 1.
NP=4 run train_tp_stall "rank=1,step=3,action=stall" "watchdog on rank" --mode train --device cpu \
  --data tokens.bin "${TINY[@]}" --batch-size 4 --tp 2 --steps 200 --comm-timeout $TIMEOUT
for want in "0:ranks 0-1; of them it waits for rank 1" "2:ranks 0,2; of them it waits for rank 0" \
  "3:ranks 1,3; of them it waits for rank 1"; do
  rank=${want%%:*}
  if grep -A8 "watchdog on rank $rank " "$WORK/train_tp_stall.log" | grep -q "its group: ${want#*:}$"; then
    echo "ok   train_tp_stall: rank $rank's report: its group: ${want#*:}"
  else
    fail "train_tp_stall: rank $rank's report lacks 'its group: ${want#*:}'"
    grep -A8 "watchdog on rank $rank " "$WORK/train_tp_stall.log" | sed 's/^/    /'
  fi
done
grep -q "no answer" "$WORK/train_tp_stall.log" && fail "train_tp_stall: a waiting rank was named as not answering"
grep -q "not reached: rank 0 on .* among ranks 0-1, " "$WORK/train_tp_stall.log" ||
  fail "train_tp_stall: rank 0, behind in its tensor-parallel group, is not described with that group"
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/train_tp_stall" <<'EOF' || fail "train_tp_stall: the rank files lack the groups"
import sys
from llmhpc_h5 import open_run
hangs = {h["rank"]: h for h in open_run(sys.argv[1]).hang_reports()}
want = {0: ("0-1", "1"), 2: ("0,2", "0"), 3: ("1,3", "1")}
assert {r: (hangs[r]["group"], hangs[r]["waited_for"]) for r in want if r in hangs} == want, hangs.keys()
print("    ranks 0, 2 and 3 keep their collective's group and the rank they wait for")
EOF

wait $comm_faults_pid
cat "$WORK/comm_faults.out"
[ -s "$WORK/comm_faults.failures" ] || fail "the comm faults did not run to their end"
failures=$((failures + $(cat "$WORK/comm_faults.failures" 2>/dev/null || echo 0)))
# The watchdogs of the ranks that wait fire together: none may name another as not answering
# (each goes on answering until the others that waited have reported, an asking window at most).
grep -q "no answer" "$WORK/train_stall.log" "$WORK/comm_stall.log" "$WORK/ddp_stall.log" &&
  fail "a waiting rank was named as not answering: $(grep -h "no answer" "$WORK"/*_stall.log | head -2)"
bad_input() {  # "words" args...
  local words=$1; shift
  for np in 1 3; do
    timeout 60 "$MPIEXEC" --oversubscribe -np $np "$BIN" "$@" --out "$WORK/bad_$RANDOM" >"$WORK/bad.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -ge 128 ] || ! grep -q -- "$words" "$WORK/bad.log"; then
      fail "np $np: $* -> rc $rc, expected an error with '$words'"; sed 's/^/    /' "$WORK/bad.log" | head -5
    else echo "ok   np $np: $(grep -m1 -- "$words" "$WORK/bad.log" | cut -c1-150)"; fi
  done
}
bad_input "truncated or damaged" --mode train --device cpu --data tokens.bin "${TINY[@]}" --init truncated.h5
bad_input "not an HDF5 file" --mode train --device cpu --data tokens.bin "${TINY[@]}" --init garbage.h5
bad_input "truncated.npy': file shorter than its shape says" --mode train --device cpu --data truncated.npy "${TINY[@]}"
mkdir -p results_garbage results_truncated
cp garbage.h5 results_garbage/rank00000.h5
head -c 3000 "$WORK/train/rank00000.h5" >results_truncated/rank00000.h5
for dir in results_garbage results_truncated; do
  out=$("$PY" "$ROOT/analysis/report.py" "$dir" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || ! echo "$out" | grep -q "rank00000.h5: cannot be opened as HDF5" || echo "$out" | grep -q Traceback; then
    fail "analysis of $dir: rc $rc, expected a one-line error naming the file"; echo "$out" | tail -3 | sed 's/^/    /'
  else echo "ok   analysis of $dir: $(echo "$out" | tail -1 | cut -c1-150)"; fi
done

# A sweep that runs out of memory goes on; the failed configuration leaves nothing live.
timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$BIN" --mode ddp --device cpu --d-model 32 --d-ff 64 --num-layers 2 \
  --num-heads 4 --vocab-size 100 --context-length 2048,16 --batch-size 2 --ddp naive --warmup 0 --steps 2 \
  --memory-limit 64MB --out "$WORK/oom" >"$WORK/oom.log" 2>&1 || fail "the ddp sweep with an oom failed"
PYTHONPATH="$ROOT/analysis" "$PY" - "$WORK/oom" <<'EOF' || fail "oom recovery"
import sys
from llmhpc_h5 import open_run
run = open_run(sys.argv[1])
assert run.complete
for rank in (0, 1):
    recs = {r.attrs["context_length"]: r for r in run.records("ddp", rank)}
    assert recs[2048].status == "oom" and recs[16].status == "ok", {k: r.status for k, r in recs.items()}
    a = recs[2048].attrs
    assert a["live_bytes_after_recovery"] == a["live_bytes_before"], a
print("ok   oom in a ddp sweep: status oom, the next configuration ran, live memory back where it was")
EOF

if [ $failures -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "fault injection ok"

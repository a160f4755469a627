#!/usr/bin/env bash
# Training that stops and goes on: a run stopped after step 5 and resumed with --init trains
# bitwise as the uninterrupted run (the batches and the cosine learning rate go on from the
# checkpoint's step; zero1 on 2 ranks, random order, the gradients clipped), also given only
# --init and --steps (the checkpoint keeps the options that shape the training, and says them;
# one given over them is said too); the same run in
# two micro-batches a step (--grad-accum 2) trains as in one, to rounding, with a lower peak;
# --save-every rewrites the checkpoint without changing the training; a signal (SIGUSR1
# through mpirun, SIGTERM and SIGINT to a single process) stops every rank at the same step,
# saves the checkpoint, marks the rank files "interrupted" and exits 128 + the signal, and the
# run goes on from what it saved; two runs saving to one path leave one whole checkpoint, and a
# save removes the work files of writers killed on this host;
# --save-every without --save is refused, and so is a decay that ended at or before the
# checkpoint's step; options that change a checkpoint's model.
source "$(dirname "$0")/mpi_script.sh"
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "--- $f"; tail -8 "$f"; done; exit 1; }

${LLMHPC_PYTHON:-python3} -c "import numpy as np; np.random.default_rng(0).integers(0, 100, 20000, dtype=np.uint16).tofile('tokens.bin')" ||
  { echo "FAIL: could not write the token file (numpy)"; exit 1; }
TINY="--d-model 32 --d-ff 64 --num-layers 2 --num-heads 4 --vocab-size 100 --context-length 16 --batch-size 8"
TRAIN="--mode train --device cpu --data tokens.bin $TINY --data-order random --lr 3e-3 --log-every 1"
DP="--ddp bucketed --bucket-mb 0.02 --shard-optimizer zero1"
SCHEDULE="--lr-schedule cosine --lr-warmup-steps 2 --min-lr 1e-4 --clip-grad-norm 0.5"
run2() { local name=$1; shift; timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$BIN" "$@" --out "$name" >"$name.log" 2>&1 ||
  fail "np=2 $name: $*"; }

run2 full $TRAIN $DP $SCHEDULE --steps 8 --save full.h5
grep -qE "^step +1/8 .*ms/step, [0-9]+s left$" full.log && grep -qE "^step +8/8 .*ms/step$" full.log ||
  fail "the step lines do not say how long the rest takes (and the last says nothing)"
# The last line's throughput: the global batch's tokens over the mean step with the host's part.
python3 - full.log <<'PY' || fail "the last line's tokens/s is not the batch's tokens over the mean step with the host's part"
import re, sys
m = re.search(r"mean step ([0-9.]+) ms after the first \(([0-9.]+) ms with the host's part\), ([0-9,]+) tokens/s",
              open(sys.argv[1]).read())
device, whole, tokens = float(m[1]), float(m[2]), float(m[3].replace(",", ""))
# whole is printed to 0.1 ms
assert whole >= device and 8 * 16 / ((whole + 0.051) / 1e3) <= tokens <= 8 * 16 / (max(whole - 0.051, 1e-3) / 1e3), \
    (device, whole, tokens)
PY
run2 part $TRAIN $DP $SCHEDULE --steps 5 --lr-decay-steps 8 --save part.h5
# A decay that ends before the run's last step: the steps after it train at --min-lr, said.
timeout 60 "$BIN" $TRAIN --steps 4 --lr-schedule cosine --min-lr 1e-4 --lr-decay-steps 2 --out short_decay \
  >short_decay.log 2>&1 &&
  grep -qF "train: note: the decay ends at step 2 (--lr-decay-steps), so steps 3 to 4 train at --min-lr 0.0001" \
    short_decay.log || fail "a decay that ends before the run's last step is not said"
run2 resumed $TRAIN $DP $SCHEDULE --steps 3 --init part.h5 --save resumed.h5
run2 resumed_bare --mode train --device cpu --data tokens.bin $DP --steps 3 --init part.h5 --save resumed_bare.h5
grep -qF "train: as 'part.h5' was trained: --batch-size 8 --lr 0.003 --lr-schedule cosine --lr-warmup-steps 2 --min-lr 0.0001 --lr-decay-steps 8 --clip-grad-norm 0.5 (an option given here takes its place)" resumed_bare.log ||
  fail "a run given only --init and --steps does not say which of the checkpoint's options it took"
# Options checked once the checkpoint's are in: an end of decay given alone (the checkpoint's
# schedule decays), or the checkpoint's own schedule repeated, which keeps its decay.
run2 resumed_decay --mode train --device cpu --data tokens.bin $DP --steps 3 --init part.h5 --lr-decay-steps 8 \
  --save resumed_decay.h5
run2 resumed_schedule --mode train --device cpu --data tokens.bin $DP --steps 3 --init part.h5 --lr-schedule cosine \
  --save resumed_schedule.h5
# A decay that ended at the checkpoint (full.h5: 8 of 8 steps) is not begun anew unasked.
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 2 --init full.h5 --out ended >ended.log 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "give a later end of decay (--lr-decay-steps 10: this run's last step, decaying anew from --lr 0.003)" ended.log &&
  [ ! -e ended ] || fail "a checkpoint whose decay had ended: exit $rc, or no choice offered, or a results folder"
# The numerics are kept too: a checkpoint trained with flash attention goes on with it.
timeout 60 "$BIN" $TRAIN --steps 2 --attention flash --save flash.h5 --out flash_part >flash_part.log 2>&1 &&
  timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init flash.h5 --out flash_more \
    >flash_more.log 2>&1 && grep -q "train: as 'flash.h5' was trained: .*--attention flash" flash_more.log ||
  fail "a checkpoint trained with --attention flash did not go on with it"
# A checkpoint that keeps no options (from before they were kept): said, and the defaults taken.
cp part.h5 bare.h5 && python3 -c "import h5py; del h5py.File('bare.h5', 'r+')['optimizer'].attrs['options']" &&
  timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init bare.h5 --out bare >bare.log 2>&1 &&
  grep -q "train: 'bare.h5' keeps no training options" bare.log || fail "a checkpoint without options was not said to keep none"
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init part.h5 --lr 1e-3 --out given >given.log 2>&1 &&
  grep -qF "train: --lr 1e-3 as given, not the 0.003 that 'part.h5' was trained with" given.log ||
  fail "an option given over the checkpoint's is not said"
run2 every $TRAIN $DP $SCHEDULE --steps 8 --save-every 3 --save every.h5
run2 accum $TRAIN $DP $SCHEDULE --steps 8 --grad-accum 2 --save accum.h5
# A rank killed after a --save-every checkpoint: every rank file keeps the losses up to it (the
# record is written with each checkpoint), so a run resumed from it loses none of the curve.
LLMHPC_FAULT="rank=1,step=6,action=signal:9" timeout 60 "$MPIEXEC" --oversubscribe -np 2 "$BIN" $TRAIN $DP --steps 8 \
  --save-every 3 --save killed.h5 --out killed >killed.log 2>&1 && fail "a run whose rank was killed exited 0"
python3 - <<'PY' || fail "a rank file lost the losses up to the --save-every checkpoint before the kill"
import h5py
for rank in (0, 1):
    with h5py.File(f"killed/rank{rank:05d}.h5", "r") as f:
        assert f["train"].attrs["status"] == "running" and len(f["train/loss"]) >= 3, (rank, len(f["train/loss"]))
with h5py.File("killed.h5", "r") as f:
    assert int(f["optimizer/step"][()]) == 3, f["optimizer/step"][()]
PY
grep -q "saved every.h5 (every 3 steps; optimizer step 3)" every.log &&
  grep -q "saved every.h5 (every 3 steps; optimizer step 6)" every.log &&
  grep -q "saved every.h5 (the last step; optimizer step 8)" every.log || fail "--save-every's checkpoints are not logged"

# A long run stopped by SIGUSR1, which mpirun forwards to every rank.
wait_for_step() {  # log pid: until the log shows a step
  for _ in $(seq 600); do
    grep -q "^step" "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
"$MPIEXEC" --oversubscribe -np 2 "$BIN" $TRAIN $DP $SCHEDULE --steps 1000000 --save usr1.h5 --out usr1 >usr1.log 2>&1 &
pid=$!
wait_for_step usr1.log $pid || fail "the run to stop did not start"
kill -USR1 $pid
timeout 60 tail --pid=$pid -f /dev/null || fail "SIGUSR1 did not stop the run within 60 s"
wait $pid
rc=$?
[ $rc -ne 0 ] || fail "a run stopped by a signal exited 0"
grep -qE "train: stopped by SIGUSR1 after step .*; go on with --init usr1.h5 --steps [0-9]+; results in" usr1.log ||
  fail "no stop message, or it does not say how to go on"
# The checkpoint keeps where the stopped run's decay ends (its last step), which the next part takes.
run2 usr1_more --mode train --device cpu --data tokens.bin $DP --steps 2 --init usr1.h5 --save usr1_more.h5
grep -q -- "--lr-decay-steps 1000000 " usr1_more.log || fail "the stopped run's end of decay did not go on"

# SIGTERM (Slurm's at the time limit) and SIGINT to one process without mpirun: exit 128 + signal.
for sig in TERM INT; do
  "$BIN" $TRAIN --steps 1000000 --save $sig.h5 --out $sig >$sig.log 2>&1 &
  pid=$!
  wait_for_step $sig.log $pid || fail "the run to stop with SIG$sig did not start"
  kill -$sig $pid
  timeout 60 tail --pid=$pid -f /dev/null || fail "SIG$sig did not stop the run within 60 s"
  wait $pid
  rc=$?
  expected=$((128 + $(kill -l $sig)))
  [ $rc -eq $expected ] || fail "SIG$sig: exit $rc, expected $expected"
done

# --save-every needs --save: refused on every rank before anything runs.
timeout 60 "$MPIEXEC" --oversubscribe -np 2 "$BIN" $TRAIN --steps 4 --save-every 2 --out refused >refused.log 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "save-every needs --save" refused.log && [ ! -e refused ] ||
  fail "--save-every without --save: exit $rc, or no message, or a results folder"

# A decay that ended at or before the checkpoint's step would train the whole run at --min-lr:
# refused before anything runs (part.h5 is at step 5).
timeout 60 "$MPIEXEC" --oversubscribe -np 2 "$BIN" $TRAIN $DP $SCHEDULE --steps 2 --lr-decay-steps 5 --init part.h5 \
  --out decayed >decayed.log 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "the checkpoint is at step 5, so every step of this run would train at --min-lr" decayed.log &&
  [ ! -e decayed ] || fail "a decay that ended before the checkpoint: exit $rc, or no message, or a results folder"

# The model of a checkpoint: --init without shape options takes the checkpoint's; a shape
# option changes that one option (here into a model the checkpoint does not fit: named); other
# heads would make its attention weights another model: refused; another RoPE base is allowed
# (longer contexts are trained so) and said.
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init part.h5 --out own >own.log 2>&1 &&
  grep -q "train: checkpoint (" own.log || fail "--init alone does not train the checkpoint's model"
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init part.h5 --num-layers 3 --out layers \
  >layers.log 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "does not fit the model: /params has no 'layers.2." layers.log ||
  fail "--init with one more layer: exit $rc, or not named"
timeout 60 "$MPIEXEC" --oversubscribe -np 2 "$BIN" $TRAIN --num-heads 8 --steps 1 --init part.h5 --out heads >heads.log 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "'part.h5' was trained with 4 heads; --num-heads 8 would split its attention weights" heads.log &&
  [ ! -e heads ] || fail "--init with other heads: exit $rc, or no message, or a results folder"
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin --steps 1 --init part.h5 --rope-theta 500000 --out rope \
  >rope.log 2>&1 && grep -q "RoPE's base is 500000, not the 10000 that 'part.h5' was trained with" rope.log ||
  fail "--init with another RoPE base: not run, or not said"

# Two runs saving to one path at once, every step: each exits 0 and the file is one of them whole.
for lr in 3e-3 1e-3; do
  timeout 60 "$BIN" --mode train --device cpu --data tokens.bin $TINY --lr $lr --steps 6 --save alone$lr.h5 \
    --out alone$lr >alone$lr.log 2>&1 || fail "the run at lr $lr alone"
done
pids=()
for lr in 3e-3 1e-3; do
  timeout 60 "$BIN" --mode train --device cpu --data tokens.bin $TINY --lr $lr --steps 6 --save-every 1 --save shared.h5 \
    --out shared$lr >shared$lr.log 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait $pid || fail "a run saving to shared.h5 beside another failed"; done
compgen -G "shared.h5.tmp*" >/dev/null && fail "a work file of shared.h5 was left behind"
# A work file whose writer was killed on this host is removed by the next save; a live one's stays.
sleep 0 & dead=$!
wait $dead
: >"kept.h5.tmp.$(hostname).$dead"
: >"kept.h5.tmp.$(hostname).$$"
timeout 60 "$BIN" --mode train --device cpu --data tokens.bin $TINY --steps 1 --save kept.h5 --out stale >stale.log 2>&1 ||
  fail "a save beside stale work files"
[ ! -e "kept.h5.tmp.$(hostname).$dead" ] && [ -e "kept.h5.tmp.$(hostname).$$" ] ||
  fail "the killed writer's work file was not removed, or a live one's was"
rm -f "kept.h5.tmp.$(hostname).$$"

python3 - "$(cd "$(dirname "$0")" && pwd)" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import h5py
import numpy as np
from checks import check, datasets, finish

def train(run, rank=0, dataset="loss"):
    with h5py.File(f"{run}/rank{rank:05d}.h5", "r") as f:
        return dict(f["train"].attrs), f["train/" + dataset][()], f.attrs["status"]

def same(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)

full, part, resumed, every = (datasets(f"{n}.h5") for n in ("full", "part", "resumed", "every"))
check(int(part["optimizer/step"]) == 5 and int(resumed["optimizer/step"]) == 8, "optimizer steps 5, then 8")
check(same(resumed, full), "stopped after 5 steps and resumed for 3: bitwise the checkpoint of 8 straight steps")
check(same(datasets("resumed_bare.h5"), full), "resumed given only --init and --steps: bitwise the same checkpoint")
check(same(datasets("resumed_decay.h5"), full) and same(datasets("resumed_schedule.h5"), full),
      "resumed given --lr-decay-steps alone, or the checkpoint's --lr-schedule: bitwise the same checkpoint")
check(np.array_equal(train("resumed")[1], train("full")[1][5:]), "the resumed run's losses are steps 6-8 of the straight run's")
check(train("resumed")[0]["first_step"] == 6, "the resumed run starts at step 6")
wall, device = train("full", dataset="wall_ms")[1], train("full", dataset="step_ms")[1]
check(len(wall) == 8 and all(wall >= device), f"each step's wall time holds its step time: {wall} {device}")
for dataset in ("lr", "grad_norm"):
    check(np.array_equal(train("resumed", dataset=dataset)[1], train("full", dataset=dataset)[1][5:]),
          f"the resumed run's {dataset} is steps 6-8 of the straight run's")
lr, norm = train("full", dataset="lr")[1], train("full", dataset="grad_norm")[1]
check(lr[1] == 3e-3 and lr[-1] == 1e-4 and all(np.diff(lr[1:]) < 0), f"warm-up to 3e-3, cosine down to 1e-4: {lr}")
check(min(norm) > 0 and np.array_equal(norm, train("full", 1, "grad_norm")[1]), f"the ranks clipped by one norm: {norm}")
check(same(every, full), "--save-every 3 trains bitwise as without it")
shared = datasets("shared.h5")
check(any(same(shared, datasets(f"alone{lr}.h5")) for lr in ("3e-3", "1e-3")),
      "two runs saving to one path left one of their checkpoints whole")
accum = datasets("accum.h5")
loss_err = np.max(np.abs(train("accum")[1] - train("full")[1]) / np.abs(train("full")[1]))
check(loss_err <= 1e-5, f"--grad-accum 2: the losses of one pass, to rounding (max rel err {loss_err:.1e})")
weight_err = max(np.linalg.norm(accum[k] - full[k]) / np.linalg.norm(full[k]) for k in full if k.startswith("params/"))
check(weight_err <= 1e-4, f"--grad-accum 2: the weights of one pass, to rounding (worst tensor rel err {weight_err:.1e})")
check(train("accum")[0]["grad_accum"] == 2 and train("accum")[0]["peak_memory_bytes"] < train("full")[0]["peak_memory_bytes"],
      "--grad-accum 2 is recorded and holds the activations of half the share at a time")

for rank in (0, 1):
    attrs, loss, status = train("usr1", rank)
    check(attrs["status"].startswith(f"interrupted: SIGUSR1 after step {len(loss)} of 1000000"),
          f"usr1 rank {rank}: the train record says where it stopped ({attrs['status']!r}, {len(loss)} losses)")
    check(status.startswith("interrupted: SIGUSR1"), f"usr1 rank {rank}: the file's status ({status!r})")
usr1 = datasets("usr1.h5")
check(int(usr1["optimizer/step"]) == len(train("usr1")[1]), "the checkpoint holds every step the run recorded")
check(train("usr1_more")[0]["first_step"] == len(train("usr1")[1]) + 1, "the stopped run goes on from its checkpoint")
for sig in ("TERM", "INT"):
    attrs, loss, status = train(sig)
    check(attrs["status"] == f"interrupted: SIG{sig} after step {len(loss)} of 1000000" and
          int(datasets(f"{sig}.h5")["optimizer/step"]) == len(loss), f"SIG{sig}: recorded and saved at step {len(loss)}")
finish()
PY
[ $? -eq 0 ] || fail "checks above"
echo PASS

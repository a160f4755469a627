#!/usr/bin/env bash
# Bad input gets a clear message on rank 0 and a non-zero exit within seconds, with one
# rank and under mpirun -np 2 alike: no hang, no crash, no result file left behind.
# Each case: the words the message must contain, then the arguments.
# cli_check.sh before mpi_script.sh moves to the work folder: $0 may be a relative path.
source "$(dirname "$0")/cli_check.sh" || exit 1
source "$(dirname "$0")/mpi_script.sh"

# Inputs: a good token file, one with an id beyond the vocabulary, a text file, an HDF5
# file that is not a checkpoint, and a checkpoint of another shape.
${LLMHPC_PYTHON:-python3} - <<'EOF' || { echo "FAIL: could not write the test inputs (numpy, h5py)"; exit 1; }
import numpy as np, h5py
rng = np.random.default_rng(0)
rng.integers(0, 100, 4000, dtype=np.uint16).tofile("tokens.bin")
bad = rng.integers(0, 100, 4000, dtype=np.uint16); bad[1234] = 60000; bad.tofile("big_ids.bin")
open("notes.txt", "w").write("not a checkpoint\n")
with h5py.File("empty.h5", "w") as f: f.attrs["x"] = 1
with h5py.File("wrong_shape.h5", "w") as f:
    p = f.create_group("params")
    p["token_embeddings.weight"] = np.zeros((100, 32), np.float32)
EOF
TINY="--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 100 --context-length 8"
TRAIN="--mode train --device cpu --data tokens.bin $TINY"

failures=0
check() { cli_check_start "$@"; }  # a few at a time, reported in order (cli_check.sh says why)

for np in 1 2; do
  check $np "unknown mode"              --mode bogus
  check $np "unrecognised option"       --mode bench --no-such-option 3
  check $np "unknown size"              --mode bench --model huge
  check $np "not divisible"             --mode bench --d-model 100 --d-ff 64 --num-layers 1 --num-heads 3
  check $np "--steps must be positive"  --mode bench --model tiny --steps 0
  check $np "--batch-size must be positive" --mode bench --model tiny --batch-size 0
  check $np "--context-length must be positive" --mode bench --model tiny --context-length=-4
  check $np "--warmup must not be negative" --mode bench --model tiny --warmup=-1
  check $np "not an integer"            --mode bench --model tiny --steps ten
  check $np "unknown unit"              --mode bench --model tiny --memory-limit 12XB
  check $np "--gemm-sm-margin must not be negative" --mode bench --model tiny --gemm-sm-margin -1
  check $np "--backend"                 --mode bench --model tiny --backend carrier-pigeon
  check $np "--ddp"                     $TRAIN --ddp hierarchical
  check $np "--device"                  --mode bench --device tpu
  check $np "cannot create"             --mode bench $TINY --steps 1 --warmup 0 --out /proc/llmhpc-no/results
  check $np "needs --data"              --mode train $TINY
  check $np "cannot open"               --mode train --device cpu $TINY --data missing.bin
  check $np "outside the vocabulary"    --mode train --device cpu $TINY --data big_ids.bin
  check $np "is an HDF5 file (a checkpoint or a rank file?), not tokens" --mode train --device cpu $TINY --data wrong_shape.h5
  check $np "not an HDF5 file"          $TRAIN --init notes.txt
  check $np "not a checkpoint"          $TRAIN --init empty.h5
  check $np "--save needs a file name"  $TRAIN --save ""
  check $np "is a rank file of this run's --out" $TRAIN --out "$WORK/out$np" --save "$WORK/out$np/rank0000$((np - 1)).h5"
  check $np "--init needs a file name"  $TRAIN --init ""
  check $np "does not fit the model"    $TRAIN --init wrong_shape.h5
  check $np "lists sweep in modes bench" $TRAIN --batch-size 2,4
  check $np "--bucket-mb '0': must be a number of MiB greater than 0" $TRAIN --bucket-mb 0
  check $np "--bucket-mb 'abc': not a number" $TRAIN --bucket-mb abc
  check $np "--shard-optimizer 'bogus': must be one of none, broadcast, zero1" $TRAIN --shard-optimizer bogus
  check $np "--shard-optimizer zero1 needs the gradients reduced" $TRAIN --shard-optimizer zero1 --ddp none
  check $np "--shard-optimizer broadcast needs the gradients reduced" $TRAIN --shard-optimizer broadcast --ddp none
  check $np "takes one value for --shard-optimizer" $TRAIN --shard-optimizer none,zero1
  check $np "--shard-optimizer 'zero4': must be one of" --mode ddp --device cpu $TINY --shard-optimizer none,zero4
  check $np "--shard-optimizer zero1 needs the gradients reduced" --mode ddp --device cpu $TINY --ddp none \
    --shard-optimizer zero1
  if nvidia-smi -L >/dev/null 2>&1; then
    echo "skip (np=$np): --device cuda without a GPU (this machine has one)"
  else
    check $np "--device cuda"           --mode bench $TINY --device cuda
  fi
done

# Data parallelism: the global batch is shared equally; --ddp none on several ranks would
# train independent copies.
check 2 "must divide by the 2 data-parallel ranks"  $TRAIN --batch-size 3
check 3 "must divide by the 3 data-parallel ranks"  $TRAIN --batch-size 4 --ddp naive
check 2 "independent copies"          $TRAIN --ddp none

# A size too small for one collective of a list is refused before the others are measured.
check 3 "holds no float element per rank for reducescatter on 3 ranks" --mode comm --device cpu \
  --collective allreduce,reducescatter --size 4B --warmup 0 --steps 1

# Existing results are never overwritten.
mkdir -p "$WORK/taken" && touch "$WORK/taken/rank00000.h5"
check 1 "already holds results" --mode bench $TINY --steps 1 --warmup 0 --out "$WORK/taken"
cli_check_finish

# Every rank takes the same options and reads the same tokens: an MPMD launch that gives a rank
# other options, or ranks whose working directories hold token files of other lengths (each
# node its own copy), is refused on every rank.
mkdir -p long short && cp tokens.bin long/ &&
  python3 -c "import numpy as np; np.random.default_rng(1).integers(0, 100, 400, dtype=np.uint16).tofile('short/tokens.bin')"
mpmd() {  # words, rank 0's launcher options and arguments, rank 1's (a string each)
  timeout 60 "$MPIEXEC" --oversubscribe -np 1 $2 --out "$WORK/mpmd" : -np 1 $3 --out "$WORK/mpmd" \
    </dev/null >"$WORK/stdout" 2>"$WORK/stderr"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$1" "$WORK/stderr" || [ -e "$WORK/mpmd" ]; then
    echo "FAIL (mpmd): $2 : $3 -> exit $rc"; head -5 "$WORK/stderr"; failures=$((failures + 1))
  else
    echo "ok   (mpmd, rc=2): $(grep -m1 -F -- "$1" "$WORK/stderr" | cut -c1-110)"
  fi
}
# The rank that found the error is named with its host (rank 0's own errors name neither).
mpmd "error (rank 1 on $(hostname)): rank 1 was started with" "$BIN --mode bench --device cpu $TINY --steps 1" \
  "$BIN --mode bench --device cpu $TINY --steps 3"
mpmd "the ranks read files of 400 to 4000 tokens" "--wdir $WORK/long $BIN $TRAIN --steps 1" \
  "--wdir $WORK/short $BIN $TRAIN --steps 1"

# A loss that stops being finite is the same on every rank: all stop together with exit code 2,
# one message, and rank files that say why (kept: they hold the steps before it).
for np in 1 2; do
  out="$WORK/nan_$np"
  cmd=("$BIN" $TRAIN --steps 3 --lr 1e30 --out "$out")
  [ $np -gt 1 ] && cmd=("$MPIEXEC" --oversubscribe -np $np "${cmd[@]}")
  timeout 60 "${cmd[@]}" </dev/null >"$WORK/stdout" 2>"$WORK/stderr"
  rc=$?
  said=$(grep -c 'llmhpc: error: the loss became' "$WORK/stderr")
  if [ $rc -ne 2 ] || [ "$said" -ne 1 ] || ! python3 -c "import h5py, sys
sys.exit(not all(h5py.File(f'$out/rank{r:05d}.h5', 'r').attrs['status'].startswith('error: the loss became')
                 for r in range($np)))"; then
    echo "FAIL (np=$np): --lr 1e30 -> exit $rc, the message $said time(s)"; head -5 "$WORK/stderr"
    failures=$((failures + 1))
  else
    echo "ok   (np=$np, rc=2): --lr 1e30 -> $(grep -m1 'loss became' "$WORK/stderr" | cut -c1-100)"
  fi
done

if [ $failures -gt 0 ]; then echo "$failures case(s) failed"; exit 1; fi
echo "all bad inputs handled"

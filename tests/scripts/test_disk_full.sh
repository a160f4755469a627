#!/usr/bin/env bash
# A disk that fills up during a run: the error names the file and the system's reason, exit code
# 5 (a write the system refused), what was recorded before stays readable, and no half-written
# working copy is left beside it.
#  - bench with --out on a full file system: exit 5 naming the rank file, which holds the
#    configurations finished before, no rank00000.h5.tmp;
#  - train --save onto it, on 1 rank and (with --save-every) on 2: one line from rank 0 naming
#    --save, the reason and the size needed, exit 5 on every rank with no abort, no checkpoint
#    file left, and every rank file saying "error: --save ..." (root and /train) with the losses
#    of the steps done.
# The full file system is a 64 KiB tmpfs in a mount namespace of the test's own (unshare -m), so
# needs root and util-linux; otherwise skipped (exit 77). There the copy of a file fails first;
# an HDF5 write that fails half way is made by a file size limit (ulimit -f: a write past it
# fails with "File too large"), which a copy of a file under it never reaches:
#  - bench past the limit: exit 5, the error names the rank file, its working copy and the
#    reason; the rank file keeps the configurations finished before, and no working copy is left;
#  - train --save past it: the same for the checkpoint, whose working file is gone too.
# The limit is set in the rank alone (mpirun -np 1 bash -c 'ulimit -f ...; exec llmhpc'): MPI's
# own start-up writes files larger than it.
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}")  # absolute: the test runs in folders of its own
PYTHON=${LLMHPC_PYTHON:-python3}
export OMP_NUM_THREADS=1
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to mount a small tmpfs"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: needs unshare (util-linux)"; exit 77; }
unshare -m true 2>/dev/null || { echo "SKIP: unshare -m is not allowed here"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
"$PYTHON" -c "import numpy as np; np.random.default_rng(0).integers(0, 100, 4000, dtype=np.uint16).tofile('tokens.bin')"
SHAPE="--device cpu --d-model 64 --d-ff 128 --num-layers 2 --num-heads 4"
mkdir full
# Inside the namespace: the tmpfs on ./full, the two runs, their exit codes into files outside it.
unshare -m bash -c "
  mount -t tmpfs -o size=64k tmpfs full || exit 1
  timeout 60 '$BIN' --mode bench $SHAPE --context-length 16,32,64 --steps 1 --warmup 0 --out full/b >bench.log 2>&1
  echo \$? >bench.rc
  ls -A full/b >bench.files
  cp full/b/rank00000.h5 bench.h5 2>/dev/null
  rm -rf full/b
  timeout 60 '$BIN' --mode train $SHAPE --vocab-size 100 --context-length 8 --steps 2 --data tokens.bin --out train \
    --save full/ckpt.h5 >train.log 2>&1
  echo \$? >train.rc
  ls -A full >train.files
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 '${MPIEXEC:-mpirun}' --oversubscribe -np 2 \
    '$BIN' --mode train $SHAPE --vocab-size 100 --context-length 8 --steps 3 --data tokens.bin --out train2 \
    --save full/ckpt.h5 --save-every 1 </dev/null >train2.log 2>&1
  echo \$? >train2.rc
  ls -A full >train2.files" || { echo "FAIL: could not mount a tmpfs in a mount namespace"; exit 1; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
[ "$(cat bench.rc)" = 5 ] || fail "bench on a full disk: exit $(cat bench.rc), not 5; $(tail -3 bench.log)"
grep -q "llmhpc: error: the rank file 'full/b/rank00000.h5' could not be written: no space left on device" bench.log ||
  fail "bench on a full disk: no error naming the rank file: $(tail -3 bench.log)"
[ "$(cat bench.files)" = rank00000.h5 ] || fail "bench on a full disk left '$(tr '\n' ' ' <bench.files)', not the rank file alone"
finished() {  # finished FILE WHAT: FILE holds bench configurations that ended ok; prints "ok   WHAT" with their count
  "$PYTHON" - "$1" "$2" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    ok = [n for n, g in f["bench"].items() if g.attrs["status"] == "ok"]
    assert ok, "no finished configuration kept: " + str(list(f["bench"]))
    print(f"ok   {sys.argv[2]}".replace("N finished", f"{len(ok)} finished"))
PY
}
finished bench.h5 "bench on a full disk: exit 5, N finished configuration(s) kept readable, no working copy left" ||
  fail "bench on a full disk: the rank file does not hold the configurations finished before"
# save_failed NAME RANKS STEPS: NAME.log has one error line, from rank 0, naming --save, the reason
# and the size; exit 5; no file left on the full disk; every rank file says so, the losses kept.
save_failed() {
  local name=$1 ranks=$2 steps=$3
  [ "$(cat $name.rc)" = 5 ] || fail "$name --save on a full disk: exit $(cat $name.rc), not 5; $(tail -3 $name.log)"
  local errors
  errors=$(grep -c "llmhpc: error" $name.log)
  [ "$errors" = 1 ] && grep -q "^llmhpc: error: --save 'full/ckpt.h5': no space left on device writing the checkpoint ([0-9.]* MB needed, [0-9.]* MB free there)" $name.log ||
    fail "$name --save on a full disk: not one line naming --save, the reason and the size: $(grep -v '^step' $name.log | tail -6)"
  grep -q "MPI_ABORT\|fatal error" $name.log && fail "$name --save on a full disk: aborted: $(grep -m3 'MPI_ABORT\|fatal' $name.log)"
  [ -s $name.files ] && fail "$name --save on a full disk left '$(tr '\n' ' ' <$name.files)' there"
  "$PYTHON" - "$name" "$ranks" "$steps" <<'PY' || fail "$name --save on a full disk: the rank files do not say so"
import sys, h5py
name, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for rank in range(ranks):
    with h5py.File(f"{name}/rank{rank:05d}.h5", "r") as f:
        for where, status in (("root", f.attrs["status"]), ("/train", f["train"].attrs["status"])):
            assert status.startswith("error: --save 'full/ckpt.h5': no space left on device"), (rank, where, status)
        assert len(f["train/loss"]) == steps, (rank, len(f["train/loss"]))
PY
  echo "ok   $name --save on a full disk ($ranks rank(s)): exit 5, \"$(grep -m1 -o "no space left[^)]*)" $name.log)\", the rank files say so, $steps step(s) kept"
}
save_failed train 1 2
save_failed train2 2 1

# An HDF5 write that fails half way: a file size limit on the rank (SIGXFSZ ignored, so the
# write returns EFBIG), 40 KiB for bench's rank file, 200 KiB for train's checkpoint.
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
limited() {  # limited KIB LOG ARGS...: llmhpc ARGS under mpirun -np 1 with files limited to KIB; its exit code
  local kib=$1 log=$2
  shift 2
  timeout 60 "$MPIEXEC" -np 1 bash -c "trap '' XFSZ; ulimit -f $kib; exec \"\$@\"" llmhpc "$BIN" "$@" </dev/null >"$log" 2>&1
}
limited 40 limit_bench.log --mode bench $SHAPE --context-length 16,32,64,128 --steps 1 --warmup 0 --out limited
rc=$?
[ $rc = 5 ] || fail "bench past a file size limit: exit $rc, not 5; $(tail -3 limit_bench.log)"
grep -q "llmhpc: error: the rank file 'limited/rank00000.h5' could not be written: file too large (at limited/rank00000.h5.tmp)" limit_bench.log ||
  fail "bench past a file size limit: the error does not name the rank file, its working copy and 'file too large': $(tail -3 limit_bench.log)"
[ "$(ls -A limited)" = rank00000.h5 ] || fail "bench past a file size limit left '$(ls -A limited | tr '\n' ' ')', not the rank file alone"
finished limited/rank00000.h5 \
  "bench past a file size limit: exit 5 naming the working copy, N finished configuration(s) kept, no working copy left" ||
  fail "bench past a file size limit: the rank file does not hold the configurations finished before"
limited 200 limit_train.log --mode train $SHAPE --vocab-size 100 --context-length 8 --steps 2 --data tokens.bin \
  --out limited_train --save limited_ckpt.h5
rc=$?
[ $rc = 5 ] || fail "train --save past a file size limit: exit $rc, not 5; $(tail -3 limit_train.log)"
grep -q "llmhpc: error: --save 'limited_ckpt.h5': file too large writing the checkpoint" limit_train.log ||
  fail "train --save past a file size limit: the error does not name --save and 'file too large': $(tail -3 limit_train.log)"
left=$(ls -A | grep "^limited_ckpt")
[ -z "$left" ] && echo "ok   train --save past a file size limit: exit 5 naming --save, no file left" ||
  fail "train --save past a file size limit left '$left'"
[ $failures = 0 ] && echo PASS || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# A disk that fills up during a run: the error names the file and the system's reason, what was
# recorded before stays readable, and no half-written working copy is left beside it.
#  - bench with --out on a full file system: exit 2 with "cannot ...", the rank file holding the
#    configurations finished before, no rank00000.h5.tmp;
#  - train --save onto it: the fatal error (exit 3, the job aborted: the other ranks wait for the
#    write) says "No space left on device" and names the checkpoint's working file.
# The full file system is a 64 KiB tmpfs in a mount namespace of the test's own (unshare -m), so
# needs root and util-linux; otherwise skipped (exit 77). There the copy of a file fails first;
# an HDF5 write that fails half way is made by a file size limit (ulimit -f: a write past it
# fails with "File too large"), which a copy of a file under it never reaches:
#  - bench past the limit: the fatal error (exit 3) names the rank file's working copy and the
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
  echo \$? >train.rc" || { echo "FAIL: could not mount a tmpfs in a mount namespace"; exit 1; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
[ "$(cat bench.rc)" = 2 ] || fail "bench on a full disk: exit $(cat bench.rc), not 2; $(tail -3 bench.log)"
grep -q "llmhpc: error: cannot .*rank00000.h5" bench.log || fail "bench on a full disk: no error naming the rank file: $(tail -3 bench.log)"
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
finished bench.h5 "bench on a full disk: exit 2, N finished configuration(s) kept readable, no working copy left" ||
  fail "bench on a full disk: the rank file does not hold the configurations finished before"
[ "$(cat train.rc)" = 3 ] || fail "train --save on a full disk: exit $(cat train.rc), not 3; $(tail -3 train.log)"
grep -q "filename = 'full/ckpt.h5.tmp.*error message = 'No space left on device'" train.log &&
  echo "ok   train --save on a full disk: $(grep -m1 -o "HDF5 call failed: .*" train.log)" ||
  fail "train --save on a full disk: the error does not name the file and 'No space left on device': $(tail -4 train.log)"

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
[ $rc = 3 ] || fail "bench past a file size limit: exit $rc, not 3; $(tail -3 limit_bench.log)"
grep -q "filename = 'limited/rank00000.h5.tmp'.*'File too large'" limit_bench.log ||
  fail "bench past a file size limit: the error does not name the working copy and 'File too large': $(grep -A3 fatal limit_bench.log)"
[ "$(ls -A limited)" = rank00000.h5 ] || fail "bench past a file size limit left '$(ls -A limited | tr '\n' ' ')', not the rank file alone"
finished limited/rank00000.h5 \
  "bench past a file size limit: exit 3 naming the working copy, N finished configuration(s) kept, no working copy left" ||
  fail "bench past a file size limit: the rank file does not hold the configurations finished before"
limited 200 limit_train.log --mode train $SHAPE --vocab-size 100 --context-length 8 --steps 2 --data tokens.bin \
  --out limited_train --save limited_ckpt.h5
rc=$?
[ $rc = 3 ] || fail "train --save past a file size limit: exit $rc, not 3; $(tail -3 limit_train.log)"
grep -q "filename = 'limited_ckpt.h5.tmp\..*'File too large'" limit_train.log ||
  fail "train --save past a file size limit: the error does not name the checkpoint's working file: $(grep -A3 fatal limit_train.log)"
left=$(ls -A | grep "^limited_ckpt")
[ -z "$left" ] && echo "ok   train --save past a file size limit: exit 3 naming the working file, none left" ||
  fail "train --save past a file size limit left '$left'"
[ $failures = 0 ] && echo PASS || { echo "$failures failure(s)"; exit 1; }

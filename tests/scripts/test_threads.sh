#!/usr/bin/env bash
# CPU threads per rank follow the CPUs a rank may run on: a rank that mpirun bound to one core
# (Open MPI's default for 1 or 2 ranks) takes one thread, not one per core of the host taking
# turns on that core; unbound, the node's CPUs are shared among its ranks. Read back from the
# rank files' environment attributes (cpus_allowed, cpu_threads).
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}")  # absolute: the test runs in folders of its own
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS  # what the default is about
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CPUS=$(nproc)
TINY="--mode bench --device cpu --d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 64 --context-length 8 --steps 1 --warmup 0"
failures=0
# expect NAME "launch prefix" ranks allowed threads
expect() {
  local name=$1 launch=$2 np=$3 allowed=$4 threads=$5
  # shellcheck disable=SC2086
  if ! timeout 60 $launch -np "$np" "$BIN" $TINY --out "$WORK/$name" >"$WORK/$name.log" 2>&1; then
    echo "FAIL $name: llmhpc failed"; sed 's/^/    /' "$WORK/$name.log" | tail -5; failures=$((failures + 1)); return
  fi
  local got
  got=$("${LLMHPC_PYTHON:-python3}" - "$WORK/$name" "$np" <<'PY'
import sys, h5py
print(" ".join(f"{int(h5py.File(f'{sys.argv[1]}/rank{r:05d}.h5', 'r').attrs[k])}"
               for r in range(int(sys.argv[2])) for k in ("cpus_allowed", "cpu_threads")))
PY
)
  local want=""
  for _ in $(seq "$np"); do want+="$allowed $threads "; done
  if [ "$got" = "${want% }" ]; then echo "ok   $name: cpus_allowed, cpu_threads per rank = $got"
  else echo "FAIL $name: cpus_allowed, cpu_threads per rank = '$got', expected '${want% }'"; failures=$((failures + 1)); fi
}
expect unbound-1 "$MPIEXEC --bind-to none" 1 "$CPUS" "$CPUS"
expect bound-1 "$MPIEXEC --bind-to core" 1 1 1
if [ "$CPUS" -ge 2 ]; then
  expect unbound-2 "$MPIEXEC --bind-to none" 2 "$CPUS" $((CPUS / 2))
  expect bound-2 "$MPIEXEC --bind-to core" 2 1 1
fi
# The note rank 0 prints where a binding leaves it a quarter of its share or less.
if [ "$CPUS" -ge 4 ]; then
  if grep -q "launch with mpirun --bind-to none" "$WORK/bound-1.log"; then echo "ok   bound-1 printed the note"
  else echo "FAIL bound-1: no note on the binding"; failures=$((failures + 1)); fi
else
  echo "skip the binding note: a quarter of the share needs 4 CPUs or more (here $CPUS)"
fi
if grep -q "note:" "$WORK/unbound-1.log"; then echo "FAIL unbound-1 printed a note"; failures=$((failures + 1)); fi
[ "$failures" -eq 0 ] && echo "test_threads: all passed" || { echo "test_threads: $failures failure(s)"; exit 1; }

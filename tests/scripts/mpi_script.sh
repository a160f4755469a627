# Sourced by the script tests that run llmhpc under mpirun (after their header comment):
# BIN and MPIEXEC from the environment ctest sets, a work folder made the current directory
# and removed at exit (background jobs left running killed), and the two checks they share:
#   run NP ARGS...              llmhpc must succeed (else the test stops with its log)
#   refused NP MESSAGE ARGS...  llmhpc must fail with a usage error (exit code 2), saying MESSAGE
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}")  # absolute: the test runs in folders of its own
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

run() {
  local np=$1; shift
  if ! timeout 120 "$MPIEXEC" --oversubscribe -np "$np" "$BIN" "$@" >"$WORK/log" 2>&1; then
    echo "FAIL: np=$np $*"; tail -20 "$WORK/log"; exit 1
  fi
}

refused() {
  local np=$1 message=$2 rc=0; shift 2
  timeout 60 "$MPIEXEC" --oversubscribe -np "$np" "$BIN" "$@" >"$WORK/log" 2>&1 || rc=$?
  if [ $rc = 0 ]; then
    echo "FAIL: accepted: $*"; exit 1
  fi
  # Not a hang (124), the watchdog (4), a fatal error (3) or a signal: a usage error.
  if [ $rc != 2 ]; then
    echo "FAIL: np=$np $* ended with exit code $rc, not a usage error's 2:"; tail -5 "$WORK/log"; exit 1
  fi
  if ! grep -q -- "$message" "$WORK/log"; then
    echo "FAIL: np=$np $* did not say '$message':"; tail -5 "$WORK/log"; exit 1
  fi
}

#!/usr/bin/env bash
# A fatal error on one rank ends the whole job quickly with a message naming the rank, the
# host, the file:line and the failing call, while the other ranks wait in a collective.
set -u
TOOL=${LLMHPC_FAIL_TOOL:?set LLMHPC_FAIL_TOOL}
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
err=$(mktemp)
trap 'rm -f "$err"' EXIT
timeout 60 "$MPIEXEC" --oversubscribe -np 3 "$TOOL" 2>"$err" >/dev/null
rc=$?
cat "$err" | head -8
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -ne 124 ] || fail "the job hung (timeout)"
[ $rc -ne 0 ] || fail "exit code 0 after a fatal error"
grep -q "fatal error on rank 2 (host $(hostname)" "$err" || fail "no rank/host in the message"
grep -q "fail_on_one_rank.cpp:[0-9]" "$err" || fail "no file:line"
grep -q "failing call: bytes_free > 0" "$err" || fail "the failing call is not named"
grep -q "the planted failure" "$err" || fail "the explanation is missing"
echo "fatal path ok (exit code $rc)"

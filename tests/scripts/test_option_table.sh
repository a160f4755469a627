#!/usr/bin/env bash
# Every bad input of the tables tests/cli_cases/*.cases gets a clear message on rank 0 and a
# non-zero exit within seconds, with one rank and under mpirun -np 2 alike: no hang, no crash,
# the message printed once, no result file left behind. Each mode's cases are a file of their
# own, so a new mode adds its file and nothing else.
set -u
BIN=${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 100, 4000, dtype=np.uint16).tofile('tokens.bin')"
TINY="--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 100 --context-length 8 --warmup 0"
TINY_TRAIN="--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 100 --context-length 8"

source "$(dirname "$0")/cli_check.sh"
failures=0 cases=0
for table in "$ROOT"/tests/cli_cases/*.cases; do
  while IFS= read -r line; do
    [[ -z "${line// }" || "$line" == \#* ]] && continue
    words=${line%% | *}
    args=${line#* | }
    # train has no --warmup: its cases use the shape alone.
    [[ "$args" == *"--mode train"* ]] && args=${args//\$TINY/$TINY_TRAIN} || args=${args//\$TINY/$TINY}
    read -r -a argv <<<"$args"
    for np in 1 2; do
      cases=$((cases + 1))
      cli_check "$np" "$words" "${argv[@]}"
    done
  done <"$table"
done
[ $cases -gt 0 ] || { echo "FAIL: no cases in $ROOT/tests/cli_cases"; exit 1; }
if [ $failures -gt 0 ]; then echo "$failures of $cases run(s) failed"; exit 1; fi
echo "all $cases bad inputs handled"

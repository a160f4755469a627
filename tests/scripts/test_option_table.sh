#!/usr/bin/env bash
# Every bad input of the tables tests/cli_cases/*.cases gets a clear message on rank 0 and a
# non-zero exit within seconds, with one rank and under mpirun -np 2 alike: no hang, no crash,
# the message printed once, no result file left behind. Each mode's cases are a file of their
# own, so a new mode adds its file and nothing else. Then options given twice, where the last
# one wins: a run that must succeed and record the last values.
set -u
BIN=$(realpath -m "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
source "$(dirname "$0")/cli_check.sh" || exit 1  # before the cd: $0 may be a relative path
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$WORK"
${LLMHPC_PYTHON:-python3} -c "import numpy as np; np.random.default_rng(0).integers(0, 100, 4000, dtype=np.uint16).tofile('tokens.bin')" ||
  { echo "FAIL: could not write the token file (numpy)"; exit 1; }
echo "not a checkpoint" >notes.txt
# A trace someone kept, under the names --trace=notes.json writes on one rank and on two.
for f in notes.json notes_rank00000.json notes_rank00001.json; do echo "[]" >"$f"; done
TINY="--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 100 --context-length 8 --warmup 0"
TINY_TRAIN="--d-model 16 --d-ff 32 --num-layers 1 --num-heads 2 --vocab-size 100 --context-length 8"

failures=0 cases=0
# The cases run a few at a time (cli_check_start: most of a case's time is waiting on MPI, and
# one after another they took 4 minutes); their reports come in the order of the tables.
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
      cli_check_start "$np" "$words" "${argv[@]}"
    done
  done <"$table"
done
cli_check_finish
[ $cases -gt 0 ] || { echo "FAIL: no cases in $ROOT/tests/cli_cases"; exit 1; }
# An option given twice: the last one wins, as getopt and argparse have it, so that a job's
# EXTRA_ARGS override what the job passes. These run, one rank and two alike: a second --mode
# (bench over train), a general option (--device cuda, then cpu), a mode's (--steps 1, then 2) and
# a list option, whose last list replaces the earlier one (--context-length 8,16, then 16).
for np in 1 2; do
  cmd=("$BIN" --mode train --mode bench $TINY --device cuda --device cpu --steps 1 --context-length 8,16 --steps 2
       --context-length 16 --out "$WORK/last$np")
  [ "$np" -gt 1 ] && cmd=("$MPIEXEC" --oversubscribe -np "$np" "${cmd[@]}")
  cases=$((cases + 1))
  if ! timeout 120 "${cmd[@]}" </dev/null >"$WORK/last.log" 2>&1; then
    echo "FAIL (np=$np): ${cmd[*]} -> exit non-zero"; tail -5 "$WORK/last.log" | sed 's/^/    /'; failures=$((failures + 1))
  elif ! python3 - "$WORK/last$np" "$np" <<'EOF'; then
import json, sys
import h5py
out, np_ = sys.argv[1], int(sys.argv[2])
for r in range(np_):
    with h5py.File(f"{out}/rank{r:05d}.h5") as f:
        assert f.attrs["mode"] == "bench" and f.attrs["status"] == "complete", dict(f.attrs)
        recs = list(f["bench"].values())
        got = [(int(g.attrs["context_length"]), int(g.attrs["steps"]), len(g["step_ms"])) for g in recs]
        assert got == [(16, 2, 2)], f"rank {r}: (context, steps, timed steps) {got}, expected [(16, 2, 2)]"
        config = json.loads(f.attrs["config_json"])
        assert (config["device"], config["steps"]) == ("cpu", 2), f"rank {r}: configuration {config}"
EOF
    echo "FAIL (np=$np): the last of each option given twice did not win"; failures=$((failures + 1))
  else
    echo "ok   (np=$np): --mode train --mode bench --device cuda --device cpu --steps 1 --steps 2 --context-length 8,16 --context-length 16: bench, cpu, 2 steps at 16"
  fi
done
# --version: the commit and the libraries, once, exit 0, no results folder.
cases=$((cases + 1))
if (cd "$WORK" && timeout 60 "$MPIEXEC" --oversubscribe -np 2 "$BIN" --version >version.log 2>&1) &&
  [ "$(grep -c "^llmhpc " "$WORK/version.log")" -eq 1 ] && grep -q "^hdf5_version [0-9]" "$WORK/version.log" &&
  [ ! -e "$WORK/results" ]; then
  echo "ok   (np=2): --version: $(head -1 "$WORK/version.log")"
else
  echo "FAIL (np=2): --version"; sed 's/^/    /' "$WORK/version.log"; failures=$((failures + 1))
fi
if [ $failures -gt 0 ]; then echo "$failures of $cases run(s) failed"; exit 1; fi
echo "all $cases bad inputs handled"

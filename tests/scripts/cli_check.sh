# Sourced by the CLI tests (test_cli_errors.sh, test_option_table.sh): one bad input, run with
# NP ranks, must end within seconds with a usage error on rank 0 (exit code 2, not a crash, a
# hang or a fatal error) that contains WORDS, printed once, leaving no result file.
# Needs BIN, MPIEXEC and WORK; counts failures in $failures.
#   cli_check NP "expected words" args...
# Each check keeps its output, its --out folder and its logs in a folder of its own under $WORK,
# so that checks can run at the same time (the current directory, with the input files the
# arguments name, stays the caller's).
cli_check() {
  local np=$1 words=$2; shift 2
  local dir; dir=$(mktemp -d "$WORK/check.XXXXXX")
  local out="$dir/out"
  local cmd=("$BIN" "$@" --out "$out")
  [[ " $* " == *" --out "* ]] && cmd=("$BIN" "$@")
  [ "$np" -gt 1 ] && cmd=("$MPIEXEC" --oversubscribe -np "$np" "${cmd[@]}")
  local start=$SECONDS
  # Open MPI's temporary files in the check's folder: checks run a few at a time, and Open MPI
  # 4.1 fails when two mpiruns create the shared one at once (tests/CMakeLists.txt).
  # (</dev/null: mpirun would read the caller's stdin)
  OMPI_MCA_orte_tmpdir_base=$dir/mpi timeout 60 "${cmd[@]}" </dev/null >"$dir/stdout" 2>"$dir/stderr"
  local rc=$? took=$((SECONDS - start))
  local why=""
  if [ $rc -eq 0 ]; then why="exit code 0";
  elif [ $rc -eq 124 ]; then why="hung (timeout)";
  elif [ $rc -ge 128 ]; then why="killed by signal $((rc - 128))";
  elif [ $rc -eq 3 ]; then why="a fatal error instead of a usage error";
  elif [ $rc -ne 2 ]; then why="exit code $rc, not a usage error's 2";
  elif [ $took -gt 20 ]; then why="took ${took}s";
  elif ! grep -qiF -- "$words" "$dir/stderr"; then why="message lacks '$words'";
  elif [ "$(grep -c 'llmhpc: error' "$dir/stderr")" -gt 1 ]; then why="message printed more than once";
  elif [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then why="left files in $out";
  fi
  if [ -n "$why" ]; then
    echo "FAIL (np=$np): $* -> $why"; sed 's/^/    /' "$dir/stderr" | head -5; failures=$((failures + 1))
  else
    echo "ok   (np=$np, rc=$rc): $* -> $(grep -m1 -iF -- "$words" "$dir/stderr" | cut -c1-110)"
  fi
}

# Open MPI's mpirun waits twice odls_base_sigkill_timeout (1 s by default) after ranks exit
# non-zero, before it ends the job, even when every rank has exited by itself: a bad input under
# mpirun -np 2 took 2.4 s against 0.4 s with one rank. These checks are of such exits, so it
# waits none: 0.4 s either way, nearly all of it MPI's start-up. (On one host rank 0's message
# came through in every one of thousands of checks; jobs/scaling.sh, whose check also runs
# across nodes under sbatch, keeps the default.)
export OMPI_MCA_odls_base_sigkill_timeout=0
# One after another, the 249 runs of test_option_table.sh took minutes of a 2-core machine, so
# the tests run their checks a few at a time, $CLI_CHECK_JOBS (default 3), each one's report in a
# file of its own, and print the reports in the order the checks were started:
#   cli_check_start NP "expected words" args...   cli_check in the background
#   cli_check_finish                             wait for the checks started, print their
#                                                reports, add their failures to $failures
CLI_CHECK_JOBS=${CLI_CHECK_JOBS:-3}
cli_checks_started=0 cli_checks_reported=0
cli_check_start() {
  while [ "$(jobs -rp | wc -l)" -ge "$CLI_CHECK_JOBS" ]; do wait -n; done
  local report="$WORK/report.$cli_checks_started"
  cli_checks_started=$((cli_checks_started + 1))
  (failures=0; cli_check "$@" && echo "$failures" >"$report.failures") </dev/null >"$report" 2>&1 &
}
cli_check_finish() {
  wait
  local i report
  for ((i = cli_checks_reported; i < cli_checks_started; i++)); do
    report="$WORK/report.$i"
    cat "$report"
    if [ -s "$report.failures" ]; then
      failures=$((failures + $(<"$report.failures")))
    else  # the check did not run to its end (killed, or not found): it counts as failed
      echo "FAIL: check $((i + 1)) ended without a result"; failures=$((failures + 1))
    fi
  done
  cli_checks_reported=$cli_checks_started
}

# Sourced by the CLI tests (test_cli_errors.sh, test_option_table.sh): one bad input, run with
# NP ranks, must end within seconds with a usage error on rank 0 (exit code 2, not a crash, a
# hang or a fatal error) that contains WORDS, printed once, leaving no result file.
# Needs BIN, MPIEXEC and WORK; counts failures in $failures.
#   cli_check NP "expected words" args...
cli_check() {
  local np=$1 words=$2; shift 2
  local out="$WORK/out_$RANDOM"
  local cmd=("$BIN" "$@" --out "$out")
  [[ " $* " == *" --out "* ]] && cmd=("$BIN" "$@")
  [ "$np" -gt 1 ] && cmd=("$MPIEXEC" --oversubscribe -np "$np" "${cmd[@]}")
  local start=$SECONDS
  timeout 60 "${cmd[@]}" </dev/null >"$WORK/stdout" 2>"$WORK/stderr"  # mpirun would read the caller's stdin
  local rc=$? took=$((SECONDS - start))
  local why=""
  if [ $rc -eq 0 ]; then why="exit code 0";
  elif [ $rc -eq 124 ]; then why="hung (timeout)";
  elif [ $rc -ge 128 ]; then why="killed by signal $((rc - 128))";
  elif [ $rc -eq 3 ]; then why="a fatal error instead of a usage error";
  elif [ $took -gt 20 ]; then why="took ${took}s";
  elif ! grep -qiF -- "$words" "$WORK/stderr"; then why="message lacks '$words'";
  elif [ "$(grep -c 'llmhpc: error' "$WORK/stderr")" -gt 1 ]; then why="message printed more than once";
  elif [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then why="left files in $out";
  fi
  if [ -n "$why" ]; then
    echo "FAIL (np=$np): $* -> $why"; sed 's/^/    /' "$WORK/stderr" | head -5; failures=$((failures + 1))
  else
    echo "ok   (np=$np, rc=$rc): $* -> $(grep -m1 -iF -- "$words" "$WORK/stderr" | cut -c1-110)"
  fi
}

# leftovers TAG: ranks of a faulted run (launched with LLMHPC_FAULT_RUN=TAG in their environment)
# still there after its launcher returned, such as a stopped one nothing killed, are reported
# through the caller's `fail` and killed by their pids: they would hold their core or GPU.
# Sourced by tests/scripts/test_fault_injection.sh and scripts/gpu/reliability_check.sh.
leftovers() {
  local pid pids=() try
  for try in 1 2 3 4 5 6 7 8 9 10; do  # the launcher's last kills may land after it returned
    pids=()
    for pid in $(pgrep -x llmhpc 2>/dev/null); do
      { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "LLMHPC_FAULT_RUN=$1" && pids+=("$pid")
    done
    [ ${#pids[@]} -eq 0 ] && return
    sleep 0.5
  done
  fail "${1##*/}: rank process(es) ${pids[*]} outlived the job; killed"
  kill -KILL "${pids[@]}" 2>/dev/null
}

#!/usr/bin/env bash
# scripts/fake_nodes.sh's command line: what is asked wrong is refused with exit code 2 and a
# message that says what would be right, before anything is made; --help lists every command.
# Making, entering and removing nodes is test_fake_nodes.sh's (it needs namespaces); this needs
# root only for the refusals that come after the root check, and skips them otherwise.
set -u
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
FN=$ROOT/scripts/fake_nodes.sh
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

refused() {  # refused WORDS ARGS...: fake_nodes.sh ARGS exits 2 and says WORDS on stderr, nothing on stdout
  local words=$1 rc=0
  shift
  "$FN" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  if [ $rc != 2 ]; then
    fail "fake_nodes.sh $*: exit $rc, not 2 ($(head -c 300 "$WORK/err"))"
  elif ! grep -q -F -- "$words" "$WORK/err"; then
    fail "fake_nodes.sh $*: the message does not say '$words': $(head -c 300 "$WORK/err")"
  elif [ -s "$WORK/out" ]; then
    fail "fake_nodes.sh $*: printed on stdout: $(head -c 200 "$WORK/out")"
  else
    echo "ok   fake_nodes.sh $*: refused, '$words'"
  fi
}

"$FN" --help >"$WORK/help" 2>&1 || fail "fake_nodes.sh --help: exit $?"
for cmd in "up N DIR" "run I DIR" "pids I DIR [NAME]" "down DIR" "sweep"; do
  grep -q -F -- "$cmd" "$WORK/help" || fail "--help does not list '$cmd'"
done
refused "no command"
refused "unknown command 'bogus'" bogus
refused "up takes N and DIR" up 3
refused "run takes I, DIR and a command" run 0 "$WORK"
refused "pids takes I, DIR and a process name or none" pids 1
refused "pids takes I, DIR and a process name or none" pids 1 "$WORK" llmhpc extra
refused "down takes DIR" down
refused "sweep takes nothing more" sweep "$WORK"

if [ "$(id -u)" = 0 ]; then
  refused "N must be a number of nodes from 1 to" up 0 "$WORK/nodes"
  refused "N must be a number of nodes from 1 to" up three "$WORK/nodes"
  refused "use a path of letters, digits" up 2 "$WORK/a b"
  refused "is under /dev/shm" up 2 /dev/shm/nodes
  refused "no fake nodes in $WORK: make them with" run 0 "$WORK" hostname
  refused "no fake nodes in $WORK: make them with" pids 1 "$WORK" llmhpc
  [ -e "$WORK/nodes" ] && fail "a refused up made $WORK/nodes"
else
  echo "note: not root, so the refusals after fake_nodes.sh's root check were not tried"
fi
[ $failures = 0 ] && echo PASS || exit 1

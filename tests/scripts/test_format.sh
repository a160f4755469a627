#!/usr/bin/env bash
# The tracked files keep their form. A script with a #! line is executable in git, as its usage
# line runs it (scripts/gpu/tp_check.sh BIN OUT); one that is only sourced has none. The C++/CUDA
# sources stay formatted by the committed .clang-format: clang-format 14 (the version the
# settings were chosen with) changes nothing in any tracked file; that part is skipped (77) where
# clang-format 14 is not installed, since other versions format differently.
set -u
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
cd "$ROOT" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  modes=$(git ls-files -s -- '*.sh' '*.py' | while read -r mode _ _ f; do
    first=$(head -c 2 "$f")
    if [ "$first" = "#!" ] && [ "$mode" != 100755 ]; then echo "$f: has a #! line but is not executable (git update-index --chmod=+x)"
    elif [ "$first" != "#!" ] && [ "$mode" = 100755 ]; then echo "$f: executable without a #! line"; fi
  done)
  [ -z "$modes" ] || { echo "FAIL:"; echo "$modes"; exit 1; }
fi
command -v clang-format >/dev/null || { echo "SKIP: clang-format not installed"; exit 77; }
clang-format --version | grep -q 'version 14\.' || { echo "SKIP: not clang-format 14: $(clang-format --version)"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "SKIP: not a git checkout"; exit 77; }  # a worktree has a .git file
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
bad=$(for f in $files; do clang-format --dry-run "$f" 2>&1 | grep -q . && echo "$f"; done)
if [ -n "$bad" ]; then
  echo "FAIL: not formatted (run clang-format -i on them):"; echo "$bad"; exit 1
fi
echo "formatted: $(echo "$files" | wc -w) files"

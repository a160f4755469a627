#!/usr/bin/env bash
# The repository speaks as a product: no file git holds or would add (tracked and still
# present, or untracked and not ignored) uses the vocabulary of the lab notebook it was
# written from. Fails, listing file:line (or the path itself), on any of these, in any case:
#   - the word for a sitting of work, singular or plural, also followed by a number;
#   - the past tense of "lend";
#   - the verb for taking binaries along, and its past tense;
#   - device-kind names such as nvidia-hNNN-xN (write "one H100", "2 H200 (NVLink)");
#   - the plural of "seed", in any form (name a reference report by what it studied: "the
#     reference DDP study"; "seed" alone is fine);
#   - the names of the machinery once used to reach GPUs.
# The patterns are spelled in pieces below, so that this file passes its own check.
# Skipped (77) outside a git checkout.
set -u
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
cd "$ROOT" || exit 1
command -v git >/dev/null || { echo "SKIP: git not installed"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "SKIP: not a git checkout"; exit 77; }  # a worktree has a .git file

s=s
patterns=(
  "\\b${s}es${s}ions?(\\b|[0-9])"
  "\\bl""ent\\b"
  "\\bca""rr(y|ied)\\b"
  "nvidia-h[0-9]+(-x[0-9]+)?"
  "\\b${s}eeds\\b"
  "device ""tool"
  "helper ""calls?"
)
regex=$(IFS='|'; echo "${patterns[*]}")

# Every file git knows or would add: tracked ones still present, and untracked ones not ignored.
mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard | sort -zu)
present=()
for f in "${files[@]}"; do [ -f "$f" ] && [ ! -L "$f" ] && present+=("$f"); done

# In paths, _ separates words too (a script named like_this.sh).
hits=$(for f in "${present[@]}"; do
  grep -q -i -E "$regex" <<<"${f//_/ }" && echo "$f: (the path)"
done)
# grep's status 1 is "no match"; 2 (a bad pattern, an unreadable file) would leave nothing to
# find and pass.
lines=$(grep -n -H -I -i -E "$regex" -- "${present[@]}" | cut -c1-220; exit "${PIPESTATUS[0]}")
rc=$?
if [ $rc -gt 1 ]; then echo "FAIL: grep could not read the files or the patterns (exit $rc)"; exit 1; fi
all=$(printf '%s\n%s\n' "$hits" "$lines" | sed '/^$/d')
if [ -n "$all" ]; then
  echo "FAIL: $(echo "$all" | wc -l) lines use words the repository does not (see $0):"
  echo "$all"
  exit 1
fi
echo "wording: ${#present[@]} files clean"

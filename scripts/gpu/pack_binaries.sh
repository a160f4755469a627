#!/usr/bin/env bash
# Packs a build's binaries into one folder to copy to a GPU host that has no build tools:
# llmhpc and the named test executables (stripped), and copies of the HDF5 libraries in
# OUT_DIR/fallback/ for a host that lacks them (the scripts in scripts/gpu/ and
# tests/cuda/gpu_check.sh put fallback/ on LD_LIBRARY_PATH when llmhpc misses a library).
# From the repository root:
#   scripts/gpu/pack_binaries.sh [--xz] BUILD_DIR OUT_DIR [TEST ...]
#   scripts/gpu/pack_binaries.sh build bin kernel_bench test_cuda_{device,ops,model,profiler,memory}
#   scripts/gpu/pack_binaries.sh build bin test_flash_attn
# A TEST is looked for in BUILD_DIR/tests/, then in BUILD_DIR. OUT_DIR (bin/ is git-ignored) is
# deleted and made anew, so it must be new, empty, or one this script made (it leaves
# OUT_DIR/.pack_binaries to say so); never BUILD_DIR, the repository, or a folder holding either.
# --xz packs the test executables into OUT_DIR/tests.tar.xz instead of leaving them loose (a
# fraction of the size); the GPU scripts unpack it into OUT_DIR on first use. Then on the GPU
# host, e.g.: tests/cuda/gpu_check.sh bin OUT_DIR, or scripts/gpu/attention_check.sh bin OUT_DIR.
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
usage() { echo "usage: $0 [--xz] BUILD_DIR OUT_DIR [TEST ...] (--help for more)" >&2; exit 2; }
xz=0
[ "${1:-}" = "--xz" ] && { xz=1; shift; }
[ $# -ge 2 ] || usage
build=$1 out=$2
shift 2
[ -x "$build/llmhpc" ] || { echo "$0: no llmhpc in $build (build first: make build)" >&2; exit 2; }
# OUT_DIR is deleted below: refuse any folder whose loss would hurt, i.e. one that is or holds the
# build or the checkout, and any that holds files of someone else's (no marker of this script's).
root=$(cd "$(dirname "$0")/../.." && pwd)
marker=.pack_binaries
real_out=$(realpath -m -- "$out")
for keep in "$root" "$build"; do
  real_keep=$(realpath -m -- "$keep")
  if [[ "$real_keep/" == "${real_out%/}/"* ]]; then
    echo "$0: OUT_DIR '$out' is or holds $real_keep, which it would delete; give a folder of its own, e.g. bin" >&2
    exit 2
  fi
done
if [ -e "$out" ] && [ ! -d "$out" ]; then
  echo "$0: OUT_DIR '$out' is not a folder; give a new or empty folder, or one this script made" >&2
  exit 2
fi
if [ -d "$out" ] && [ -n "$(ls -A -- "$out")" ] && [ ! -f "$out/$marker" ]; then
  echo "$0: OUT_DIR '$out' holds files and no $marker, so this script did not make it; give a new or empty folder" >&2
  exit 2
fi
tests=()
for t in "$@"; do
  if [ -x "$build/tests/$t" ]; then tests+=("$build/tests/$t")
  elif [ -x "$build/$t" ]; then tests+=("$build/$t")
  else echo "$0: no test executable $t in $build/tests or $build" >&2; exit 2
  fi
done

rm -rf "$out" && mkdir -p "$out/fallback"
echo "scripts/gpu/pack_binaries.sh made this folder from $(realpath -- "$build"), and may replace it" >"$out/$marker"
cp "$build/llmhpc" "$out/"
strip "$out/llmhpc"
names=()
for path in ${tests[@]+"${tests[@]}"}; do
  cp "$path" "$out/"
  strip "$out/$(basename "$path")"
  names+=("$(basename "$path")")
done
for lib in libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
  # The first match, read to the end: an awk that exits early ends ldconfig with SIGPIPE, which
  # pipefail makes the pipeline's status (141) and set -e the script's.
  found=$(ldconfig -p | awk -v l="$lib" '$1 == l && f == "" {f = $NF} END {print f}')
  if [ -n "$found" ]; then cp -L "$found" "$out/fallback/"; fi
done
if [ "$xz" = 1 ] && [ ${#names[@]} -gt 0 ]; then
  tar -C "$out" -cJf "$out/tests.tar.xz" "${names[@]}"
  (cd "$out" && rm -f "${names[@]}")
fi
du -sh "$out"

#!/usr/bin/env bash
# Packs a build's binaries into one folder to copy to a GPU host that has no build tools:
# llmhpc and the named test executables (stripped), and copies of the HDF5 libraries in
# OUT_DIR/fallback/ for a host that lacks them (the scripts in scripts/gpu/ and
# tests/cuda/gpu_check.sh put fallback/ on LD_LIBRARY_PATH when llmhpc misses a library).
# From the repository root:
#   scripts/gpu/pack_binaries.sh [--xz] BUILD_DIR OUT_DIR [TEST ...]
#   scripts/gpu/pack_binaries.sh build bin test_cuda_{device,ops,model,profiler,kernel_bench,memory}
#   scripts/gpu/pack_binaries.sh build bin test_flash_attn
# A TEST is looked for in BUILD_DIR/tests/, then in BUILD_DIR. OUT_DIR is emptied first
# (bin/ is git-ignored). --xz packs the test executables into OUT_DIR/tests.tar.xz instead of
# leaving them loose (a fraction of the size); the GPU scripts unpack it into OUT_DIR on first
# use. Then on the GPU host, e.g.: tests/cuda/gpu_check.sh bin OUT_DIR, or
# scripts/gpu/attention_check.sh bin OUT_DIR.
set -euo pipefail
usage() { echo "usage: $0 [--xz] BUILD_DIR OUT_DIR [TEST ...]" >&2; exit 2; }
xz=0
[ "${1:-}" = "--xz" ] && { xz=1; shift; }
[ $# -ge 2 ] || usage
build=$1 out=$2
shift 2
[ -x "$build/llmhpc" ] || { echo "$0: no llmhpc in $build (build first: make build)" >&2; exit 2; }
tests=()
for t in "$@"; do
  if [ -x "$build/tests/$t" ]; then tests+=("$build/tests/$t")
  elif [ -x "$build/$t" ]; then tests+=("$build/$t")
  else echo "$0: no test executable $t in $build/tests or $build" >&2; exit 2
  fi
done

rm -rf "$out" && mkdir -p "$out/fallback"
cp "$build/llmhpc" "$out/"
strip "$out/llmhpc"
names=()
for path in ${tests[@]+"${tests[@]}"}; do
  cp "$path" "$out/"
  strip "$out/$(basename "$path")"
  names+=("$(basename "$path")")
done
for lib in libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
  found=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
  if [ -n "$found" ]; then cp -L "$found" "$out/fallback/"; fi
done
if [ "$xz" = 1 ] && [ ${#names[@]} -gt 0 ]; then
  tar -C "$out" -cJf "$out/tests.tar.xz" "${names[@]}"
  (cd "$out" && rm -f "${names[@]}")
fi
du -sh "$out"

#!/usr/bin/env bash
# The layering check (cmake/check_layers.cmake) that every layer library runs before it
# compiles: the tree as it is passes; a file of the model layer that includes the
# communicator, one of the modes layer that includes a backend, and one of comm that includes
# what dist composes of it are rejected with a message naming the file, the include and what
# the layer may include.
set -u
ROOT=${LLMHPC_ROOT:?set LLMHPC_ROOT}
BUILD=${LLMHPC_BUILD:?set LLMHPC_BUILD}
CHECK="$ROOT/cmake/check_layers.cmake"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

layers=$(ls "$BUILD"/layers/*.rules 2>/dev/null)
[ -n "$layers" ] || fail "no layer rules in $BUILD/layers"
for rules in $layers; do
  cmake -DRULES="$rules" -DROOT="$ROOT" -P "$CHECK" >/dev/null 2>&1 || fail "the tree breaks its own layering: $rules"
done

# A wrong include in a layer's file, checked with that layer's own rules.
reject() {  # layer, planted include
  local layer=$1 include=$2 src="$work/planted_$1.cpp"
  printf '#include "src/core/check.h"\n#include "%s"\n' "$include" > "$src"
  { cat "$BUILD/layers/$layer.rules"; echo "set(FILES \"$src\")"; } > "$work/$layer.rules"
  local out
  out=$(cmake -DRULES="$work/$layer.rules" -DROOT="$ROOT" -P "$CHECK" 2>&1) && fail "$layer may not include $include, but the check passed"
  echo "$out" | grep -q "layer '$layer' includes outside what it may use" || fail "no layer named in: $out"
  echo "$out" | grep -q "includes \"$include\"" || fail "the include is not named in: $out"
  echo "$out" | grep -q "may include: src/core/" || fail "the allowed includes are not listed in: $out"
  echo "rejected: $layer including $include"
}
reject model comm/communicator.h
reject modes kernels/cpu/cpu_backend.h
reject comm kernels/ops.h
reject comm src/dist/bf16_wire.h
reject core src/io/recorder.h
echo "layering check ok"

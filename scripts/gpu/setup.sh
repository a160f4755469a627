# Sourced by the scripts in scripts/gpu/ and by tests/cuda/gpu_check.sh after `set -uo pipefail`:
#   source "$(dirname "$0")/setup.sh" NAME "${1:-}" "${2:-}"
# sets root (the repository), bin (BIN_DIR, default build/, which must hold llmhpc), out
# (OUT_DIR, default results/NAME-<time>, git-ignored; created), unpacks BIN_DIR/tests.tar.xz
# if there is one, and lets a host without the HDF5 libraries use the copies next to the
# binary (scripts/gpu/pack_binaries.sh puts them in fallback/). Stops (exit 2) before making
# anything where BIN_DIR has no llmhpc or nvidia-smi lists no GPU.
# --help: the calling script's header (what it runs, its arguments and variables).
case ${2:-} in -h | --help) sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$(cd -- "${2:-$root/build}" 2>/dev/null && pwd) ||
  { echo "$1: BIN_DIR '$2' is not a folder (give the folder of llmhpc and its tests, or nothing for build/; --help)" >&2; exit 2; }
out=${3:-$root/results/$1-$(date +%Y%m%d-%H%M%S)}
[ -x "$bin/llmhpc" ] || { echo "$1: no llmhpc in $bin (build first: make build)" >&2; exit 2; }
# A GPU, before OUT_DIR is made: without one every step would fail on its own, each with its own
# error, and leave a folder of failed logs. nvidia-smi is on every GPU host these scripts run on.
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -gt 0 ] ||
  { echo "$0 needs an NVIDIA GPU (nvidia-smi lists none here); the CPU tests are make test's" >&2; exit 2; }
mkdir -p "$out"
if [ -f "$bin/tests.tar.xz" ]; then tar -C "$bin" --skip-old-files -xJf "$bin/tests.tar.xz"; fi
if ldd "$bin/llmhpc" 2>/dev/null | grep -q "not found" && [ -d "$bin/fallback" ]; then
  export LD_LIBRARY_PATH=$bin/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

# The scripts' shared vocabulary: a test executable in BIN_DIR or BIN_DIR/tests; a timestamped
# heading; a command whose failure is noted in `failed` and the run goes on; whether PARTS names
# a part.
find_exe() { [ -x "$bin/$1" ] && echo "$bin/$1" || echo "$bin/tests/$1"; }
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
failed=()
check() { "$@" || { echo "FAILED ($?): $*"; failed+=("$*"); }; }
has() { [[ " ${PARTS:-} " == *" $1 "* ]]; }

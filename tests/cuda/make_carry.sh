#!/usr/bin/env bash
# Copies what the GPU check needs from a build folder into carry/cuda/ (git-ignored), to
# send to a GPU host with the device tool: llmhpc, the test_cuda_* executables (stripped)
# and copies of the HDF5 libraries in case the host lacks them.
#   tests/cuda/make_carry.sh [BUILD_DIR]   (default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
rm -rf carry/cuda && mkdir -p carry/cuda/fallback
cp "$build/llmhpc" "$build"/tests/test_cuda_{device,ops,model,profiler,kernel_bench,memory} carry/cuda/
strip carry/cuda/llmhpc carry/cuda/test_cuda_*
for lib in libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
  cp -L "$(ldconfig -p | awk -v l=$lib '$1 == l {print $NF; exit}')" carry/cuda/fallback/
done
du -sh carry/cuda

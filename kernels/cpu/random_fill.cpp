// Counter-based normal values on the host. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): a host compiler that may fuse a * b + c into one FMA (aarch64 does by
// default) would round differently from the CUDA kernel, which rounds every operation.
#include "kernels/cpu/cpu_kernels.h"
#include "src/core/random.h"

namespace llmhpc::cpu {

void random_normal(void* dst, DType t, int64_t n, uint64_t seed, uint64_t stream, double std, double bound) {
  // Not zero-filled first: the parallel loop is each page's first touch.
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    store_from_double(dst, size_t(i), t, exact::mul(std, llmhpc::random_normal(seed, stream, uint64_t(i), bound)));
}

}  // namespace llmhpc::cpu

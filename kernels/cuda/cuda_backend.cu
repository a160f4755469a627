// Placeholder until the CUDA backend lands: reports GPUs, refuses to run on them.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"

namespace llmhpc {

int cuda_visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

Backend make_cuda_backend(const BackendOptions&) {
  throw UsageError("--device cuda: the CUDA backend is not implemented yet; use --device cpu");
}

}  // namespace llmhpc

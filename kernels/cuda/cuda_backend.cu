// The CUDA backend's factory, and the GPU count that works without a driver.
#include "kernels/cuda/cuda_backend.h"

#include "kernels/cuda/cuda_ops.h"

namespace llmhpc {

int cuda_visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: clear the error, report none
    return 0;
  }
  return n;
}

Backend make_cuda_backend(const BackendOptions& options) {
  const int gpus = cuda_visible_devices();
  if (gpus == 0) throw UsageError("{device} cuda: no GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)");
  if (options.ordinal < 0 || options.ordinal >= gpus)
    throw UsageError("GPU " + std::to_string(options.ordinal) + " does not exist (" + std::to_string(gpus) +
                     " visible)");
  auto device = std::make_unique<CudaDevice>(options);
  auto ops = std::make_unique<CudaOps>(*device, options);
  Backend b;
  b.device = std::move(device);  // declared before ops, so the ops (and their cuBLAS handle) go first
  b.ops = std::move(ops);
  return b;
}

}  // namespace llmhpc

#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"
#if defined(LLMHPC_WITH_CUDA)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace llmhpc {

Backend make_backend(const BackendOptions& options) {
  if (options.kind == DeviceKind::Cpu) return make_cpu_backend(options);
#if defined(LLMHPC_WITH_CUDA)
  return make_cuda_backend(options);
#else
  throw UsageError("--device cuda: this llmhpc was built without the CUDA backend (no nvcc at build time)");
#endif
}

bool cuda_compiled() {
#if defined(LLMHPC_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if defined(LLMHPC_WITH_CUDA)
  return cuda_visible_devices();
#else
  return 0;
#endif
}

}  // namespace llmhpc

// The one factory for backends: a Device and its Ops. This file's .cpp is the only place
// that knows whether the CUDA backend was compiled in.
#pragma once
#include <memory>

#include "kernels/ops.h"
#include "kernels/profiler.h"

namespace llmhpc {

struct BackendOptions {
  DeviceKind kind = DeviceKind::Cpu;
  int ordinal = 0;             // which GPU
  size_t memory_limit = 0;     // 0: the device's own capacity
  bool tf32 = false;           // allow TF32 tensor cores for fp32 matrix products (CUDA)
  int gemm_sm_margin = 0;      // SMs cuBLAS leaves to concurrent work such as NCCL's kernels (CUDA)
  bool gemm_autotune = false;  // time cuBLASLt's candidate algorithms per product, keep the fastest (CUDA)
};

struct Backend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Ops> ops;
};

Backend make_backend(const BackendOptions& options);

// The profiler for a backend (mode profile, kernels/profiler.h): CUPTI on CUDA, each op timed
// on the CPU. Without `activities` (--no-cupti), or on CUDA where libcupti cannot be opened,
// phases timed with device events only; its note() says why. CUPTI is touched only here and
// inside the profiler's windows.
std::unique_ptr<Profiler> make_profiler(Backend& backend, bool activities);

bool cuda_compiled();
int cuda_device_count();  // 0 when CUDA is not compiled in or no GPU is visible

}  // namespace llmhpc

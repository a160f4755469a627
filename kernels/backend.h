// The one factory for backends: a Device and its Ops. This file's .cpp is the only place
// that knows whether the CUDA backend was compiled in.
#pragma once
#include <memory>

#include "kernels/ops.h"

namespace llmhpc {

struct BackendOptions {
  DeviceKind kind = DeviceKind::Cpu;
  int ordinal = 0;          // which GPU
  size_t memory_limit = 0;  // 0: the device's own capacity
  bool tf32 = false;        // allow TF32 tensor cores for fp32 matrix products (CUDA)
};

struct Backend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Ops> ops;
};

Backend make_backend(const BackendOptions& options);

bool cuda_compiled();
int cuda_device_count();  // 0 when CUDA is not compiled in or no GPU is visible

}  // namespace llmhpc

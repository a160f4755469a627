// The CUDA backend: a Device on one GPU (stream, events, caching allocator) and the Ops.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cuda_backend(const BackendOptions& options);
int cuda_visible_devices();  // 0 when there is no driver or no GPU

}  // namespace llmhpc

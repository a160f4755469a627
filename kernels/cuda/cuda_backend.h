// The CUDA backend: a Device on one GPU (stream, events, caching allocator) and the Ops.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cuda_backend(const BackendOptions& options);
int cuda_visible_devices();  // 0 when there is no driver or no GPU

// CUPTI's activity API (kernels/cuda/cupti_profiler.cpp) for models on `ops`, or nullptr with
// `why_not` set when libcupti cannot be opened or initialised; for make_profiler.
std::unique_ptr<Profiler> make_cupti_profiler(Ops& ops, std::string& why_not);

}  // namespace llmhpc

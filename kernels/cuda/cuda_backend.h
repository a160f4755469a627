// The CUDA backend: a Device on one GPU (stream, events, caching allocator) and the Ops.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cuda_backend(const BackendOptions& options);
int cuda_visible_devices();  // 0 when there is no driver or no GPU

// CUPTI's activity API (kernels/cuda/cupti_profiler.cpp) for models on `ops`, or nullptr with
// `why_not` set when libcupti cannot be opened or initialised; for make_profiler.
std::unique_ptr<Profiler> make_cupti_profiler(Ops& ops, std::string& why_not);

// The passes of kernels/reduce_passes.h, enqueued on `stream` (a cudaStream_t).
namespace cuda {
void narrow_to_bf16(const float* data, void* wire, size_t count, void* stream);
void widen_from_bf16(const void* wire, float* data, size_t count, void* stream);
void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, void* stream);
}  // namespace cuda

}  // namespace llmhpc

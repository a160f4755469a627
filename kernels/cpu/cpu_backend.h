// The CPU backend: host memory, wall-clock timing, and the reference kernels.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cpu_backend(const BackendOptions& options);
// Times every call of `ops` on the host (kernels/cpu/op_profiler.cpp); for make_profiler.
std::unique_ptr<Profiler> make_cpu_op_profiler(Ops& ops);

// The passes of kernels/reduce_passes.h on host memory, run now.
namespace cpu {
void narrow_to_bf16(const float* data, void* wire, size_t count);
void widen_from_bf16(const void* wire, float* data, size_t count);
void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale);
}  // namespace cpu

}  // namespace llmhpc

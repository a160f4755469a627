// The CPU backend: host memory, wall-clock timing, and the reference kernels.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cpu_backend(const BackendOptions& options);
// Times every call of `ops` on the host (kernels/cpu/op_profiler.cpp); for make_profiler.
std::unique_ptr<Profiler> make_cpu_op_profiler(Ops& ops);

}  // namespace llmhpc

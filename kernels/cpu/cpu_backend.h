// The CPU backend: host memory, wall-clock timing, and the reference kernels.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cpu_backend(const BackendOptions& options);

// Physical memory of this machine in bytes (the CPU device's default capacity).
size_t host_physical_memory();

}  // namespace llmhpc

// The CPU backend: host memory, wall-clock timing, and the reference kernels.
#pragma once
#include "kernels/backend.h"

namespace llmhpc {

Backend make_cpu_backend(const BackendOptions& options);

}  // namespace llmhpc

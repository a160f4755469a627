// Facts about a GPU that a reader of results needs to trust a number: its name and size,
// the CUDA runtime and driver, and from NVML (where the driver provides it) the SM clock
// when the run started and the enforced power limit. Root attributes of every rank file.
#pragma once
#include "src/core/attrs.h"

namespace llmhpc {

Attrs gpu_environment(int ordinal);

}  // namespace llmhpc

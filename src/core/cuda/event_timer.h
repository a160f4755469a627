// The Timer of src/core/timer.h on a CUDA stream: each mark is an event recorded on the
// stream. Every stream of one GPU shares the GPU's clock, so the compute stream's and the
// communicator's timers can be compared (cudaEventElapsedTime across streams).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "src/core/timer.h"

namespace llmhpc {

// Marks on `stream` of the current device.
std::unique_ptr<Timer> make_event_timer(cudaStream_t stream, int num_marks);
// Milliseconds from mark `from` of `origin` (an event timer of this device) to `event`, a
// timing event of the same device; waits until both were reached.
double elapsed_ms_to(const Timer& origin, int from, cudaEvent_t event);

}  // namespace llmhpc

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
// Mark `index` of `timer`, an event timer of the current device (checked): to time events
// recorded elsewhere (a communicator's) from it with cudaEventElapsedTime.
cudaEvent_t timer_event(const Timer& timer, int index);

}  // namespace llmhpc

// The one implementation of GradientSync (grad_sync.h): all-reduce averages of planned
// ranges of the flat gradient (bucket_plan.h), in place, issued either after backward or as
// soon as backward has reported every element of a range. make_gradient_sync() picks the
// plan and the timing of each strategy; nothing else uses this header.
#pragma once
#include <memory>
#include <vector>

#include "src/dist/grad_sync.h"

namespace llmhpc {

enum class IssueTime {
  AfterBackward,  // finish() reduces every range, one blocking collective after another
  WhenReady,      // a range's asynchronous collective starts when its last gradient is final
};

std::unique_ptr<GradientSync> make_reducer(SyncStrategy strategy, Communicator& comm, Tensor flat_grads,
                                           std::vector<GradRange> buckets, IssueTime when);

}  // namespace llmhpc

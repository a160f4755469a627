// The one implementation of GradientSync's gradient half (grad_sync.h): averages of the plan's
// ranges of the flat gradient (bucket_plan.h), in place, issued either after backward or as
// soon as backward has reported every element of a range; all-reduced, or under zero1
// reduce-scattered to each part's owner. make_gradient_sync() makes it; nothing else uses
// this header.
#pragma once
#include <memory>

#include "src/dist/grad_sync.h"

namespace llmhpc {

// `replicas`: hybrid zero1's groups (make_gradient_sync).
std::unique_ptr<GradientSync> make_reducer(const SyncPlan& plan, Communicator& comm, Tensor flat_grads,
                                           ReduceScratch scratch, Communicator* replicas);

}  // namespace llmhpc

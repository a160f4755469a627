// The parameter half of a sharded GradientSync (grad_sync.h): after each rank's optimizer
// updated the ranges it owns, every rank gets every owner's updates, in place in the flat
// parameters (or in their bf16 copy: make_gradient_sync's compute_copy); broadcasts from each
// owner (broadcast) or one all-gather per bucket (zero1).
// make_gradient_sync() makes it around the gradient half (the reducer); nothing else uses
// this header.
#pragma once
#include <memory>

#include "src/dist/grad_sync.h"

namespace llmhpc {

std::unique_ptr<GradientSync> make_parameter_sharing(std::unique_ptr<GradientSync> gradients, Communicator& comm,
                                                     Tensor flat_params, CopySharing sharing);

}  // namespace llmhpc

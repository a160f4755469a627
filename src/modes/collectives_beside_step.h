// Each collective the communication model charges (all-reduce, reduce-scatter, all-gather),
// timed on a data-parallel communicator's stream alone and beside one train step of the model on
// the compute stream. Over NVLink NCCL's kernels share the SMs and the memory with the step's:
// in llmhpc's steps the collectives took 1.03-1.65x their time alone, and neither a matrix
// product run without a pause nor PyTorch's step of the same model reproduced that
// (docs/results/scaling.md, "Tried and rejected"), so the model's own step is the load.
//
// Per collective and size: kAloneOps back to back with nothing else on the device (the median of
// all but the first kWarmOps), then `count` issued from one train step when backward reports its
// first final gradients, as a data-parallel strategy issues its first bucket, so that they run
// beside the rest of backward; count sized to kShareOfStep of the step at their time alone, at
// most kMaxBeside (more would fill the stream's queue and stall the host's enqueueing of
// backward), the same on every rank (the step and the time alone are agreed maxima); those that
// started and ended within the step are kept (their median). Measured from the communicator's
// busy spans (comm/communicator.h): NCCL only.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "src/core/allocator.h"
#include "src/core/runtime.h"
#include "src/core/timer.h"
#include "src/model/parallel_hooks.h"

namespace llmhpc {

struct CollectiveBesideStep {
  Collective collective = Collective::AllReduce;
  uint64_t bytes = 0;      // the largest buffer (collective_shape), as mode comm counts it
  double alone_us = NAN;   // back to back, nothing beside
  double beside_us = NAN;  // issued with the step, those within it
  int64_t issued = 0;      // beside the step
  int64_t within = 0;      // of them, started and ended inside it
};

constexpr int kAloneOps = 12, kWarmOps = 2;
constexpr double kShareOfStep = 0.3;
constexpr int64_t kMaxBeside = 200;

// The collectives every --comm-beside-step size is timed as.
const std::vector<Collective>& collectives_beside_step();

// Collective over rt's ranks, each of which calls it with its data-parallel `comm` (the counts
// are agreed over rt). `step` runs one train step with the given hooks, its mark 0 on `timer` at
// the step's start, and returns its time in ms; `step_ms` is what the timed steps took (the same
// on every rank).
std::vector<CollectiveBesideStep> time_collectives_beside_step(const Runtime& rt, Communicator& comm, Allocator& alloc,
                                                               DType dtype, const std::vector<uint64_t>& sizes,
                                                               double step_ms, Timer& timer,
                                                               const std::function<double(ParallelHooks*)>& step);

}  // namespace llmhpc

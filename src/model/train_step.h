// One timed step: forward, then backward, then the optimizer, each phase
// bracketed by device events. The step waits for the device once, at its end.
// And what the step's memory is for, read off the allocator's tags.
#pragma once
#include <cmath>
#include <functional>
#include <string>

#include "kernels/ops.h"
#include "src/model/adamw.h"
#include "src/model/transformer.h"

namespace llmhpc {

enum class Phase { Forward, ForwardBackward, TrainStep };
Phase parse_phase(const std::string& text);  // forward | forward-backward | train-step
const char* phase_name(Phase p);

// The model's memory by what it is for (TracingAllocator::live_by_category): params (fp32
// weights, the bf16 copy or cast windows), grads, optimizer (AdamW's m and v), activations
// (what forward keeps for backward, and the batch), scratch (backward's temporaries), and
// "other" (workspaces of the kernels).
const std::vector<TagCategory>& model_memory_categories();
MemoryBreakdown model_memory(const TracingAllocator& allocator);

struct StepTimes {
  double forward_ms = NAN, backward_ms = NAN, optimizer_ms = NAN, step_ms = NAN;
  // With a listener (data parallelism): from the end of backward until its finish() let the
  // compute stream go on, i.e. the communication backward did not hide, as compute sees it.
  double sync_ms = NAN;
  // With a listener, train-step: from the end of the optimizer until finish_parameters() let
  // the compute stream go on: about 0, since the parameters other ranks updated are waited
  // for, range by range, in the next step's forward (where what they did not hide counts).
  double param_sync_ms = NAN;
  MemoryBreakdown memory_before_optimizer;  // the device allocator's live bytes (train-step)
};

// The marks a step's timer needs: start, forward, backward, gradients final, optimizer,
// parameters shared.
constexpr int kStepMarks = 6;

// Gradient accumulation (train's --grad-accum): a step's forward and backward run over `count`
// micro-batches, the gradients added up. `begin(i)` sets micro-batch i before its forward (its
// tokens, and the loss weight 1/count); `end(i)`, if given, follows its backward (e.g. to read
// its loss). Data parallelism communicates in the last backward only, as under PyTorch's
// no_sync() for the others.
struct MicroBatches {
  int count = 1;
  std::function<void(int)> begin, end;
};
// The marks a step of `micro_batches` needs (forward and backward end of each but the last,
// beyond kStepMarks).
inline int step_marks(int micro_batches) { return kStepMarks + 2 * (micro_batches - 1); }

// Under GradientStorage::PerRange the optimizer runs inside backward (AdamW on each range as
// backward finishes it): backward_ms includes it, optimizer_ms stays NaN, and no listener may be
// given. One step; `timer` (of the model's device) needs kStepMarks marks. `opt` may be null unless
// phase is TrainStep. `listener` hears backward and the optimizer (ParallelHooks's step
// protocol).
// After a sharded optimizer, parameters may still be arriving when it returns: the next
// run_step's forward waits for them range by range; anything else that reads the parameters
// calls model.wait_parameters() first.
// `on_phase`, if given, hears "forward", "backward" and "optimizer" as each begins (the memory
// mode labels allocations with it).
// With `micro` (train-step, GradientStorage::Whole; the timer of step_marks(micro->count)),
// forward_ms and backward_ms are the sums over the micro-batches.
// `while_device_runs`, if given, is called once the whole step is enqueued, before the host
// waits for the device: host work that would otherwise delay the next step's start.
StepTimes run_step(TransformerLM& model, AdamW* opt, Phase phase, Timer& timer, ParallelHooks* listener = nullptr,
                   const std::function<void(const char*)>& on_phase = nullptr, const MicroBatches* micro = nullptr,
                   const std::function<void()>& while_device_runs = nullptr);

// --cuda-graph: forward, and backward unless the phase is forward, recorded once as a device
// graph and replayed each step with one launch; AdamW (train-step) then runs as usual, since its
// step count, an argument of its kernel, changes every step and a replay's cannot. So
// train-step needs GradientStorage::Whole (the modes check it first), and no listener: data
// parallelism's communication is not recorded. Best constructed after an eager step (the
// warm-up): the recording then takes its blocks from the cache; without one it allocates them
// (cudaMalloc works while capturing; tested).
// Times: step_ms and, for train-step, optimizer_ms; forward_ms only when the phase is forward
// (a replay is not split into forward and backward).
class GraphedStep {
 public:
  GraphedStep(TransformerLM& model, AdamW* opt, Phase phase);
  ~GraphedStep();
  StepTimes run(Timer& timer);

 private:
  TransformerLM& model_;
  AdamW* opt_;
  Phase phase_;
  std::unique_ptr<DeviceGraph> graph_;
};

// Model FLOPs of one forward+backward: 6 * (matmul params) * tokens + 6 * L * d * T * tokens, the
// attention's scores and their product with the values (12 L d T a token) counted as half, as
// causal attention computes them (llm.c's count; the one behind MFU in analysis/scaling.py).
double model_flops_fwd_bwd(const ModelConfig& c, int64_t batch, int64_t seq);

}  // namespace llmhpc

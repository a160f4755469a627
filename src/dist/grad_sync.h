// Data-parallel gradient synchronisation: after backward, every rank holds the average over
// ranks of its gradients, so every rank takes the same optimizer step. Four strategies behind
// one small interface; each is a GradientListener that backward tells when a range of the
// flat gradient is final, plus finish(), which the step calls before the optimizer.
//
//   none      nothing is communicated (one rank, or a run that measures without it)
//   naive     after backward, one blocking all-reduce per trainable parameter tensor
//   flat      after backward, one all-reduce of the range from the first trainable
//             element to the last (plan_flat: frozen tensors inside it are communicated too)
//   overlap   per trainable tensor, an asynchronous all-reduce issued as soon as backward
//             has reported all of it; finish() waits for all of them
//   bucketed  as overlap, per bucket: adjacent tensors packed in reverse parameter order up
//             to --bucket-mb (plan_buckets), so fewer, larger collectives overlap backward
//
// The strategies differ in two choices only, which ranges one collective covers
// (src/dist/bucket_plan.h) and whether it is issued after backward or as soon as its
// gradients are final, so one implementation serves all four (src/dist/reducer.cpp).
// Every range is reduced in place in the one flat buffer: no copies in or out. Frozen
// parameters (ParamSpan::trainable false) are in no range, except inside flat's.
//
// Every step:  sync.begin_step(); model.backward(&sync); sync.finish(); optimizer.step();
// What the caller guarantees:
//  - Every rank reports the same ranges in the same order (the model's backward does: what
//    it reports does not depend on the data), so every rank issues the same collectives in
//    the same order. A trainable tensor that backward never reports is reduced by finish()
//    with whatever its gradient holds, on every rank: no hang (PyTorch needs
//    find_unused_parameters for that), and ranks never diverge.
//  - Gradient accumulation over micro-batches: only the last backward gets the sync; the
//    earlier ones would add into gradients that are being reduced.
//  - The gradient buffer is where the communicator works: host memory for mpi, this rank's
//    GPU for nccl (made with compute_stream = the model's Device::native_stream()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/core/tensor.h"
#include "src/dist/bucket_plan.h"
#include "src/model/gradient_listener.h"

namespace llmhpc {

class ParameterLayout;

enum class SyncStrategy { None, Naive, Flat, Overlap, Bucketed };
// Throws UsageError naming --ddp and listing the choices.
SyncStrategy parse_sync_strategy(const std::string& text);  // none | naive | flat | overlap | bucketed
const char* sync_strategy_name(SyncStrategy s);
const std::vector<SyncStrategy>& all_sync_strategies();

// What one step communicated (reset by begin_step()).
struct SyncStats {
  int64_t collectives = 0;       // all-reduces issued
  int64_t bytes = 0;             // their payload (elements x element size), not the bus traffic
  int64_t issued_in_finish = 0;  // of the collectives, those issued by finish() and not during backward
  int64_t buckets = 0;           // ranges the strategy reduces per step: one per trainable tensor
                                 // (naive, overlap), one (flat), the planned buckets (bucketed), 0 (none)
};

class GradientSync : public GradientListener {
 public:
  virtual SyncStrategy strategy() const = 0;
  // The ranges reduced each step, in reverse parameter order.
  virtual const std::vector<GradRange>& buckets() const = 0;
  // Before backward: a new step (what the last one reported is forgotten, stats restart).
  void begin_step() override = 0;
  // After backward: issues every reduction not issued yet, then makes the gradients'
  // consumer wait for all of them. nccl: the compute stream waits (the host does not
  // block), so the optimizer enqueued after it reads the averages; mpi: complete on return.
  void finish() override = 0;
  virtual const SyncStats& stats() const = 0;
};

// `flat_grads` is the whole gradient buffer (its dtype is what is communicated); `params`
// describes its tensors. bucket_mb (MiB, as PyTorch's bucket_cap_mb) matters for bucketed only.
std::unique_ptr<GradientSync> make_gradient_sync(SyncStrategy strategy, Communicator& comm, Tensor flat_grads,
                                                 std::vector<ParamSpan> params, double bucket_mb = 25);

// The model's parameters as spans of its flat buffer, every one trainable.
std::vector<ParamSpan> param_spans(const ParameterLayout& layout);

// Every rank takes rank 0's values (in place), so ranks initialised with different seeds
// start equal. Collective; on return the values are there for the consumer (as finish()).
void broadcast_parameters(Communicator& comm, Tensor flat_params);

}  // namespace llmhpc

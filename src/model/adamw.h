// AdamW over ranges of the flat parameters: the whole model, or the ranges one rank owns under
// optimizer-state sharding (src/dist/grad_sync.h). The state (m, v: param dtype, on the
// device) exists for the owned ranges only, packed one after another in their order
// (params.h: packed_pieces). It is allocated by the first step, as torch.optim allocates its
// state, so the memory before the first step is the model's alone; allocate_state() makes it
// earlier (a checkpoint load; a caller that wants an out-of-memory now, not mid-step).
#pragma once
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "src/model/parallel_hooks.h"
#include "src/model/params.h"
#include "src/model/transformer.h"

namespace llmhpc {

// Gradient clipping as torch.nn.utils.clip_grad_norm_ does it: the L2 norm of all the
// gradients (after data parallelism averaged them) and, where it is above max_norm, each
// gradient multiplied by max_norm / (norm + 1e-6), inside the AdamW kernel (AdamWHyper::
// grad_scale: bitwise what scaling the gradients first would give).
struct GradClipping {
  double max_norm = 0;  // 0: off; infinity: the norm is computed (last_grad_norm()), nothing clipped
  // Where the optimizer is sharded a rank holds the averaged gradients of its own ranges only:
  // the sum over ranks of each rank's sum of squares, the same bits on every rank
  // (Runtime::sum_in_rank_order). Unset: this rank's sum is the whole.
  std::function<double(double)> sum_over_ranks;
  // Ranges whose gradients another rank counts (tensor parallelism's whole parameters, the norm
  // gains, held alike by every rank of a group: counted by its rank 0 only), in ascending order,
  // in the coordinates of what the optimizer updates: the model's flat buffer, or its shard.
  std::vector<FlatRange> counted_elsewhere;
};

class AdamW {
 public:
  // `owned`: disjoint ranges of the model's flat buffer; empty: all of its parameters.
  AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, std::vector<FlatRange> owned = {});
  // Buffers of the same kind held elsewhere: a shard of sharded parameters (src/dist), its own
  // flat coordinates [0, params.numel()), every element updated.
  struct Shard {
    Tensor params;                  // the master weights
    std::function<Tensor()> grads;  // where their gradients are at the step (a shard holds them only then)
  };
  AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, Shard shard);

  // One update from the model's gradients, one owned range after another, telling `listener`
  // after each (ParallelHooks's parameter half); refreshes the bf16 weights of the owned
  // ranges. Each element's arithmetic is the same whatever the ranges, so owners of disjoint
  // ranges compute together bitwise what one optimizer of the whole model does.
  void step(ParallelHooks* listener = nullptr);
  // The same update applied range by range while backward runs (GradientStorage::PerRange,
  // run_step): begin_step() once per step, then update() for each range backward reports, with
  // its gradients; bitwise what step() does. Unsharded optimizers only.
  void begin_step();
  void update(FlatRange range, Tensor grads);
  void allocate_state();  // zeroed m and v, unless they exist
  // From the next step() on (update() refuses it: the norm needs every gradient first). The
  // norm is read on the host, so a clipped step waits for the device once before its update.
  void set_clipping(GradClipping clipping) { clipping_ = std::move(clipping); }
  // The gradients' norm before clipping, as the last step() computed it; NaN without clipping.
  double last_grad_norm() const { return grad_norm_; }
  bool has_state() const { return has_state_; }

  TransformerLM& model() const { return model_; }
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const AdamWHyper& hyper() const { return hyper_; }
  AdamWHyper& hyper() { return hyper_; }
  const std::vector<FlatRange>& owned() const { return owned_; }
  int64_t owned_elements() const { return packed_size(owned_); }
  // Packed state (owned_elements() each); empty before allocate_state() or the first step.
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }

 private:
  double clipping_factor();  // the step's AdamWHyper::grad_scale
  // The buffers updated: the model's (read each step: its bf16 copy may be let go and taken
  // again), or the shard's.
  Tensor params() const { return shard_.params.empty() ? model_.params() : shard_.params; }
  Tensor grads() const { return shard_.params.empty() ? model_.grads() : shard_.grads(); }
  Tensor lowp() const { return shard_.params.empty() ? model_.params_lowp() : Tensor(); }
  int64_t parameters() const { return shard_.params.empty() ? model_.layout().total() : shard_.params.numel(); }

  TransformerLM& model_;
  Ops& ops_;
  AdamWHyper hyper_;
  std::vector<FlatRange> owned_;
  Shard shard_;
  int64_t step_ = 0;
  bool has_state_ = false;
  Buffer m_, v_;
  GradClipping clipping_;
  double grad_norm_ = NAN;
};

}  // namespace llmhpc

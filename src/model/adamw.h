// AdamW over ranges of the flat parameters: the whole model, or the ranges one rank owns under
// optimizer-state sharding (src/dist/grad_sync.h). The state (m, v: param dtype, on the
// device) exists for the owned ranges only, packed one after another in their order
// (params.h: packed_pieces). It is allocated by the first step, as torch.optim allocates its
// state, so the memory before the first step is the model's alone; allocate_state() makes it
// earlier (a checkpoint load; a caller that wants an out-of-memory now, not mid-step).
#pragma once
#include <vector>

#include "kernels/ops.h"
#include "src/model/gradient_listener.h"
#include "src/model/params.h"
#include "src/model/transformer.h"

namespace llmhpc {

class AdamW {
 public:
  // `owned`: disjoint ranges of the model's flat buffer; empty: all of its parameters.
  AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, std::vector<FlatRange> owned = {});

  // One update from the model's gradients, one owned range after another, telling `listener`
  // after each (GradientListener's parameter half); refreshes the bf16 weights of the owned
  // ranges. Each element's arithmetic is the same whatever the ranges, so owners of disjoint
  // ranges compute together bitwise what one optimizer of the whole model does.
  void step(GradientListener* listener = nullptr);
  // The same update applied range by range while backward runs (GradientStorage::PerRange,
  // run_step): begin_step() once per step, then update() for each range backward reports, with
  // its gradients; bitwise what step() does. Unsharded optimizers only.
  void begin_step();
  void update(FlatRange range, Tensor grads);
  void allocate_state();  // zeroed m and v, unless they exist
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
  TransformerLM& model_;
  Ops& ops_;
  AdamWHyper hyper_;
  std::vector<FlatRange> owned_;
  int64_t step_ = 0;
  bool has_state_ = false;
  Buffer m_, v_;
};

}  // namespace llmhpc

// AdamW over a range [begin, end) of the flat parameters: the whole model, or one rank's
// shard of it under optimizer-state sharding. State (m, v) is param dtype, on the device.
#pragma once
#include "kernels/ops.h"
#include "src/model/transformer.h"

namespace llmhpc {

class AdamW {
 public:
  AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, int64_t begin = 0, int64_t end = -1);

  void step();  // one update from the model's gradients; refreshes the bf16 weights
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const AdamWHyper& hyper() const { return hyper_; }
  AdamWHyper& hyper() { return hyper_; }
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  TransformerLM& model_;
  Ops& ops_;
  AdamWHyper hyper_;
  int64_t begin_, end_, step_ = 0;
  Buffer m_, v_;
};

}  // namespace llmhpc

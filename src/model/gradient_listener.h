// GradientListener: how backward tells the outside world that a range of the flat gradient
// buffer is final, and how the optimizer tells it which parameters it updated. Data-parallel
// gradient synchronisation and optimizer sharding (src/dist) hook in here, so they depend on
// this header alone and never on the model. The two halves mirror each other as ZeRO splits
// an all-reduce: gradients reduced as backward finishes them, parameters shared as the
// optimizer finishes them.
#pragma once
#include <cstdint>

namespace llmhpc {

// One training step drives a listener as run_step (src/model/train_step.h) does:
//   begin_step(); model.backward(&listener) -> on_gradients_ready(...) ...; finish();
//   optimizer.step(&listener) -> on_parameters_updated(...) ...;
//   if (finish_parameters()) model.parameters_changed();
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  // Before the step's backward.
  virtual void begin_step() {}
  // Gradients of flat elements [begin, end) are final for this backward pass: backward
  // writes them no more, and the work that computes them has been issued (on a device,
  // enqueued on the compute stream, not necessarily finished).
  virtual void on_gradients_ready(int64_t begin, int64_t end) = 0;
  // After backward, before anything reads the gradients (the optimizer): on return, work
  // enqueued after it sees the final gradients (on a device: ordered on the compute stream).
  virtual void finish() {}
  // The optimizer has updated parameters [begin, end), a range it owns (its work issued, as
  // for gradients); it reports its ranges in the order it was given them.
  virtual void on_parameters_updated(int64_t begin, int64_t end) {}
  // After the optimizer, before anything reads the parameters: on return, work enqueued
  // after it sees every parameter as the rank that owns it updated it. Returns whether
  // parameters arrived from elsewhere, so that what the model derives from them (its bf16
  // copy) must be refreshed.
  virtual bool finish_parameters() { return false; }
};

}  // namespace llmhpc

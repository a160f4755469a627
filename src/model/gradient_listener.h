// GradientListener: how backward tells the outside world that a range of the flat gradient
// buffer is final. Data-parallel gradient synchronisation (src/dist) hooks in here, so it
// depends on this header alone and never on the model.
#pragma once
#include <cstdint>

namespace llmhpc {

// One training step drives a listener as run_step (src/model/train_step.h) does:
//   begin_step(); model.backward(&listener) -> on_gradients_ready(...) ...; finish(); optimizer
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
};

}  // namespace llmhpc

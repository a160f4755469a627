// ParallelHooks: the one protocol between the model and whatever parallelises it (src/dist).
// The model reports, range by range of its flat buffers (the embedding, each layer, the final
// norm with the head):
//   parameters_needed(R)  before it reads parameters of R (forward, layer by layer), and
//   gradients_final(R)    when backward has finished the gradients of R,
// and the optimizer reports parameters_updated(R) for each range it owns. Everything a
// strategy does happens behind these calls: data parallelism reduces R's gradients when they
// are final, ZeRO-1 reduce-scatters them and all-gathers the updates, waiting for R only when
// it is needed; a strategy that shards the parameters themselves gathers R when it is needed.
// The model never includes comm or dist; dist hooks in here. The halves mirror each other as
// ZeRO splits an all-reduce: gradients reduced as backward finishes them, parameters shared as
// the optimizer finishes them, and waited for as the next forward reaches them.
#pragma once
#include <cstdint>

namespace llmhpc {

// One training step drives the hooks as run_step (src/model/train_step.h) does:
//   model.forward() -> parameters_needed(...) ...   (only while parameters arrive: below)
//   begin_step(); model.backward(&listener) -> gradients_final(...) ...; finish();
//   optimizer.step(&listener) -> parameters_updated(...) ...;
//   if (finish_parameters()) model.parameters_arriving(listener);
class ParallelHooks {
 public:
  virtual ~ParallelHooks() = default;
  // Before the step's backward.
  virtual void begin_step() {}
  // Gradients of flat elements [begin, end) are final for this backward pass: backward
  // writes them no more, and the work that computes them has been issued (on a device,
  // enqueued on the compute stream, not necessarily finished).
  virtual void gradients_final(int64_t begin, int64_t end) = 0;
  // After backward, before anything reads the gradients (the optimizer): on return, work
  // enqueued after it sees the final gradients (on a device: ordered on the compute stream).
  virtual void finish() {}
  // The optimizer has updated parameters [begin, end), a range it owns (its work issued, as
  // for gradients); it reports its ranges in the order it was given them.
  virtual void parameters_updated(int64_t begin, int64_t end) {}
  // After the optimizer. Returns whether parameters arrive from elsewhere (other ranks'
  // updates), so that what the model derives from them (its bf16 copy) must be refreshed.
  // They may still be arriving on return: whoever reads a range of them first calls
  // parameters_needed for it (the model does: TransformerLM::parameters_arriving).
  virtual bool finish_parameters() { return false; }
  // Before anything reads parameters [begin, end) after finish_parameters(): on return, work
  // enqueued after it sees them as the ranks that own them updated them (on a device: the
  // compute stream waits for what brings them, the host does not block). Any range, any
  // number of times; [0, buffer length) asks for every parameter.
  virtual void parameters_needed(int64_t begin, int64_t end) {}
  // Whether what arrives is the model's bf16 copy of the weights it reads in bf16, with the
  // master weights only of those it reads as they are (sharing the bf16 copy: half the bytes,
  // and nothing to cast again). The other masters of ranges other ranks own are then stale
  // until masters_needed().
  virtual bool shares_compute_copy() const { return false; }
  // After finish_parameters(), when something reads the master weights themselves (a
  // checkpoint, the end of training): brings every parameter still arriving and every master
  // as its owner holds it, as parameters_needed(0, all) does. Collective: every rank calls
  // it at the same point.
  virtual void masters_needed() {}
};

}  // namespace llmhpc

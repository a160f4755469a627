// ParallelHooks: the one protocol between the model and whatever parallelises it (src/dist).
// The model speaks unit by unit of its parameters (ParameterLayout::units: the embedding, each
// layer, the final norm with the head):
//   before it reads the parameters of unit R (forward, and backward for the units it reads),
//     parameters_needed(R) where they are its own and may still be arriving, or
//     unit_parameters(R, next) where a holder keeps them (ParameterStorage::Sharded), which
//     answers where they are and may start bringing `next`;
//   before backward writes R's gradients, under sharded storage, unit_gradients(R): where;
//   gradients_final(R) when backward has finished the gradients of R;
// and the optimizer reports parameters_updated(R) for each range it owns. Everything a
// strategy does happens behind these calls: data parallelism reduces R's gradients when they
// are final; ZeRO-1 reduce-scatters them, all-gathers the updates and waits for R only when it
// is needed; ZeRO-2 and ZeRO-3 gather R into a place they give the model (UnitView) and
// reduce-scatter R's gradients from the window they gave backward.
// The model never includes comm or dist; dist hooks in here. The halves mirror each other as
// ZeRO splits an all-reduce: gradients reduced as backward finishes them, parameters shared as
// the optimizer finishes them, and waited for as the next forward reaches them.
#pragma once
#include <cstdint>

#include "src/core/tensor.h"
#include "src/model/params.h"

namespace llmhpc {

// Where the model finds one unit's parameters (or writes its gradients) when they are not in
// its own flat buffers (TransformerLM::Config::storage Sharded): each lane of the unit
// (ParamUnit), packed, at least as long as the lane. Parameters: the matrices in the compute
// dtype, the others in the parameter dtype; gradients: both in the gradients' dtype. Empty:
// the model's own buffers.
struct UnitView {
  Tensor matrices, others;
  bool empty() const { return matrices.empty() && others.empty(); }
};

// One training step drives the hooks as run_step (src/model/train_step.h) does:
//   model.forward() -> parameters_needed(...) ...   (only while parameters arrive: below)
//                      or unit_parameters(...) ...  (sharded storage: set_parallel_hooks)
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
  // Sharded parameters: before the model reads the parameters of `unit`, in forward (every
  // unit, in order) and in backward (the units it reads, in reverse order); `next` is the unit
  // it will ask for next in the same pass (none at a pass's end), which a source may start
  // bringing now. Returns where the unit's parameters are, readable by work enqueued after it.
  // A call also says that every read of the units asked for before it is enqueued: a source
  // may reuse their places once that work is done (two places serve a whole pass).
  virtual UnitView unit_parameters(const ParamUnit& unit, const ParamUnit* next) { return {}; }
  // Sharded parameters: before backward writes the gradients of `unit`, where to write them
  // (each lane packed, its padding zero); gradients_final() follows when they are written.
  virtual UnitView unit_gradients(const ParamUnit& unit) { return {}; }
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

#include "src/model/train_step.h"

#include <memory>

#include "src/core/units.h"

namespace llmhpc {

Phase parse_phase(const std::string& text) {
  require_choice(text, {"forward", "forward-backward", "train-step"}, "phase");
  return text == "forward" ? Phase::Forward : text == "forward-backward" ? Phase::ForwardBackward : Phase::TrainStep;
}

const char* phase_name(Phase p) {
  return p == Phase::Forward ? "forward" : p == Phase::ForwardBackward ? "forward-backward" : "train-step";
}

const std::vector<TagCategory>& model_memory_categories() {
  // The tags of transformer.cpp and adamw.cpp.
  static const std::vector<TagCategory> categories = {{"params", {"params"}},
                                                      {"grads", {"grads"}},
                                                      {"optimizer", {"optimizer."}},
                                                      {"activations", {"activations.", "batch."}},
                                                      {"scratch", {"gradients."}}};
  return categories;
}

MemoryBreakdown model_memory(const TracingAllocator& allocator) {
  return allocator.live_by_category(model_memory_categories());
}

namespace {

// AdamW applied to each range of gradients as backward finishes it (GradientStorage::PerRange).
class OptimizerInBackward final : public ParallelHooks {
 public:
  OptimizerInBackward(TransformerLM& model, AdamW& opt) : model_(model), opt_(opt) {}
  void gradients_final(int64_t begin, int64_t end) override { opt_.update({begin, end}, model_.gradients(begin, end)); }

 private:
  TransformerLM& model_;
  AdamW& opt_;
};

}  // namespace

StepTimes run_step(TransformerLM& model, AdamW* opt, Phase phase, Timer& timer, ParallelHooks* listener,
                   const std::function<void(const char*)>& on_phase, const MicroBatches* micro,
                   const std::function<void()>& while_device_runs) {
  auto begin = [&](const char* name) {
    if (on_phase) on_phase(name);
  };
  LLMHPC_CHECK(phase != Phase::TrainStep || opt != nullptr, "train-step needs an optimizer");
  LLMHPC_CHECK(timer.marks() >= kStepMarks, "run_step needs a timer of kStepMarks marks");
  if (model.gradient_storage() == GradientStorage::PerRange) {
    LLMHPC_CHECK(listener == nullptr, "data parallelism needs GradientStorage::Whole");
    // Each range's gradients are gone once its update ran: nothing to add micro-batches into,
    // and no moment for while_device_runs.
    LLMHPC_CHECK((!micro || micro->count == 1) && !while_device_runs,
                 "micro-batches and while_device_runs need GradientStorage::Whole");
    StepTimes t;
    begin("forward");
    timer.mark(0);
    model.forward();
    timer.mark(1);
    if (phase != Phase::Forward) {
      begin("backward");
      std::unique_ptr<OptimizerInBackward> fused;
      if (phase == Phase::TrainStep) {
        opt->begin_step();
        fused = std::make_unique<OptimizerInBackward>(model, *opt);
      }
      model.backward(fused.get());  // forward-backward: each range's gradients computed, then dropped
      timer.mark(2);
      t.backward_ms = timer.elapsed_ms(1, 2);
    }
    t.step_ms = timer.elapsed_ms(0, phase == Phase::Forward ? 1 : 2);
    t.forward_ms = timer.elapsed_ms(0, 1);
    return t;
  }
  const int parts = micro ? micro->count : 1;
  LLMHPC_CHECK(parts == 1 || (phase == Phase::TrainStep && timer.marks() >= step_marks(parts)),
               "micro-batches need a train step and a timer of step_marks(count) marks");
  StepTimes t;
  int last = 0;
  timer.mark(0);
  // Micro-batch i's forward ends at mark forward_end(i) and its backward at forward_end(i) + 1,
  // the last one's at 1 and 2 (where a single batch's are).
  auto forward_end = [&](int i) { return i + 1 == parts ? 1 : kStepMarks + 2 * i; };
  auto backward_end = [&](int i) { return i + 1 == parts ? 2 : kStepMarks + 2 * i + 1; };
  for (int i = 0; i < parts; ++i) {
    const bool final_part = i + 1 == parts;
    if (micro) micro->begin(i);
    begin("forward");
    model.forward();
    timer.mark(last = forward_end(i));
    if (phase != Phase::Forward) {
      begin("backward");
      if (final_part && listener) listener->begin_step();
      model.backward(final_part ? listener : nullptr, i > 0);
      timer.mark(last = backward_end(i));
    }
    if (micro && micro->end) micro->end(i);
  }
  if (phase != Phase::Forward && listener) {
    listener->finish();
    timer.mark(last = 3);
  }
  if (phase == Phase::TrainStep) {
    t.memory_before_optimizer = model_memory(model.device().allocator());
    begin("optimizer");
    opt->step(listener);
    timer.mark(last = 4);
    if (listener) {
      // Parameters from other ranks may still be arriving: the next forward waits for each
      // range as it reaches it (TransformerLM::parameters_arriving), so they overlap it.
      if (listener->finish_parameters()) model.parameters_arriving(*listener);
      timer.mark(last = 5);
    }
  }
  if (while_device_runs) while_device_runs();
  t.step_ms = timer.elapsed_ms(0, last);  // waits for the device
  t.forward_ms = 0;
  if (phase != Phase::Forward) t.backward_ms = 0;
  for (int i = 0; i < parts; ++i) {
    t.forward_ms += timer.elapsed_ms(i == 0 ? 0 : backward_end(i - 1), forward_end(i));
    if (phase != Phase::Forward) t.backward_ms += timer.elapsed_ms(forward_end(i), backward_end(i));
  }
  if (listener && phase != Phase::Forward) t.sync_ms = timer.elapsed_ms(2, 3);
  if (phase == Phase::TrainStep) t.optimizer_ms = timer.elapsed_ms(listener ? 3 : 2, 4);
  if (listener && phase == Phase::TrainStep) t.param_sync_ms = timer.elapsed_ms(4, 5);
  return t;
}

GraphedStep::GraphedStep(TransformerLM& model, AdamW* opt, Phase phase) : model_(model), opt_(opt), phase_(phase) {
  LLMHPC_CHECK(phase != Phase::TrainStep || opt != nullptr, "train-step needs an optimizer");
  LLMHPC_CHECK(phase != Phase::TrainStep || model.gradient_storage() == GradientStorage::Whole,
               "a recorded train step needs GradientStorage::Whole: AdamW inside backward would be recorded with one "
               "step count (the modes refuse a recorded train step that updates inside backward)");
  graph_ = model.device().capture([&] {
    model.forward();
    if (phase != Phase::Forward) model.backward(nullptr);  // forward-backward: gradients computed, then dropped
  });
}

GraphedStep::~GraphedStep() = default;

StepTimes GraphedStep::run(Timer& timer) {
  LLMHPC_CHECK(timer.marks() >= kStepMarks, "GraphedStep needs a timer of kStepMarks marks");
  StepTimes t;
  timer.mark(0);
  graph_->launch();
  model_.forward_replayed();
  timer.mark(1);
  int last = 1;
  if (phase_ == Phase::TrainStep) {
    t.memory_before_optimizer = model_memory(model_.device().allocator());
    opt_->step(nullptr);
    timer.mark(last = 2);
    t.optimizer_ms = timer.elapsed_ms(1, 2);
  }
  t.step_ms = timer.elapsed_ms(0, last);
  if (phase_ == Phase::Forward) t.forward_ms = t.step_ms;
  return t;
}

double model_flops_fwd_bwd(const ModelConfig& c, int64_t batch, int64_t seq) {
  const double tokens = double(batch) * double(seq);
  const double matmul_params = double(c.num_params() - c.vocab_size * c.d_model - c.d_model -
                                      2 * c.num_layers * c.d_model);  // not the embedding, not norm gains
  return 6.0 * matmul_params * tokens + 6.0 * double(c.num_layers) * double(c.d_model) * double(seq) * tokens;
}

}  // namespace llmhpc

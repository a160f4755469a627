#include "src/model/train_step.h"

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

StepTimes run_step(TransformerLM& model, AdamW* opt, Phase phase, Timer& timer, GradientListener* listener) {
  LLMHPC_CHECK(phase != Phase::TrainStep || opt != nullptr, "train-step needs an optimizer");
  LLMHPC_CHECK(timer.marks() >= kStepMarks, "run_step needs a timer of kStepMarks marks");
  StepTimes t;
  int last = 0;
  timer.mark(0);
  model.forward();
  timer.mark(last = 1);
  if (phase != Phase::Forward) {
    if (listener) listener->begin_step();
    model.backward(listener);
    timer.mark(last = 2);
    if (listener) {
      listener->finish();
      timer.mark(last = 3);
    }
  }
  if (phase == Phase::TrainStep) {
    t.memory_before_optimizer = model_memory(model.device().allocator());
    opt->step(listener);
    timer.mark(last = 4);
    if (listener) {
      if (listener->finish_parameters()) model.parameters_changed();
      timer.mark(last = 5);
    }
  }
  t.step_ms = timer.elapsed_ms(0, last);  // waits for the device
  t.forward_ms = timer.elapsed_ms(0, 1);
  if (phase != Phase::Forward) t.backward_ms = timer.elapsed_ms(1, 2);
  if (listener && phase != Phase::Forward) t.sync_ms = timer.elapsed_ms(2, 3);
  if (phase == Phase::TrainStep) t.optimizer_ms = timer.elapsed_ms(listener ? 3 : 2, 4);
  if (listener && phase == Phase::TrainStep) t.param_sync_ms = timer.elapsed_ms(4, 5);
  return t;
}

double model_flops_fwd_bwd(const ModelConfig& c, int64_t batch, int64_t seq) {
  const double tokens = double(batch) * double(seq);
  const double matmul_params = double(c.num_params() - c.vocab_size * c.d_model - c.d_model -
                                      2 * c.num_layers * c.d_model);  // not the embedding, not norm gains
  return 6.0 * matmul_params * tokens + 12.0 * double(c.num_layers) * double(c.d_model) * double(seq) * tokens;
}

}  // namespace llmhpc

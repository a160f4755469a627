// The sweep bench and profile share (src/modes/model_sweep.h).
#include "src/modes/model_sweep.h"

#include <algorithm>

#include "src/core/units.h"
#include "src/modes/options.h"
#include "src/modes/sensors.h"
#include "src/modes/soak.h"

namespace llmhpc {

std::string ModelCase::label() const {
  return shape_label(model) + "_T" + std::to_string(model.context_length) + "_B" + std::to_string(batch) + "_" +
         precision_name(precision) + "_" + attention_name(attention) +
         (grads == GradientDType::BF16 ? "_gradbf16" : "");
}

std::string ModelCase::model_key() const {
  return std::to_string(model.d_model) + "/" + std::to_string(model.d_ff) + "/" + std::to_string(model.num_layers) +
         "/" + std::to_string(model.num_heads) + "/" + std::to_string(model.vocab_size) + "/" +
         precision_name(precision) + "/" + attention_name(attention) + "/" +
         dtype_name(gradient_dtype(precision, grads));
}

void add_step_options(po::options_description& own) {
  own.add_options()("phase", po::value<std::string>()->default_value("train-step"),
                    "what each timed step runs: forward | forward-backward | train-step (+ AdamW)")(
      "warmup", po::value<std::string>()->default_value("5"), "untimed steps before the timed ones (recorded apart)")(
      "steps", po::value<std::string>()->default_value("10"), "timed steps per configuration")(
      "cuda-graph", po::bool_switch(),
      "record forward (+ backward) once after the warm-up as a CUDA graph and replay it each step: "
      "one launch instead of hundreds, for steps the host's launches hold back (CUDA; AdamW runs "
      "after it as a phase of its own: always in profile, with --separate-optimizer in bench, whose "
      "train-step needs it)");
}

void add_model_group(po::options_description& desc) {
  po::options_description model("Model options");
  add_model_options(model, ListUse{});
  add_precision_options(model, ListUse{});
  desc.add(model);
}

StepOptions parse_step_options(const po::variables_map& vm) {
  StepOptions o;
  o.phase = parse_phase(opt_string(vm, "phase"));
  o.warmup = opt_nonnegative(vm, "warmup");
  o.heat_s = heat_seconds(vm);
  o.cuda_graph = opt_flag(vm, "cuda-graph");
  if (o.cuda_graph) {
    if (opt_string(vm, "device") == "cpu") throw UsageError(kCudaGraphNeedsCuda);
    if (o.phase == Phase::TrainStep && vm.count("separate-optimizer") && !opt_flag(vm, "separate-optimizer"))
      throw UsageError("--cuda-graph with --phase train-step needs --separate-optimizer: AdamW inside backward "
                       "would be recorded with one step count (or use --phase forward-backward)");
  }
  o.steps = opt_positive(vm, "steps");
  o.cases = model_cases(vm);
  o.memory = memory_plan(vm);
  o.seed = uint64_t(opt_int(vm, "seed"));
  return o;
}

std::vector<ModelCase> model_cases(const po::variables_map& vm) {
  const std::vector<ModelConfig> configs = model_configs(vm);  // sizes x contexts, context fastest
  const size_t contexts = split_list(opt_string(vm, "context-length"), "context-length").size();
  const GradientDType grads = grad_dtype(vm);
  std::vector<ModelCase> cases;
  for (size_t first = 0; first < configs.size(); first += contexts)
    for (Precision p : precisions(vm))
      for (AttentionKind a : attentions(vm))
        for (size_t k = first; k < first + contexts; ++k)
          for (int64_t b : batch_sizes(vm)) cases.push_back({configs[k], b, p, a, grads});
  return cases;
}

void check_cases_run(const ModeContext& ctx, const std::vector<ModelCase>& cases) {
  Ops& ops = *ctx.backend.ops;
  collective_check(ctx.rt, [&] {
    for (const ModelCase& c : cases) {
      ops.attention_saved({1, 1, 1, 2, true, c.attention}, compute_dtype(c.precision));
    }
  });
  std::vector<Precision> wanted;
  for (const ModelCase& c : cases) wanted.push_back(c.precision);
  note_cpu_bf16(ctx, wanted);
}

void add_case_attrs(Record& rec, const ModelCase& c, Phase phase, MemoryPlan memory, int64_t warmup, int64_t steps) {
  add_shape_attrs(rec, c.model);
  rec.attr("batch_size", c.batch)
      .attr("precision", std::string(precision_name(c.precision)))
      .attr("attention", std::string(attention_name(c.attention)))
      .attr("phase", std::string(phase_name(phase)))
      .attr("low_memory", int64_t(memory == MemoryPlan::LowMemory ? 1 : 0))
      .attr("grad_dtype", std::string(dtype_name(gradient_dtype(c.precision, c.grads))))
      .attr("warmup", warmup)
      .attr("steps", steps)
      .attr("num_params", c.model.num_params())
      .attr("model_flops_fwd_bwd", model_flops_fwd_bwd(c.model, c.batch, c.model.context_length));
}

void StepSamples::add(const StepTimes& t) {
  if (!std::isnan(t.forward_ms)) forward.push_back(t.forward_ms);  // not split apart in a graph's replay
  if (!std::isnan(t.backward_ms)) backward.push_back(t.backward_ms);
  if (!std::isnan(t.optimizer_ms)) optimizer.push_back(t.optimizer_ms);
  step.push_back(t.step_ms);
}

void StepSamples::record(Record& r, const std::string& prefix) const {
  r.add(prefix + "forward_ms", forward);
  if (!backward.empty()) r.add(prefix + "backward_ms", backward);
  if (!optimizer.empty()) r.add(prefix + "optimizer_ms", optimizer);
  r.add(prefix + "step_ms", step);
}

void LiveModel::release_unless_shared(const std::vector<ModelCase>& cases, size_t i) {
  if (key_ == cases[i].model_key()) return;
  opt_.reset();
  model_.reset();
  key_ = cases[i].model_key();
}

TransformerLM& LiveModel::prepare(const std::vector<ModelCase>& cases, size_t i, Device& dev, Ops& ops, uint64_t seed,
                                  MemoryPlan memory, GradientStorage gradients, Phase phase, Record& rec,
                                  const TensorParallel& split) {
  const ModelCase& c = cases[i];
  if (!model_) {  // sized for the longest context among the cases that will share it
    ModelConfig shape = c.model;
    for (size_t k = i; k < cases.size() && cases[k].model_key() == key_; ++k)
      shape.context_length = std::max(shape.context_length, cases[k].model.context_length);
    model_ = std::make_unique<TransformerLM>(TransformerLM::Config{shape, c.precision, c.attention, memory, 0,
                                                                   gradients, c.grads, ParameterStorage::Local, split},
                                             dev, ops);
    model_->init_parameters(seed);
    if (phase == Phase::TrainStep) {  // its state now, so that no timed step allocates it
      opt_ = std::make_unique<AdamW>(*model_, ops, AdamWHyper{});
      opt_->allocate_state();
    }
  }
  const AttentionDims dims{c.batch,    c.model.context_length, c.model.num_heads / split.size, c.model.head_dim(), true,
                           c.attention};
  for (const auto& [name, value] : ops.attention_variant(dims, compute_dtype(c.precision))) rec.attr(name, value);
  set_random_batch(*model_, c.batch, c.model.context_length, seed);
  return *model_;
}

}  // namespace llmhpc

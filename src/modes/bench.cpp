// Mode bench: times forward, backward and the optimizer step of the model for every
// configuration of a sweep (sizes x precisions x attentions x context lengths x batch
// sizes, in that order). Every rank benchmarks its own device; each configuration is one
// record with the raw per-step times. An out-of-memory is recorded as status "oom" and
// the sweep goes on. Configurations that differ only in context length or batch size
// share one model, initialised once (a 2.7B initialisation takes seconds).
#include "src/core/random.h"
#include "src/core/stats.h"
#include "src/core/units.h"
#include "src/model/train_step.h"
#include "src/modes/options.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

struct BenchCase {
  ModelConfig model;
  int64_t batch;
  Precision precision;
  AttentionKind attention;

  std::string label() const {
    return shape_label(model) + "_T" + std::to_string(model.context_length) + "_B" + std::to_string(batch) + "_" +
           precision_name(precision) + "_" + attention_name(attention);
  }
};

struct Samples {
  std::vector<double> forward, backward, optimizer, step;
  void add(const StepTimes& t) {
    forward.push_back(t.forward_ms);
    if (!std::isnan(t.backward_ms)) backward.push_back(t.backward_ms);
    if (!std::isnan(t.optimizer_ms)) optimizer.push_back(t.optimizer_ms);
    step.push_back(t.step_ms);
  }
  void record(Record& r, const std::string& prefix) const {
    r.add(prefix + "forward_ms", forward);
    if (!backward.empty()) r.add(prefix + "backward_ms", backward);
    if (!optimizer.empty()) r.add(prefix + "optimizer_ms", optimizer);
    r.add(prefix + "step_ms", step);
  }
};

std::vector<BenchCase> sweep(const po::variables_map& vm) {
  const std::vector<ModelConfig> configs = model_configs(vm);  // sizes x contexts, context fastest
  const size_t contexts = split_list(opt_string(vm, "context-length"), "context-length").size();
  std::vector<BenchCase> cases;
  for (size_t first = 0; first < configs.size(); first += contexts)
    for (Precision p : precisions(vm))
      for (AttentionKind a : attentions(vm))
        for (size_t k = first; k < first + contexts; ++k)
          for (int64_t b : batch_sizes(vm)) cases.push_back({configs[k], b, p, a});
  return cases;
}

// Cases with the same key can share a model: same shape, precision and attention.
std::string model_key(const BenchCase& c) {
  return std::to_string(c.model.d_model) + "/" + std::to_string(c.model.d_ff) + "/" +
         std::to_string(c.model.num_layers) + "/" + std::to_string(c.model.num_heads) + "/" +
         std::to_string(c.model.vocab_size) + "/" + precision_name(c.precision) + "/" + attention_name(c.attention);
}

// The model (and optimizer) of the current run of cases with one key.
struct LiveModel {
  std::string key;
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<AdamW> opt;
};

void add_options(po::options_description& desc) {
  po::options_description bench("Bench options");
  bench.add_options()("phase", po::value<std::string>()->default_value("train-step"),
                      "what each timed step runs: forward | forward-backward | train-step (+ AdamW)")(
      "warmup", po::value<std::string>()->default_value("5"), "untimed steps before the timed ones (recorded apart)")(
      "steps", po::value<std::string>()->default_value("10"), "timed steps per configuration");
  po::options_description model("Model options");
  add_model_options(model, true);
  add_precision_options(model, true);
  add_gradient_options(model);
  desc.add(bench).add(model);
}

void validate(const po::variables_map& vm) {
  parse_phase(opt_string(vm, "phase"));
  opt_nonnegative(vm, "warmup");
  opt_positive(vm, "steps");
  sweep(vm);
}

void run(ModeContext& ctx) {
  const po::variables_map& vm = ctx.vm;
  const Phase phase = parse_phase(opt_string(vm, "phase"));
  const int64_t warmup = opt_nonnegative(vm, "warmup"), steps = opt_positive(vm, "steps");
  const std::vector<BenchCase> cases = sweep(vm);
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  const uint64_t seed = uint64_t(opt_int(vm, "seed"));
  const MemoryPlan memory = memory_plan(vm);
  const GradientStorage gradients = gradient_storage(vm);

  // Configurations the backend cannot run at all are an error before anything starts.
  collective_check(ctx.rt, [&] {
    for (const BenchCase& c : cases) {
      if (c.precision == Precision::BF16 && dev.kind() == DeviceKind::Cpu)
        throw UsageError("--precision bf16 needs --device cuda (the CPU backend computes in fp32 or fp64)");
      ops.attention_saved({1, 1, 1, 2, true, c.attention}, compute_dtype(c.precision));
    }
  });

  log_root(ctx.rt, "bench: %zu configuration(s), phase %s, %lld warm-up + %lld timed steps, %d rank(s) on %s%s\n",
           cases.size(), phase_name(phase), (long long)warmup, (long long)steps, ctx.rt.world_size, dev.name().c_str(),
           memory == MemoryPlan::LowMemory ? ", --low-memory" : "");
  Sweep sweep(ctx, "bench", cases.size(),
              {"Model", "d_model", "d_ff", "layers", "heads", "ctx", "batch", "prec", "attn", "Fwd mean", "Fwd std",
               "Bwd mean", "Bwd std", "Opt mean", "Opt std", "Total", "status"});
  auto timer = dev.make_timer(kStepMarks);
  LiveModel live;
  for (size_t i = 0; i < cases.size(); ++i) {
    const BenchCase& c = cases[i];
    if (live.key != model_key(c)) {  // free the previous model before building the next
      live.opt.reset();
      live.model.reset();
      live.key = model_key(c);
    }
    Record rec;
    rec.group = "bench/" + c.label();
    add_shape_attrs(rec, c.model);
    rec.attr("batch_size", c.batch)
        .attr("precision", std::string(precision_name(c.precision)))
        .attr("attention", std::string(attention_name(c.attention)))
        .attr("phase", std::string(phase_name(phase)))
        .attr("low_memory", int64_t(memory == MemoryPlan::LowMemory ? 1 : 0))
        .attr("separate_optimizer", int64_t(gradients == GradientStorage::Whole ? 1 : 0))
        .attr("warmup", warmup)
        .attr("steps", steps)
        .attr("num_params", c.model.num_params())
        .attr("model_flops_fwd_bwd", model_flops_fwd_bwd(c.model, c.batch, c.model.context_length));
    Samples warm, timed;
    dev.allocator().reset_peak();
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          if (!live.model) {  // sized for the longest context among the cases that will share it
            ModelConfig shape = c.model;
            for (size_t k = i; k < cases.size() && model_key(cases[k]) == live.key; ++k)
              shape.context_length = std::max(shape.context_length, cases[k].model.context_length);
            live.model =
                std::make_unique<TransformerLM>(shape, c.precision, c.attention, dev, ops, memory, 0, gradients);
            live.model->init_parameters(seed);
            if (phase == Phase::TrainStep) {  // its state now, so that no timed step allocates it
              live.opt = std::make_unique<AdamW>(*live.model, ops, AdamWHyper{});
              live.opt->allocate_state();
            }
          }
          TransformerLM& model = *live.model;
          const AttentionDims dims{c.batch,    c.model.context_length, c.model.num_heads, c.model.head_dim(), true,
                                   c.attention};
          for (const auto& [name, value] : ops.attention_variant(dims, compute_dtype(c.precision)))
            rec.attr(name, value);
          const int64_t n = c.batch * c.model.context_length;
          std::vector<int32_t> tokens, targets;
          random_batch(seed, n, c.model.vocab_size, tokens, targets);
          model.set_batch(tokens.data(), targets.data(), c.batch, c.model.context_length);
          for (int64_t s = 0; s < warmup; ++s) warm.add(run_step(model, live.opt.get(), phase, *timer));
          for (int64_t s = 0; s < steps; ++s) timed.add(run_step(model, live.opt.get(), phase, *timer));
          timed.record(rec, "");
          if (warmup > 0) warm.record(rec, "warmup_");
          return fmt(mean(timed.step)) + " ms/step";
        },
        [&](Record& r) { r.attr("peak_memory_bytes", dev.allocator().peak_bytes()); });
    sweep.add_row({c.model.name, std::to_string(c.model.d_model), std::to_string(c.model.d_ff),
                   std::to_string(c.model.num_layers), std::to_string(c.model.num_heads),
                   std::to_string(c.model.context_length), std::to_string(c.batch), precision_name(c.precision),
                   attention_name(c.attention), fmt(mean(timed.forward)), fmt(stddev(timed.forward)),
                   fmt(mean(timed.backward)), fmt(stddev(timed.backward)), fmt(mean(timed.optimizer)),
                   fmt(stddev(timed.optimizer)), fmt(mean(timed.step)), status.column()});
  }
  sweep.print_summary("bench summary (ms, rank 0 of " + std::to_string(ctx.rt.world_size) +
                      "; every rank's raw times are in " + ctx.out_dir + "):");
}

}  // namespace

ModeSpec bench_mode() {
  return {"bench", "time forward, backward and optimizer steps of the model over a sweep", add_options, validate, run};
}

}  // namespace llmhpc

// Mode bench: times forward, backward and the optimizer step of the model for every
// configuration of a sweep (sizes x precisions x attentions x context lengths x batch
// sizes, in that order). Every rank benchmarks its own device; each configuration is one
// record with the raw per-step times. An out-of-memory is recorded as status "oom" and
// the sweep goes on. Configurations that differ only in context length or batch size
// share one model, initialised once (a 2.7B initialisation takes seconds).
#include "src/core/stats.h"
#include "src/modes/model_sweep.h"
#include "src/modes/options.h"
#include "src/modes/soak.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

void add_options(po::options_description& desc) {
  po::options_description bench("Bench options");
  add_step_options(bench);
  add_heat_option(bench);
  add_gradient_options(bench);
  desc.add(bench);
  add_model_group(desc);
}

// Everything bench takes from the command line, parsed and checked once by parse_options
// before any file or device is touched; run() reads only this.
struct BenchOptions {
  StepOptions step;
  GradientStorage gradients = GradientStorage::PerRange;
  GradientDType grads = GradientDType::Master;
};

BenchOptions parse_options(const po::variables_map& vm, int) {
  BenchOptions o;
  o.step = parse_step_options(vm);
  o.gradients = gradient_storage(vm, {o.step.phase});
  o.grads = grad_dtype(vm);
  return o;
}

void run(ModeContext& ctx, const BenchOptions& o) {
  const Phase phase = o.step.phase;
  const int64_t warmup = o.step.warmup, steps = o.step.steps;
  const std::vector<ModelCase>& cases = o.step.cases;
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  const uint64_t seed = o.step.seed;
  const MemoryPlan memory = o.step.memory;
  const GradientStorage gradients = o.gradients;
  const bool graphed = use_cuda_graph(ctx, o.step.cuda_graph);
  const double heat_s = o.step.heat_s;
  check_cases_run(ctx, cases);

  log_root(ctx.rt, "bench: %zu configuration(s), phase %s, %lld warm-up + %lld timed steps, %d rank(s) on %s%s%s%s\n",
           cases.size(), phase_name(phase), (long long)warmup, (long long)steps, ctx.rt.world_size, dev.name().c_str(),
           memory == MemoryPlan::LowMemory ? ", --low-memory" : "", graphed ? ", CUDA graphs" : "",
           (std::string(o.grads == GradientDType::BF16 ? ", bf16 gradients" : "") +
            (heat_s > 0 ? ", each configuration heated for ~" + fmt_exact(heat_s) + " s" : ""))
               .c_str());
  // A train step's AdamW runs inside backward unless --separate-optimizer: the column says so.
  const bool adamw_in_backward = phase == Phase::TrainStep && o.gradients == GradientStorage::PerRange;
  const std::string bwd = adamw_in_backward ? "Bwd+AdamW" : "Bwd";
  Sweep sweep(ctx, "bench", cases.size(),
              {"Model", "d_model", "d_ff", "layers", "heads", "ctx", "batch", "prec", "attn", "Fwd mean", "Fwd std",
               bwd + " mean", bwd + " std", "Opt mean", "Opt std", "Total", "status"});
  auto timer = dev.make_timer(kStepMarks);
  LiveModel live;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ModelCase& c = cases[i];
    live.release_unless_shared(cases, i);  // free the previous model before building the next
    Record rec;
    rec.group = "bench/" + c.label();
    add_case_attrs(rec, c, phase, memory, warmup, steps);
    rec.attr("separate_optimizer", int64_t(gradients == GradientStorage::Whole ? 1 : 0))
        .attr("cuda_graph", int64_t(graphed ? 1 : 0));
    StepSamples warm, timed;
    dev.allocator().reset_peak();
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          TransformerLM& model = live.prepare(cases, i, dev, ops, seed, memory, gradients, phase, rec);
          auto record_steps = [&](Record& r) {
            timed.record(r, "");
            if (warmup > 0) warm.record(r, "warmup_");
          };
          SweepSteps progress(sweep, rec, warmup + steps, "steps", [&](Record& r) {
            record_steps(r);
            keep_timed_steps(r, int64_t(timed.step.size()), steps);
          });
          for (int64_t s = 0; s < warmup; ++s) {
            warm.add(run_step(model, live.optimizer(), phase, *timer));
            progress.done();
          }
          if (heat_s > 0) {  // --heat-s: each rank alone
            rec.attr("heat_steps", heat_up(nullptr, heat_s, 0, [&] {
                       run_step(model, live.optimizer(), phase, *timer);
                       progress.between();
                     }));
            sweep.restart_sensors();  // the record's clocks: the timed steps', not the heat's
          }
          std::unique_ptr<GraphedStep> graph;
          if (graphed) graph = std::make_unique<GraphedStep>(model, live.optimizer(), phase);
          for (int64_t s = 0; s < steps; ++s) {
            timed.add(graph ? graph->run(*timer) : run_step(model, live.optimizer(), phase, *timer));
            progress.done();
          }
          record_steps(rec);
          return fmt(mean(timed.step)) + " ms/step";
        },
        [&](Record& r) {
          r.attr("peak_memory_bytes", dev.allocator().peak_bytes());
          if (r.status != "ok") {  // free what it held; the next configuration builds its own model
            live.release();
          }
        });
    sweep.add_row({c.model.name, std::to_string(c.model.d_model), std::to_string(c.model.d_ff),
                   std::to_string(c.model.num_layers), std::to_string(c.model.num_heads),
                   std::to_string(c.model.context_length), std::to_string(c.batch), precision_name(c.precision),
                   attention_name(c.attention), fmt(mean(timed.forward)), fmt(stddev(timed.forward)),
                   fmt(mean(timed.backward)), fmt(stddev(timed.backward)), fmt(mean(timed.optimizer)),
                   fmt(stddev(timed.optimizer)), fmt(mean(timed.step)), status.column()});
  }
  sweep.print_summary(
      "bench summary (ms, rank 0 of " + std::to_string(ctx.rt.world_size) +
      (adamw_in_backward ? "; AdamW updates each range inside backward: --separate-optimizer times it apart" : "") +
      "; every rank's raw times are in " + ctx.out_dir + "):");
}

}  // namespace

ModeSpec bench_mode() {
  return {"bench", "time forward, backward and optimizer steps of the model over a sweep", add_options,
          [](const po::variables_map& vm, int world_size) -> ModeRun {
            const BenchOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          }};
}

}  // namespace llmhpc

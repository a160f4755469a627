// Mode ddp: the model's train step under each data-parallel strategy (the seeds' naive,
// flat, overlapped and bucketed DDP), timed per rank per step, over sweeps of model sizes x
// precisions x context lengths x global batch sizes x strategies (bucketed once per
// --bucket-mb). Strategy `none` steps each rank on its local batch with no communication at
// all: the compute-only baseline at the same local batch.
//
// Per step: forward, backward, the communication backward did not hide (from the end of
// backward until every gradient is reduced, as the compute stream sees it), the optimizer and
// the whole step; per configuration: what was communicated and the memory at the seeds' three
// points. Configurations that differ only in strategy share one model; each starts from rank
// 0's weights (broadcast), and every rank draws its own random tokens (seeded by rank).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "src/core/random.h"
#include "src/core/stats.h"
#include "src/core/units.h"
#include "src/model/train_step.h"
#include "src/modes/data_parallel.h"
#include "src/modes/options.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// A bucket size as written, shortest exact form: 25, 0.05, 1e-05 (labels must stay distinct).
std::string mib_text(double mb) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", mb);
  return text;
}

struct DdpCase {
  ModelConfig model;
  int64_t batch;  // global
  Precision precision;
  AttentionKind attention;
  SyncStrategy strategy;
  double bucket_mb;  // bucketed only; 0 otherwise

  std::string model_label() const {
    return model.name != "custom" ? model.name
                                  : "d" + std::to_string(model.d_model) + "_ff" + std::to_string(model.d_ff) + "_L" +
                                        std::to_string(model.num_layers) + "_H" + std::to_string(model.num_heads);
  }
  std::string strategy_label() const {
    return strategy == SyncStrategy::Bucketed ? "bucketed" + mib_text(bucket_mb) + "MiB" : sync_strategy_name(strategy);
  }
  std::string label() const {
    return model_label() + "_T" + std::to_string(model.context_length) + "_B" + std::to_string(batch) + "_" +
           precision_name(precision) + "_" + attention_name(attention) + "_" + strategy_label();
  }
  // Cases with the same key share a model: shape, precision and attention.
  std::string model_key() const {
    return std::to_string(model.d_model) + "/" + std::to_string(model.d_ff) + "/" + std::to_string(model.num_layers) +
           "/" + std::to_string(model.num_heads) + "/" + std::to_string(model.vocab_size) + "/" +
           precision_name(precision) + "/" + attention_name(attention);
  }
};

// Sizes, then precisions and attentions, then contexts and batches, strategies innermost (so
// every strategy of one setup runs on one model, side by side in the table).
std::vector<DdpCase> sweep_cases(const po::variables_map& vm, int world_size) {
  const std::vector<ModelConfig> configs = model_configs(vm);  // sizes x contexts, context fastest
  const size_t contexts = split_list(opt_string(vm, "context-length"), "context-length").size();
  const std::vector<double> buckets = bucket_sizes_mb(vm);
  std::vector<DdpCase> cases;
  for (size_t first = 0; first < configs.size(); first += contexts)
    for (Precision p : precisions(vm))
      for (AttentionKind a : attentions(vm))
        for (size_t k = first; k < first + contexts; ++k)
          for (int64_t b : batch_sizes(vm))
            for (SyncStrategy s : sync_strategies(vm, std::max(world_size, 2))) {
              if (s != SyncStrategy::Bucketed) cases.push_back({configs[k], b, p, a, s, 0.0});
              else
                for (double mb : buckets) cases.push_back({configs[k], b, p, a, s, mb});
            }
  return cases;
}

struct Samples {
  std::vector<double> forward, backward, comm, optimizer, step;
  void add(const StepTimes& t) {
    forward.push_back(t.forward_ms);
    backward.push_back(t.backward_ms);
    comm.push_back(std::isnan(t.sync_ms) ? 0.0 : t.sync_ms);
    optimizer.push_back(t.optimizer_ms);
    step.push_back(t.step_ms);
  }
  void record(Record& r, const std::string& prefix) const {
    r.add(prefix + "forward_ms", forward).add(prefix + "backward_ms", backward).add(prefix + "comm_ms", comm);
    r.add(prefix + "optimizer_ms", optimizer).add(prefix + "step_ms", step);
  }
};

// The model and optimizer of the current run of cases with one key, and the live bytes right
// after the model was built (its parameters, gradients and bf16 copy; the seeds' first point).
struct LiveModel {
  std::string key;
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<AdamW> opt;
  int64_t after_init_bytes = 0;
  void reset() {
    opt.reset();
    model.reset();
  }
};

void add_options(po::options_description& desc) {
  po::options_description ddp("DDP options (comma-separated lists sweep)");
  ddp.add_options()
      ("warmup", po::value<std::string>()->default_value("5"), "untimed steps before the timed ones (recorded apart)")
      ("steps", po::value<std::string>()->default_value("10"), "timed steps per configuration");
  add_data_parallel_options(ddp, true);
  po::options_description model("Model options (--batch-size is the global batch, shared equally by the ranks)");
  add_model_options(model, true);
  add_precision_options(model, true);
  desc.add(ddp).add(model);
}

void validate(const po::variables_map& vm) {
  opt_nonnegative(vm, "warmup");
  opt_positive(vm, "steps");
  sweep_cases(vm, 2);
}

double mean_or_nan(const std::vector<double>& v) { return v.empty() ? NAN : mean(v); }

void run(ModeContext& ctx) {
  const po::variables_map& vm = ctx.vm;
  const Runtime& rt = ctx.rt;
  const int64_t warmup = opt_nonnegative(vm, "warmup"), steps = opt_positive(vm, "steps");
  const std::vector<DdpCase> cases = sweep_cases(vm, rt.world_size);
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  const uint64_t seed = uint64_t(opt_int(vm, "seed"));
  const MemoryPlan memory = memory_plan(vm);

  collective_check(rt, [&] {
    for (const DdpCase& c : cases) {
      if (c.precision == Precision::BF16 && dev.kind() == DeviceKind::Cpu)
        throw UsageError("--precision bf16 needs --device cuda (the CPU backend computes in fp32 or fp64)");
      local_batch(c.batch, rt.rank, rt.world_size);
      ops.attention_saved({1, 1, 1, 2, true, c.attention}, compute_dtype(c.precision));
    }
  });
  std::unique_ptr<Communicator> comm = make_gradient_communicator(rt, vm, dev);

  log_root(rt, "ddp: %zu configuration(s), %lld warm-up + %lld timed steps, %d rank(s) on %s, backend %s%s\n",
           cases.size(), (long long)warmup, (long long)steps, rt.world_size, dev.name().c_str(),
           comm->backend_name().c_str(), memory == MemoryPlan::LowMemory ? ", --low-memory" : "");
  Sweep sweep(ctx, "ddp", cases.size(),
              {"model", "ctx", "batch", "prec", "impl", "bucket MiB", "buckets", "Step mean", "Step std", "Comm mean",
               "Comm std", "Comm %", "Slowest step", "MiB/step", "Peak GiB", "status"});
  auto timer = dev.make_timer(kStepMarks);
  LiveModel live;
  for (size_t i = 0; i < cases.size(); ++i) {
    const DdpCase& c = cases[i];
    if (live.key != c.model_key()) {  // free the previous model before building the next
      live.reset();
      live.key = c.model_key();
    }
    const LocalBatch mine = local_batch(c.batch, rt.rank, rt.world_size);
    Record rec;
    rec.group = "ddp/" + c.label();
    rec.attr("model", c.model.name).attr("d_model", c.model.d_model).attr("d_ff", c.model.d_ff)
        .attr("num_layers", c.model.num_layers).attr("num_heads", c.model.num_heads)
        .attr("vocab_size", c.model.vocab_size).attr("context_length", c.model.context_length)
        .attr("batch_size", c.batch).attr("local_batch_size", mine.count).attr("world_size", int64_t(rt.world_size))
        .attr("precision", std::string(precision_name(c.precision)))
        .attr("attention", std::string(attention_name(c.attention)))
        .attr("low_memory", int64_t(memory == MemoryPlan::LowMemory ? 1 : 0))
        .attr("ddp", std::string(sync_strategy_name(c.strategy))).attr("bucket_mb", c.bucket_mb)
        .attr("backend", comm->backend_name()).attr("warmup", warmup).attr("steps", steps)
        .attr("num_params", c.model.num_params())
        .attr("model_flops_fwd_bwd", model_flops_fwd_bwd(c.model, mine.count, c.model.context_length));
    Samples warm, timed;
    std::vector<double> slowest;
    std::unique_ptr<GradientSync> sync;
    SyncStats stats;
    StepTimes last;
    dev.allocator().reset_peak();
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          // Everything that may run out of memory, agreed on before the first collective.
          sweep.agree([&] {
            if (!live.model) {  // sized for the longest context among the cases that will share it
              ModelConfig shape = c.model;
              for (size_t k = i; k < cases.size() && cases[k].model_key() == live.key; ++k)
                shape.context_length = std::max(shape.context_length, cases[k].model.context_length);
              live.model = std::make_unique<TransformerLM>(shape, c.precision, c.attention, dev, ops, memory);
              live.model->init_parameters(seed + uint64_t(rt.rank));  // different per rank: the broadcast must work
              live.after_init_bytes = dev.allocator().live_bytes();
              live.opt = std::make_unique<AdamW>(*live.model, ops, AdamWHyper{});
            }
            const int64_t n = mine.count * c.model.context_length;
            std::vector<int32_t> tokens(n), targets(n);
            for (int64_t k = 0; k < n; ++k) {  // each rank its own batch
              tokens[k] = int32_t(random_bits(seed, 16 * uint64_t(rt.rank) + 1, uint64_t(k)) % uint64_t(c.model.vocab_size));
              targets[k] = int32_t(random_bits(seed, 16 * uint64_t(rt.rank) + 2, uint64_t(k)) % uint64_t(c.model.vocab_size));
            }
            live.model->set_batch(tokens.data(), targets.data(), mine.count, c.model.context_length);
            run_step(*live.model, nullptr, Phase::ForwardBackward, *timer);  // allocates backward's scratch
          });
          TransformerLM& model = *live.model;
          for (const auto& [name, value] :
               ops.attention_variant({mine.count, c.model.context_length, c.model.num_heads, c.model.head_dim(), true,
                                      c.attention},
                                     compute_dtype(c.precision)))
            rec.attr(name, value);
          broadcast_parameters(*comm, model.params());  // every configuration starts from rank 0's weights
          model.parameters_changed();
          if (c.strategy != SyncStrategy::None)
            sync = make_gradient_sync(c.strategy, *comm, model.grads(), param_spans(model.layout()), c.bucket_mb);
          rt.barrier();
          for (int64_t s = 0; s < warmup; ++s) warm.add(run_step(model, live.opt.get(), Phase::TrainStep, *timer, sync.get()));
          for (int64_t s = 0; s < steps; ++s) {
            last = run_step(model, live.opt.get(), Phase::TrainStep, *timer, sync.get());
            timed.add(last);
          }
          slowest = rt.reduce_all(timed.step, HostReduce::Max);
          timed.record(rec, "");
          if (warmup > 0) warm.record(rec, "warmup_");
          rec.add("step_ms_max_over_ranks", slowest);
          if (sync) stats = sync->stats();
          rec.attr("buckets", stats.buckets).attr("collectives_per_step", stats.collectives)
              .attr("comm_bytes_per_step", stats.bytes).attr("collectives_issued_after_backward", stats.issued_in_finish)
              .attr("memory_before_optimizer_bytes", last.live_bytes_before_optimizer)
              .attr("memory_after_optimizer_bytes", dev.allocator().live_bytes());
          return fmt(mean(timed.step)) + " ms/step, exposed comm " + fmt(mean(timed.comm)) + " ms";
        },
        [&](Record& r) {
          r.attr("memory_after_init_bytes", live.after_init_bytes).attr("peak_memory_bytes", dev.allocator().peak_bytes());
        });
    sync.reset();
    const double step = mean_or_nan(timed.step), comm_ms = mean_or_nan(timed.comm);
    sweep.add_row({c.model_label(), std::to_string(c.model.context_length), std::to_string(c.batch),
                   precision_name(c.precision), sync_strategy_name(c.strategy),
                   c.strategy == SyncStrategy::Bucketed ? mib_text(c.bucket_mb) : "-",
                   status.ok() ? std::to_string(stats.buckets) : "-", fmt(step), fmt(stddev(timed.step)), fmt(comm_ms),
                   fmt(stddev(timed.comm)), status.ok() ? fmt(100.0 * comm_ms / step, 1) + "%" : "-",
                   fmt(mean_or_nan(slowest)), status.ok() ? fmt(double(stats.bytes) / double(1 << 20), 1) : "-",
                   fmt(double(dev.allocator().peak_bytes()) / double(1 << 30)), status.column()});
  }
  sweep.print_summary("ddp summary (ms per step, rank 0 of " + std::to_string(rt.world_size) +
                      "; Comm: exposed communication, from the end of backward until the gradients are reduced; "
                      "Slowest step: the slowest rank's step, averaged; every rank's raw times are in " +
                      ctx.out_dir + "):");
}

}  // namespace

ModeSpec ddp_mode() {
  return {"ddp", "data-parallel train step under each gradient synchronisation strategy (naive, flat, overlap, bucketed)",
          add_options, validate, run};
}

}  // namespace llmhpc

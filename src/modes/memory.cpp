// Mode memory: every allocation and free of a step through the device's TracingAllocator,
// with its time, bytes, address, tag and phase, for every configuration of a sweep (sizes x
// precisions x attentions x context lengths x batch sizes x phases). Each configuration
// builds its model inside the trace (phase "init"), runs the warm-up steps ("warmup"), then
// one step whose phases label its events ("forward", "backward", "optimizer"; forward takes the
// activations, backward frees them and its scratch as it ends). Recorded per
// configuration: the events as raw arrays, the live bytes after init, the peak of each phase
// and overall, what the peak is made of (memory_categories()), the largest allocations and
// the bytes of one residual-stream activation. Rank 0 prints the reference memory study's
// table; --snapshot writes the trace as the snapshot pytorch.org/memory_viz opens
// (src/io/memory_snapshot.h). With --tp each rank traces its part of the model, its
// tensor-parallel group stepping together (data parallelism across the groups is left out:
// it adds its gradient buffers, which mode ddp measures).
#include <map>

#include "src/core/units.h"
#include "src/core/watchdog.h"
#include "src/io/memory_snapshot.h"
#include "src/model/train_step.h"
#include "src/modes/data_parallel.h"
#include "src/modes/memory_trace.h"
#include "src/modes/model_sweep.h"
#include "src/modes/options.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// Bench's configuration, once per --tp and --phase.
struct MemoryCase : ModelCase {
  int tp;
  bool sequence_parallel;
  int tp_overlap;  // --tp-overlap: chunks of forward's products (tp > 1)
  Phase phase;
  std::string label() const {
    return ModelCase::label() + tensor_parallel_label(tp, sequence_parallel, tp_overlap) + "_" + phase_name(phase);
  }
};

std::vector<Phase> phases(const po::variables_map& vm) {
  return opt_list(vm, "phase", [](const std::string& p) { return parse_phase(p); });
}

std::vector<MemoryCase> sweep_cases(const po::variables_map& vm, int world_size) {
  const TensorParallelSweep tps = tensor_parallel_sweep(vm);
  std::vector<MemoryCase> cases;
  for (const ModelCase& c : model_cases(vm))
    for (int tp : tps.sizes) {
      const bool sp = tps.sequence_parallel_at(tp);
      for (int overlap : tps.overlaps_at(tp)) {
        check_tensor_parallel_case(c.model, world_size, tp, sp, overlap, c.batch * c.model.context_length);
        for (Phase ph : phases(vm)) cases.push_back({c, tp, sp, overlap, ph});
      }
    }
  return cases;
}

// FILE for one configuration, FILE with the label before its extension for several.
std::string snapshot_path(const std::string& file, const std::string& label, bool several) {
  if (!several) return file;
  const size_t slash = file.find_last_of('/'), dot = file.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return has_ext ? file.substr(0, dot) + "." + label + file.substr(dot) : file + "." + label;
}

void add_options(po::options_description& desc) {
  po::options_description mem("Memory options");
  mem.add_options()("phase", po::value<std::string>()->default_value("forward,train-step"),
                    "what the traced step runs: forward | forward-backward | train-step (a list sweeps)")(
      "warmup", po::value<std::string>()->default_value("1"), "steps after init and before the traced step")(
      "top", po::value<std::string>()->default_value("10"), "how many of the largest allocations to keep and print")(
      "snapshot", po::value<std::string>(),
      "write the trace as FILE.pickle for pytorch.org/memory_viz (rank 0; with several configurations, one file "
      "each, the configuration's label inserted before the extension)");
  po::options_description model("Model options");
  add_model_options(model, ListUse{});
  add_precision_options(model, ListUse{});
  add_gradient_options(model);
  add_tensor_parallel_options(model, ListUse{});
  desc.add(mem).add(model);
}

// Everything mode memory takes from the command line, parsed and checked once (the same verdict
// on every rank) before any file or device is touched; run() reads only this.
struct MemoryOptions {
  std::vector<MemoryCase> cases;
  std::vector<Precision> precisions;  // --precision, in order: the columns of the peak table
  int64_t warmup = 0, top = 0;
  std::string snapshot;  // "" when not given
  uint64_t seed = 0;
  MemoryPlan memory = MemoryPlan::Fast;
  GradientStorage gradients = GradientStorage::PerRange;
  GradientDType grads = GradientDType::Master;
  std::string backend;  // --backend as given
};

MemoryOptions parse_options(const po::variables_map& vm, int world_size) {
  MemoryOptions o;
  o.warmup = opt_nonnegative(vm, "warmup");
  o.top = opt_positive(vm, "top");
  if (opt_given(vm, "snapshot") && opt_string(vm, "snapshot").empty())
    throw UsageError("--snapshot needs a file name (FILE.pickle)");
  o.snapshot = opt_string(vm, "snapshot");
  o.cases = sweep_cases(vm, world_size);
  o.precisions = precisions(vm);
  o.seed = uint64_t(opt_int(vm, "seed"));
  o.memory = memory_plan(vm);
  o.gradients = gradient_storage(vm, phases(vm));
  o.grads = grad_dtype(vm);
  o.backend = opt_string(vm, "backend");
  return o;
}

std::string gib(int64_t bytes) { return fmt(double(bytes) / double(int64_t(1) << 30)); }

void record_trace(Record& rec, const std::vector<LiveAllocation>& at_start, const std::vector<AllocEvent>& events,
                  double start_ms) {
  std::vector<double> time;
  std::vector<int64_t> delta, live, address;
  std::vector<std::string> tag, phase, category;
  int64_t sum = 0;
  auto row = [&](double t, int64_t d, uint64_t a, const std::string& g, const std::string& p) {
    sum += d;
    time.push_back(t);
    delta.push_back(d);
    live.push_back(sum);
    address.push_back(int64_t(a));
    tag.push_back(g);
    phase.push_back(p);
    category.push_back(tag_category(g, memory_categories()));
  };
  for (const LiveAllocation& a : at_start) row(0.0, a.bytes, a.address, a.tag, "before the trace");
  for (const AllocEvent& e : events) row(e.time_ms - start_ms, e.delta, e.address, e.tag, e.phase);
  rec.add("event_time_ms", time).add("event_delta_bytes", delta).add("event_live_bytes", live);
  rec.add("event_address", address).add("event_tag", tag).add("event_phase", phase).add("event_category", category);
}

void record_summary(Record& rec, const TraceSummary& s, const std::vector<PhaseMark>& marks, double start_ms) {
  std::vector<std::string> names, cats, tags, tag_cats, tag_phases;
  std::vector<double> starts;
  std::vector<int64_t> at_start, peaks, at_end, cat_bytes, sizes;
  for (size_t k = 0; k < s.phases.size(); ++k) {
    names.push_back(s.phases[k].name);
    starts.push_back(marks[k].time_ms - start_ms);
    at_start.push_back(s.phases[k].live_at_start);
    peaks.push_back(s.phases[k].peak);
    at_end.push_back(s.phases[k].live_at_end);
  }
  for (const auto& [name, bytes] : s.at_peak.bytes) cats.push_back(name), cat_bytes.push_back(bytes);
  for (const TraceAllocation& a : s.largest) {
    sizes.push_back(a.bytes);
    tags.push_back(a.tag);
    tag_cats.push_back(a.category);
    tag_phases.push_back(a.phase);
  }
  rec.add("phase_name", names).add("phase_start_ms", starts).add("phase_live_at_start_bytes", at_start);
  rec.add("phase_peak_bytes", peaks).add("phase_live_at_end_bytes", at_end);
  rec.add("peak_category", cats).add("peak_category_bytes", cat_bytes);
  rec.add("largest_bytes", sizes).add("largest_tag", tags).add("largest_category", tag_cats);
  rec.add("largest_phase", tag_phases);
  rec.attr("peak_memory_bytes", s.peak)
      .attr("peak_phase", s.peak_phase)
      .attr("peak_time_ms", s.peak_ms - start_ms)
      .attr("live_at_start_bytes", s.live_at_start)
      .attr("live_at_end_bytes", s.live_at_end)
      .attr("trace_balanced", int64_t(s.balanced ? 1 : 0));
}

int64_t phase_value(const TraceSummary& s, const std::string& name, bool peak) {
  for (const PhaseMemory& p : s.phases)
    if (p.name == name) return peak ? p.peak : p.live_at_end;
  return -1;
}

void print_details(const TraceSummary& s) {
  TextTable phases({"phase", "live at start (GiB)", "peak (GiB)", "live at end (GiB)"});
  for (const PhaseMemory& p : s.phases) phases.add_row({p.name, gib(p.live_at_start), gib(p.peak), gib(p.live_at_end)});
  std::printf("\nmemory by phase:\n");
  phases.print();
  TextTable cats({"at the peak", "GiB", "share"});
  for (const auto& [name, bytes] : s.at_peak.bytes)
    cats.add_row({name, gib(bytes), fmt(s.peak > 0 ? 100.0 * double(bytes) / double(s.peak) : 0.0, 1) + "%"});
  cats.add_row({"total", gib(s.peak), "100.0%"});
  std::printf("\nthe peak (%s GiB, phase %s) by category:\n", gib(s.peak).c_str(), s.peak_phase.c_str());
  cats.print();
  TextTable largest({"largest allocations", "MiB", "category", "phase"});
  for (const TraceAllocation& a : s.largest)
    largest.add_row({a.tag, fmt(double(a.bytes) / double(1 << 20)), a.category, a.phase});
  std::printf("\n");
  largest.print();
}

void run(ModeContext& ctx, const MemoryOptions& o) {
  const std::vector<MemoryCase>& cases = o.cases;
  const int64_t warmup = o.warmup, top = o.top;
  const std::string& snapshot = o.snapshot;
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  TracingAllocator& alloc = dev.allocator();
  const uint64_t seed = o.seed;
  const MemoryPlan memory = o.memory;

  check_cases_run(ctx, std::vector<ModelCase>(cases.begin(), cases.end()));
  collective_check(ctx.rt, [&] {
    // Rank 0 writes the snapshots, one per configuration, beside the name given.
    if (!snapshot.empty() && ctx.rt.is_root()) {
      check_output_file("--snapshot", snapshot);  // the name given, then each one written
      for (const MemoryCase& c : cases)
        check_new_output_file("--snapshot", snapshot_path(snapshot, c.label(), cases.size() > 1));
    }
  });
  // One layout per --tp, made before the traces: the communicators' memory is NCCL's, not the
  // allocator's.
  std::map<int, std::unique_ptr<TensorParallelMesh>> meshes;
  for (const MemoryCase& c : cases)
    if (!meshes.count(c.tp)) meshes[c.tp] = make_tensor_parallel_mesh(ctx.rt, c.tp, o.backend, dev);

  log_root(ctx.rt, "memory: %zu configuration(s), %lld warm-up step(s) before the traced one, %d rank(s) on %s%s%s%s\n",
           cases.size(), (long long)warmup, ctx.rt.world_size, dev.name().c_str(),
           memory == MemoryPlan::LowMemory ? ", --low-memory" : "",
           o.gradients == GradientStorage::Whole ? ", --separate-optimizer" : "",
           o.grads == GradientDType::BF16 ? ", bf16 gradients" : "");
  Sweep sweep(ctx, "memory", cases.size(),
              {"Model", "ctx", "batch", "prec", "attn", "phase", "init GiB", "fwd peak", "bwd peak", "opt peak",
               "peak GiB", "resid MiB", "largest", "status"});
  auto timer = dev.make_timer(kStepMarks);
  std::map<std::string, std::map<std::string, std::string>> peak_table;  // row -> precision -> peak
  std::vector<std::string> row_order;
  TraceSummary last;
  for (const MemoryCase& c : cases) {
    const TensorParallelMesh& mesh = *meshes.at(c.tp);
    // Under tensor parallelism AdamW runs after backward: the gradients of the parts are made
    // whole by the group's collectives during backward, not range by range. A forward makes
    // none: its model holds no gradient buffer, as a PyTorch forward holds none.
    const GradientStorage gradients = c.phase == Phase::Forward ? GradientStorage::PerRange
                                      : c.tp > 1                ? GradientStorage::Whole
                                                                : o.gradients;
    Record rec;
    rec.group = "memory/" + c.label();
    const int64_t resid_bytes = c.batch * c.model.context_length / (c.sequence_parallel ? c.tp : 1) * c.model.d_model *
                                int64_t(dtype_size(param_dtype(c.precision)));
    add_shape_attrs(rec, c.model);
    rec.attr("batch_size", c.batch)
        .attr("precision", std::string(precision_name(c.precision)))
        .attr("attention", std::string(attention_name(c.attention)))
        .attr("phase", std::string(phase_name(c.phase)))
        .attr("low_memory", int64_t(memory == MemoryPlan::LowMemory ? 1 : 0))
        .attr("grad_dtype", std::string(dtype_name(gradient_dtype(c.precision, c.grads))))
        .attr("separate_optimizer", int64_t(gradients == GradientStorage::Whole ? 1 : 0))
        .attr("warmup", warmup)
        .attr("num_params", c.model.num_params())
        .attr("tp", int64_t(c.tp))
        .attr("tp_rank", int64_t(mesh.ranks.place.tp_rank))
        .attr("sequence_parallel", int64_t(c.sequence_parallel ? 1 : 0))
        .attr("tp_overlap", int64_t(c.tp_overlap))
        .attr("residual_activation_bytes", resid_bytes);

    std::unique_ptr<TransformerLM> model;
    std::unique_ptr<AdamW> opt;
    std::vector<PhaseMark> marks;
    auto mark = [&](const std::string& name) {
      alloc.set_phase(name);
      marks.push_back({name, alloc.now_ms(), alloc.live_bytes()});
    };
    alloc.set_recording(false);
    alloc.clear_events();
    const std::vector<LiveAllocation> at_start = alloc.live_allocations();
    const double start_ms = alloc.now_ms();
    alloc.reset_peak();
    alloc.set_recording(true);
    TraceSummary summary;
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          mark("init");
          model = std::make_unique<TransformerLM>(
              TransformerLM::Config{c.model, c.precision, c.attention, memory, 0, gradients, c.grads,
                                    ParameterStorage::Local, mesh.model_config(c.sequence_parallel, c.tp_overlap)},
              dev, ops);
          model->init_parameters(seed);
          if (c.phase == Phase::TrainStep) {
            opt = std::make_unique<AdamW>(*model, ops, AdamWHyper{});
            opt->allocate_state();
          }
          set_random_batch(*model, c.batch, c.model.context_length, seed);
          if (warmup > 0) mark("warmup");
          // A forward-only step takes its activations again, as every step of the others does:
          // the traced forward's events are its own, not the first warm-up's. Each step is
          // one of the watchdog's, so a tensor-parallel group's arrivals are recorded.
          auto begin_step = [&](int64_t s) {
            if (c.phase == Phase::Forward) model->release_activations();
            Watchdog::instance().set_step(s);
          };
          for (int64_t s = 0; s < warmup; ++s) {
            begin_step(s);
            run_step(*model, opt.get(), c.phase, *timer);
          }
          begin_step(warmup);
          run_step(*model, opt.get(), c.phase, *timer, nullptr, [&](const char* name) { mark(name); });
          dev.synchronize();
          return gib(alloc.peak_bytes()) + " GiB peak";
        },
        [&](Record& r) {
          alloc.set_recording(false);
          summary = summarize_trace(at_start, alloc.events(), marks, alloc.live_bytes(), size_t(top));
          LLMHPC_CHECK(summary.peak == alloc.peak_bytes(), "the trace's peak differs from the allocator's");
          record_trace(r, at_start, alloc.events(), start_ms);
          record_summary(r, summary, marks, start_ms);
          if (!snapshot.empty() && ctx.rt.is_root()) {
            const std::string path = snapshot_path(snapshot, c.label(), cases.size() > 1);
            write_snapshot_file(path, memory_snapshot(at_start, alloc.events(), memory_categories(), start_ms));
            r.attr("snapshot", path);
          }
          if (r.status != "ok") {  // traced; freed before the sweep checks that a failure left nothing
            opt.reset();
            model.reset();
          }
        });
    opt.reset();
    model.reset();
    alloc.clear_events();
    alloc.set_phase("");
    last = summary;

    const bool ok = status.ok();
    const std::string largest = ok && !summary.largest.empty()
                                    ? summary.largest.front().tag + " " +
                                          fmt(double(summary.largest.front().bytes) / double(1 << 20), 1) + " MiB"
                                    : "-";
    auto phase_gib = [&](const char* name, bool peak) {
      const int64_t v = ok ? phase_value(summary, name, peak) : -1;
      return v < 0 ? std::string("-") : gib(v);
    };
    const std::string model_name = c.model.name + tensor_parallel_label(c.tp, c.sequence_parallel, c.tp_overlap);
    sweep.add_row({model_name, std::to_string(c.model.context_length), std::to_string(c.batch),
                   precision_name(c.precision), attention_name(c.attention), phase_name(c.phase),
                   phase_gib("init", false), phase_gib("forward", true), phase_gib("backward", true),
                   phase_gib("optimizer", true), ok ? gib(summary.peak) : "-",
                   fmt(double(resid_bytes) / double(1 << 20)), largest, status.column()});
    const std::string row = model_name + "|" + phase_name(c.phase) + "|" + std::to_string(c.model.context_length) +
                            "|" + std::to_string(c.batch) + "|" + attention_name(c.attention);
    if (!peak_table.count(row)) row_order.push_back(row);
    peak_table[row][precision_name(c.precision)] = ok ? gib(summary.peak) : status.column();
  }
  sweep.print_summary("memory summary (GiB of the device allocator, rank 0 of " + std::to_string(ctx.rt.world_size) +
                      "; every event is in " + ctx.out_dir + "):");
  if (!ctx.rt.is_root()) return;
  if (cases.size() == 1) {
    if (!last.phases.empty()) print_details(last);
    return;
  }
  const std::vector<Precision>& precs = o.precisions;
  std::vector<std::string> header = {"Model", "phase", "ctx", "batch", "attn"};
  for (Precision p : precs) header.push_back(std::string("peak ") + precision_name(p) + " (GiB)");
  TextTable table(header);
  for (const std::string& row : row_order) {
    std::vector<std::string> cells;
    for (size_t a = 0, b = 0; b != std::string::npos; a = b + 1) {
      b = row.find('|', a);
      cells.push_back(row.substr(a, b == std::string::npos ? b : b - a));
    }
    for (Precision p : precs)
      cells.push_back(peak_table[row].count(precision_name(p)) ? peak_table[row][precision_name(p)] : "-");
    table.add_row(cells);
  }
  std::printf("\npeak memory by context length x precision (the reference memory study's table):\n");
  table.print();
}

}  // namespace

ModeSpec memory_mode() {
  return {"memory",
          "trace every allocation of a step: peaks per phase, by category, largest allocations, memory_viz snapshot",
          add_options, [](const po::variables_map& vm, int world_size) -> ModeRun {
            const MemoryOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          }};
}

}  // namespace llmhpc

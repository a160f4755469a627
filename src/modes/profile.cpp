// Mode profile: bench's sweep (src/modes/model_sweep.h), with every kernel (CUDA, from CUPTI)
// or op (CPU, timed on the host) of the measured steps attributed to the innermost phase the
// model was in when it launched it (kernels/profiler.h); the reference nsys study's tables.
//
// Per configuration, on every rank: warm-up steps (untraced), then `steps` traced steps inside
// the profiler's window, with `steps` untraced steps (the baseline for the overhead) split
// around it, half before and half after, so that a drift of the clocks or of the host during
// the configuration weighs on both sides; the overhead compares medians, and the drift between
// the two halves says how far the host's own step time moved meanwhile. Every
// activity goes, as it arrives, to the rank file's stream /profile_kernels/<label>, to the
// trace (--trace) and to the report; the record /profile/<label> holds the step times of both
// runs and the profiler's tables (names, phases, ranges). Rank 0 prints the report
// (src/modes/profile_report.h). Without CUPTI (or with --no-cupti) the window has only phases,
// timed with device events, and the report says so. With --tp each configuration also runs as
// each rank's part of a tensor-parallel group (every --tp value, the model's sweep inside each):
// the group's collectives, NCCL's kernels, are activities of category communication.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "src/core/nvtx.h"
#include "src/core/units.h"
#include "src/io/chrome_trace.h"
#include "src/modes/data_parallel.h"
#include "src/modes/model_sweep.h"
#include "src/modes/options.h"
#include "src/modes/profile_report.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// The trace's tracks within a configuration's process.
constexpr int64_t kHostPhasesTid = 1, kDevicePhasesTid = 2, kFirstStreamTid = 10;

// Rows of the activity stream buffered between writes: 2 MiB of memory, and of disk for a short
// stream (HDF5 allocates a chunk whole); some 40 batches for a window of 2.7B's kernels.
constexpr int64_t kStreamBufferRows = int64_t(1) << 14;

// The columns of /profile_kernels/<label>, one row per activity (docs/hdf5-schema.md).
const std::vector<Column> kActivityColumns = {
    {"kind", ColumnType::Int},    {"name", ColumnType::Int},    {"phase", ColumnType::Int},
    {"range", ColumnType::Int},   {"step", ColumnType::Int},    {"start_ns", ColumnType::Int},
    {"end_ns", ColumnType::Int},  {"stream", ColumnType::Int},  {"correlation", ColumnType::Int},
    {"grid_x", ColumnType::Int},  {"grid_y", ColumnType::Int},  {"grid_z", ColumnType::Int},
    {"block_x", ColumnType::Int}, {"block_y", ColumnType::Int}, {"block_z", ColumnType::Int},
    {"bytes", ColumnType::Int}};

// Where a window's activities go: the rank file's stream, the report and the trace. Called by
// the profiler under its lock (kernels/profiler.h), so it may read the profiler's tables.
class Collector final : public ActivitySink {
 public:
  Collector(const Profiler& p, RecordStream& stream, ProfileReport& report, ChromeTrace* trace, int64_t pid)
      : p_(p), stream_(stream), report_(report), trace_(trace), pid_(pid) {}

  void on_activity(const Activity& a) override {
    stream_.append(int64_t(a.kind), a.name, a.phase, a.range, a.step, a.start_ns, a.end_ns, a.stream, a.correlation,
                   a.grid[0], a.grid[1], a.grid[2], a.block[0], a.block[1], a.block[2], a.bytes);
    report_.add(a);
    if (!trace_) return;
    while (categories_.size() <= size_t(a.name))
      categories_.push_back(activity_category(p_.names()[categories_.size()], p_.name_kinds()[categories_.size()]));
    const int64_t tid = kFirstStreamTid + a.stream;
    if (streams_.insert(a.stream).second)
      trace_->thread_name(pid_, tid, a.kind == ActivityKind::Op ? "ops (host)" : "stream " + std::to_string(a.stream),
                          tid);
    std::string args = phase_args(a.phase, a.step) + ", \"correlation\": " + std::to_string(a.correlation);
    if (a.kind == ActivityKind::Kernel)
      args += ", \"grid\": [" + std::to_string(a.grid[0]) + ", " + std::to_string(a.grid[1]) + ", " +
              std::to_string(a.grid[2]) + "], \"block\": [" + std::to_string(a.block[0]) + ", " +
              std::to_string(a.block[1]) + ", " + std::to_string(a.block[2]) + "]";
    if (a.kind == ActivityKind::Memcpy || a.kind == ActivityKind::Memset)
      args += ", \"bytes\": " + std::to_string(a.bytes);
    trace_->complete(pid_, tid, p_.names()[a.name], categories_[a.name], a.start_ns, a.end_ns - a.start_ns, args);
  }

  // The window's phase ranges, on the host's track and (where known) the device's.
  void trace_ranges() {
    if (!trace_) return;
    for (const PhaseRange& r : p_.ranges()) {
      const std::string& name = p_.phases()[r.phase].name;
      const std::string args = phase_args(r.phase, r.step);
      trace_->complete(pid_, kHostPhasesTid, name, "phase", r.host_start_ns, r.host_end_ns - r.host_start_ns, args);
      if (r.device_start_ns >= 0)
        trace_->complete(pid_, kDevicePhasesTid, name, "phase", r.device_start_ns, r.device_end_ns - r.device_start_ns,
                         args);
    }
  }

 private:
  std::string phase_args(int32_t phase, int64_t step) const {
    return "\"phase\": \"" + json_escape(phase >= 0 ? p_.phases()[phase].path : "") +
           "\", \"step\": " + std::to_string(step);
  }

  const Profiler& p_;
  RecordStream& stream_;
  ProfileReport& report_;
  ChromeTrace* trace_;
  int64_t pid_;
  std::vector<std::string> categories_;  // by name id
  std::set<int64_t> streams_;            // tracks named so far
};

// The profiler's window, closed on every way out of the scope (an exception unwinding a
// measurement too), so CUPTI is never left enabled. close() is the normal way out, and says
// when closing fails; the destructor only reports it.
class Window {
 public:
  Window(Profiler& p, ActivitySink& sink) : p_(p) { p_.start(sink); }
  void close() { p_.stop(); }
  ~Window() {
    try {
      p_.stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "llmhpc: closing the profiler's window: %s\n", e.what());
    }
  }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

 private:
  Profiler& p_;
};

void add_options(po::options_description& desc) {
  po::options_description own("Profile options");
  add_step_options(own);
  own.add_options()("top", po::value<std::string>()->default_value("10"),
                    "kernels listed per phase in the printed summary")(
      "trace", po::value<std::string>()->implicit_value("")->value_name("FILE.json"),
      "also write a Chrome trace (ui.perfetto.dev, chrome://tracing): --trace alone to "
      "<out>/trace_rankNNNNN.json on every rank (NNNNN: the rank, as in its rank file's name); --trace "
      "FILE.json to FILE.json (one rank) or FILE_rankNNNNN.json (several)")(
      "no-cupti", po::bool_switch(),
      "trace no kernels: time the phases with device events only (the fallback where CUPTI, opened at "
      "run time, cannot be used; LLMHPC_CUPTI_LIBRARY names its library)");
  desc.add(own);
  po::options_description model("Model options");
  add_model_options(model, ListUse{});
  add_precision_options(model, ListUse{});
  add_tensor_parallel_options(model, ListUse{});
  desc.add(model);
}

// A tensor-parallel layout of the configurations: --tp, with --sequence-parallel and --tp-overlap
// above 1.
struct Layout {
  int tp = 1;
  bool sequence_parallel = false;
  int overlap = 1;
};

// Everything profile takes from the command line, parsed and checked once by parse_options
// before any file or device is touched; run() reads only this.
struct ProfileOptions {
  StepOptions step;
  std::vector<Layout> layouts;  // each configuration runs under each, in --tp's order
  std::string backend;          // --backend as given: the tensor-parallel group's collectives
  int top = 0;                  // kernels listed per phase
  bool cupti = true;            // --no-cupti: false
  // --trace: none; "" for <out>/trace_rank<r>.json; else FILE.json.
  std::optional<std::string> trace;
};

ProfileOptions parse_options(const po::variables_map& vm, int world_size) {
  ProfileOptions o;
  o.step = parse_step_options(vm);
  const TensorParallelSweep tps = tensor_parallel_sweep(vm);
  for (int tp : tps.sizes)
    for (int overlap : tps.overlaps_at(tp)) o.layouts.push_back({tp, tps.sequence_parallel_at(tp), overlap});
  o.backend = opt_string(vm, "backend");
  for (const ModelCase& c : o.step.cases)
    for (const Layout& t : o.layouts)
      check_tensor_parallel_case(c.model, world_size, t.tp, t.sequence_parallel, t.overlap,
                                 c.batch * c.model.context_length);
  const bool split = std::any_of(o.layouts.begin(), o.layouts.end(), [](const Layout& t) { return t.tp > 1; });
  if (split && o.step.cuda_graph)
    throw UsageError(
        "--cuda-graph records one rank's kernels: --tp's collectives inside each layer cannot be recorded");
  o.top = fits_int(opt_positive(vm, "top"), "top");
  o.cupti = !opt_flag(vm, "no-cupti");
  if (!vm.count("trace")) return o;
  o.trace = opt_string(vm, "trace");
  // --trace=FILE.json: a .json name in a directory that exists, checked before anything is written.
  const std::filesystem::path file = *o.trace;
  if (file.empty()) return o;
  if (file.extension() != ".json")
    throw UsageError("--trace=" + file.string() + ": the trace file's name must end in .json (--trace=run.json)");
  check_output_file("--trace", file.string());
  return o;
}

// This rank's trace file for --trace `file` (--trace's help says which).
std::string trace_path(const ModeContext& ctx, const std::string& file) {
  char rank[32];
  if (file.empty()) {
    std::snprintf(rank, sizeof rank, "/trace_rank%05d.json", ctx.rt.rank);
    return ctx.out_dir + rank;
  }
  if (ctx.rt.world_size == 1) return file;
  std::snprintf(rank, sizeof rank, "_rank%05d.json", ctx.rt.rank);
  return file.substr(0, file.size() - 5) + rank;
}

void run(ModeContext& ctx, const ProfileOptions& o) {
  const Phase phase = o.step.phase;
  const int64_t warmup = o.step.warmup, steps = o.step.steps;
  const int top = o.top;
  const std::vector<ModelCase>& cases = o.step.cases;
  Device& dev = *ctx.backend.device;
  const uint64_t seed = o.step.seed;
  const MemoryPlan memory = o.step.memory;
  const bool graphed = use_cuda_graph(ctx, o.step.cuda_graph);
  check_cases_run(ctx, cases);

  std::unique_ptr<Profiler> profiler = make_profiler(ctx.backend, o.cupti);
  Ops& ops = profiler->ops();  // the models run on what the profiler sees
  std::unique_ptr<ChromeTrace> trace;
  if (o.trace) {
    collective_check(ctx.rt, [&] {
      const std::string path = trace_path(ctx, *o.trace);
      check_new_output_file("--trace", path);
      trace = std::make_unique<ChromeTrace>(path);
    });
    trace->set_origin(profiler->timestamp_ns());  // time 0: before the first window
  }

  log_root(
      ctx.rt,
      "profile: %zu configuration(s), phase %s, %lld warm-up + %lld untraced + %lld traced steps, profiler %s%s%s, "
      "%d rank(s) on %s%s\n",
      cases.size() * o.layouts.size(), phase_name(phase), (long long)warmup, (long long)steps, (long long)steps,
      profiler->method().c_str(), profiler->note().empty() ? "" : " - ", profiler->note().c_str(), ctx.rt.world_size,
      dev.name().c_str(), graphed ? ", steps replayed from CUDA graphs" : "");
  const std::vector<Layout>& layouts = o.layouts;
  // One layout per --tp, made before the first window: setting up the group's communicator is
  // not the step's.
  std::map<int, std::unique_ptr<TensorParallelMesh>> meshes;
  for (const Layout& t : layouts)
    if (!meshes.count(t.tp)) meshes[t.tp] = make_tensor_parallel_mesh(ctx.rt, t.tp, o.backend, dev);
  Sweep sweep(ctx, "profile", cases.size() * layouts.size(),
              {"Model", "ctx", "batch", "prec", "attn", "Untraced", "Traced", "Overhead", "Drift", "Activities/step",
               "Matmul %", "Dropped", "status"});
  auto timer = dev.make_timer(kStepMarks);
  LiveModel live;  // one model for the configurations of a layout that can share it
  int64_t pid = 0;
  for (const Layout& t : layouts) {
    const TensorParallelMesh& mesh = *meshes.at(t.tp);
    live.release();  // each layout its own part of the model
    for (size_t i = 0; i < cases.size(); ++i) {
      const ModelCase& c = cases[i];
      live.release_unless_shared(cases, i);
      const std::string label = c.label() + tensor_parallel_label(t.tp, t.sequence_parallel, t.overlap);
      Record rec;
      rec.group = "profile/" + label;
      add_case_attrs(rec, c, phase, memory, warmup, steps);
      rec.attr("profiler", profiler->method())
          .attr("profiler_note", profiler->note())
          .attr("cuda_graph", int64_t(graphed ? 1 : 0))
          .attr("tp", int64_t(t.tp))
          .attr("tp_rank", int64_t(mesh.ranks.place.tp_rank))
          .attr("sequence_parallel", int64_t(t.sequence_parallel ? 1 : 0))
          .attr("tp_overlap", int64_t(t.overlap));
      StepSamples warm, untraced, traced;
      ProfileReport report(c, steps, t.tp);
      ++pid;
      dev.allocator().reset_peak();
      const SweepStatus status = sweep.run(
          label, rec,
          [&] {
            TransformerLM* model = nullptr;      // AdamW: a phase of its own
            std::unique_ptr<GraphedStep> graph;  // --cuda-graph: recorded after the warm-up
            auto record_steps = [&](Record& r) {
              untraced.record(r, "");
              traced.record(r, "traced_");
              if (warmup > 0) warm.record(r, "warmup_");
            };
            SweepSteps progress(sweep, rec, warmup + 2 * steps, "steps", [&](Record& r) {
              record_steps(r);
              keep_timed_steps(r, int64_t(untraced.step.size() + traced.step.size()), 2 * steps);
            });
            auto step = [&](StepSamples& into) {
              {
                NvtxRange range("step");
                into.add(graph ? graph->run(*timer) : run_step(*model, live.optimizer(), phase, *timer));
              }
              progress.done();
            };
            auto prepare = [&] {
              model = &live.prepare(cases, i, dev, ops, seed, memory, GradientStorage::Whole, phase, rec,
                                    mesh.model_config(t.sequence_parallel, t.overlap));
              for (int64_t s = 0; s < warmup; ++s) step(warm);
            };
            // A group's part and its first steps (what may run out of memory) agreed on by every
            // rank, so that none waits in a collective a rank that failed never enters.
            if (t.tp > 1) sweep.agree(prepare);
            else prepare();
            if (graphed)
              profiler->record_graph([&] {
                NvtxRange range("step");
                graph = std::make_unique<GraphedStep>(*model, live.optimizer(), phase);
              });
            for (int64_t s = 0; s < (steps + 1) / 2; ++s) step(untraced);

            RecordStream kernels =
                ctx.recorder.stream("profile_kernels/" + label, kActivityColumns,
                                    {{"record", rec.group}, {"profiler", profiler->method()}}, kStreamBufferRows);
            if (trace) {
              trace->process_name(pid, label + " (rank " + std::to_string(ctx.rt.rank) + ")");
              trace->thread_name(pid, kHostPhasesTid, "phases (host)", kHostPhasesTid);
              trace->thread_name(pid, kDevicePhasesTid, "phases (device)", kDevicePhasesTid);
            }
            Collector collector(*profiler, kernels, report, trace.get(), pid);
            {
              Window window(*profiler, collector);
              for (int64_t s = 0; s < steps; ++s) {
                profiler->set_step(s);
                step(traced);
              }
              window.close();
            }
            for (int64_t s = (steps + 1) / 2; s < steps; ++s) step(untraced);
            report.finish(*profiler);
            collector.trace_ranges();
            kernels.close("ok", {{"activities", profiler->activities()}, {"dropped_records", profiler->dropped()}});

            record_steps(rec);
            record_profiler_tables(rec, *profiler);
            rec.attr("activities", profiler->activities())
                .attr("dropped_records", profiler->dropped())
                .attr("unattributed_activities", profiler->unattributed());
            if (trace) rec.attr("trace_file", trace->path()).attr("trace_pid", pid);
            const Overhead o = overhead(untraced, traced);
            return fmt(o.untraced_ms) + " ms/step untraced, " + fmt(o.traced_ms) + " traced (medians)";
          },
          [&](Record& r) {
            r.attr("peak_memory_bytes", dev.allocator().peak_bytes());
            if (r.status != "ok") live.release();  // free what it held; the next configuration builds its own model
          });
      const bool ok = status.ok();
      if (ok && ctx.rt.is_root()) report.print(stdout, label + " (rank 0)", top, traced, untraced);
      const Overhead o = overhead(untraced, traced);
      sweep.add_row({c.model.name + tensor_parallel_label(t.tp, t.sequence_parallel, t.overlap),
                     std::to_string(c.model.context_length), std::to_string(c.batch), precision_name(c.precision),
                     attention_name(c.attention), fmt(o.untraced_ms), fmt(o.traced_ms), ok ? fmt(o.pct, 1) + "%" : "-",
                     ok && !std::isnan(o.drift_pct) ? fmt(o.drift_pct, 1) + "%" : "-",
                     ok && profiler->traces_activities() ? fmt(report.activities_per_step(), 1) : "-",
                     ok && profiler->traces_activities() ? fmt(report.matmul_pct("step"), 1) : "-",
                     ok ? std::to_string(profiler->dropped()) : "-", status.column()});
    }
  }
  if (trace) trace->close();
  sweep.print_summary("profile summary (median ms per step, rank 0 of " + std::to_string(ctx.rt.world_size) +
                      ", profiler " + profiler->method() + "; every rank's kernels are in " + ctx.out_dir +
                      (trace ? ", rank 0's trace in " + trace->path() : "") + "):");
}

}  // namespace

ModeSpec profile_mode() {
  return {"profile", "per-kernel GPU time per phase (CUPTI; ops on the CPU), matmul share, attention's parts, --trace",
          add_options, [](const po::variables_map& vm, int world_size) -> ModeRun {
            const ProfileOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          }};
}

}  // namespace llmhpc

// Mode ddp: the model's train step under each data-parallel strategy (the reference DDP study's
// naive, flat, overlapped and bucketed DDP) and optimizer sharding (the reference
// optimizer-sharding study's broadcast scheme, and ZeRO-1), timed per rank per step, over sweeps of
// model sizes x precisions x context lengths x global batch sizes x strategies (bucketed once per
// --bucket-mb) x shardings x what moves the gradients (--collective-engine) and what they travel as
// (--grad-reduce-dtype), each under each tensor-parallel size (--tp: the world as tp x dp ranks,
// data parallelism across the groups). Strategy `none` steps each rank on its local batch with no
// data-parallel communication at all: the compute-only baseline at the same local batch (it is
// never sharded, nor swept over the last two).
//
// Per step: forward, backward, the communication backward did not hide (from the end of
// backward until every gradient is reduced, as the compute stream sees it, plus after a
// sharded optimizer until every rank's parameters arrived), the optimizer and the whole step,
// and on NCCL the collectives' device time and the last steps' timeline; per configuration:
// what was communicated and the memory by category at the reference optimizer-sharding study's
// three points (after the model was built; before the first optimizer step, whose state does
// not exist yet, as with torch.optim; after the last step), printed as a second table.
// Configurations that differ only in strategy or sharding share one model (each with its
// own optimizer); each starts from rank 0's weights (broadcast), and every data-parallel rank
// draws its own random tokens (seeded by its place; a tensor-parallel group shares them). With
// --duration-s the timed steps run for about that long (src/modes/soak.h); memory is sampled
// after every timed step.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "src/core/random.h"
#include "src/core/stats.h"
#include "src/core/units.h"
#include "src/core/watchdog.h"
#include "src/dist/data_parallel_training.h"
#include "src/model/train_step.h"
#include "src/modes/data_parallel.h"
#include "src/modes/model_sweep.h"
#include "src/modes/options.h"
#include "src/modes/soak.h"
#include "src/modes/step_timeline.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// Bench's configuration (batch: the global batch) under one Parallelism, as train would run it:
// its share_weights resolved (Bf16 or Master), its bucket_mb used by bucketed only, its
// shard_group by zero1, zero2 and zero3 only.
struct DdpCase : ModelCase, Parallelism {
  int group = 0;  // the ranks sharing one copy of the state: shard_group resolved by make_meshes

  bool share_copy() const { return share_weights == ShareWeights::Bf16; }
  int tp() const { return tensor_parallel; }
  std::string strategy_label() const {
    return (strategy == SyncStrategy::Bucketed ? "bucketed" + fmt_exact(bucket_mb) + "MiB"
                                               : sync_strategy_name(strategy)) +
           (reduce_in_bf16 ? "_bf16grads" : "") + (engine == CollectiveEngine::Copy ? "_copy" : "");
  }
  std::string impl_column() const {
    return sync_strategy_name(strategy) + std::string(reduce_in_bf16 ? " bf16" : "") +
           (engine == CollectiveEngine::Copy ? " (copy)" : "") + (tp() > 1 ? " tp" + std::to_string(tp()) : "") +
           (sequence_parallel ? " sp" : "") + (tp_overlap > 1 ? " ov" + std::to_string(tp_overlap) : "");
  }
  std::string tp_label() const { return tensor_parallel_label(tp(), sequence_parallel, tp_overlap); }
  std::string sharding_label() const {
    return sharding == Sharding::None ? "" : std::string("_") + sharding_name(sharding) + (share_copy() ? "_bf16" : "");
  }
  std::string sharding_column() const { return sharding_name(sharding) + std::string(share_copy() ? " bf16" : ""); }
  std::string label() const { return ModelCase::label() + tp_label() + "_" + strategy_label() + sharding_label(); }
  // zero2 and zero3 run a model that keeps no flat buffers (ParameterStorage::Sharded).
  bool sharded() const { return shards_parameters(sharding); }
  std::string model_key() const { return ModelCase::model_key() + tp_label() + (sharded() ? "_sharded" : ""); }
};

// The combinations of --ddp x --shard-optimizer x --bucket-mb that are no configuration of
// their own, counted so that the run can say why it measures fewer than the lists multiply to.
struct LeftOut {
  int none_sharded = 0;  // --ddp none with a sharding stage: nothing reduced, nothing to shard
  int units_again = 0;   // zero2, zero3 under another strategy or bucket size: their buckets are the units

  std::string text() const {
    std::vector<std::string> why;
    if (none_sharded)
      why.push_back(std::to_string(none_sharded) +
                    " of --ddp none with a --shard-optimizer stage (it reduces nothing)");
    if (units_again)
      why.push_back(std::to_string(units_again) +
                    " of zero2 or zero3 under another --ddp or --bucket-mb (they reduce unit by unit: once, under "
                    "bucketed)");
    return join(why, "; ");
  }
};

// Sizes, then precisions and attentions, then contexts and batches, tensor-parallel sizes (each
// with its --tp-overlap values), strategies and shardings innermost (so every strategy of one
// setup runs on one model, side by side in the table). What is data-parallel resolves among a
// tp's data-parallel ranks (world / tp). Strategy none is not sharded (nothing would reduce its gradients): a sweep leaves those
// pairs out, and a sharding that only such pairs would run is an error. --share-weights
// sweeps the sharded cases only: bf16 the ones that keep a copy (bf16, not --low-memory), auto
// as it resolves (each case once); a bf16 no case can take is an error. --collective-engine
// and --grad-reduce-dtype sweep the strategies that communicate (not zero2 and zero3): copy or
// bf16 that no case can take is an error too. The pairs left out are counted in `left_out`.
std::vector<DdpCase> sweep_cases(const po::variables_map& vm, int world_size, LeftOut* left_out) {
  const std::vector<double> buckets = bucket_sizes_mb(vm);
  const TensorParallelSweep tps = tensor_parallel_sweep(vm);
  const std::vector<ShareWeights> choices = share_weights(vm);
  const std::vector<CollectiveEngine> engines = collective_engines(vm);
  const std::vector<bool> reductions = grad_reduce_in_bf16(vm);
  const MemoryPlan memory = memory_plan(vm);
  std::vector<DdpCase> cases;
  bool bf16_taken = false, communicates = false, bucketed = false;
  bool reduced_in_bf16 = false, copy_engines_taken = false;  // some case honours --grad-reduce-dtype bf16, copy
  std::optional<Sharding> units_asked;                       // zero2 or zero3, asked for somewhere
  for (const ModelCase& c : model_cases(vm))
    for (int tp : tps.sizes)
      for (int overlap : tps.overlaps_at(tp)) {
        const int dp = mesh_place(0, world_size, tp).dp_size;
        const bool sp = tps.sequence_parallel_at(tp);
        // Sequence parallelism's tokens checked where the data-parallel ranks divide the batch
        // (local_batch refuses the rest in run()).
        check_tensor_parallel_case(c.model, world_size, tp, sp && c.batch % dp == 0, overlap,
                                   c.batch / dp * c.model.context_length);
        const std::vector<SyncStrategy> strategies = sync_strategies(vm, std::max(dp, 2));
        const int group = shard_group(vm, dp);
        for (SyncStrategy s : strategies) {
          communicates |= s != SyncStrategy::None;
          bucketed |= s == SyncStrategy::Bucketed;
          for (double mb : s == SyncStrategy::Bucketed ? buckets : std::vector<double>{0.0})
            for (Sharding sh : shardings(vm, dp)) {
              if (s == SyncStrategy::None && sh != Sharding::None) {
                ++left_out->none_sharded;
                continue;
              }
              // zero2 and zero3 reduce unit by unit (their buckets are the units), in the dtype
              // backward writes, with NCCL's kernels: one case, under bucketed.
              const bool units = shards_parameters(sh);
              if (units) units_asked = sh;
              if (units && (s != SyncStrategy::Bucketed || mb != buckets.front())) {
                ++left_out->units_again;
                continue;
              }
              const bool can = can_share_compute_copy(c.precision, memory, sh);
              std::vector<bool> copies;  // this case's --share-weights, resolved, each once
              for (ShareWeights w : sh == Sharding::None ? std::vector<ShareWeights>{ShareWeights::Master} : choices) {
                if (w == ShareWeights::Bf16 && !can) continue;  // a sweep skips it here (train throws)
                bf16_taken |= w == ShareWeights::Bf16;
                const bool copy = shares_compute_copy(w, c.precision, memory, sh);
                if (std::find(copies.begin(), copies.end(), copy) == copies.end()) copies.push_back(copy);
              }
              const bool none = s == SyncStrategy::None;
              for (bool copy : copies)
                // Gradients made in bf16 travel as they are: one case where fp32 ones take two.
                for (bool in_bf16 :
                     none || units || c.grads == GradientDType::BF16 ? std::vector<bool>{false} : reductions)
                  for (CollectiveEngine e :
                       none || units ? std::vector<CollectiveEngine>{CollectiveEngine::Sm} : engines) {
                    check_grad_reduce(in_bf16, c.precision);
                    Parallelism p;
                    p.strategy = s;
                    p.sharding = sh;
                    if (mb > 0) p.bucket_mb = mb;
                    p.share_weights = copy ? ShareWeights::Bf16 : ShareWeights::Master;
                    p.engine = e;
                    p.reduce_in_bf16 = in_bf16;
                    if (sh == Sharding::Zero1 || units) p.shard_group = group;
                    p.tensor_parallel = tp;
                    p.sequence_parallel = sp;
                    p.tp_overlap = overlap;
                    cases.push_back({c, p});
                    reduced_in_bf16 |= !none && (in_bf16 || c.grads == GradientDType::BF16);
                    copy_engines_taken |= e == CollectiveEngine::Copy;
                  }
            }
        }
      }
  for (Sharding sh : shardings(vm, world_size))
    if (!communicates) require_reduced_gradients(SyncStrategy::None, sh);
  if (!communicates && std::count(reductions.begin(), reductions.end(), true) > 0)
    throw UsageError("--grad-reduce-dtype bf16 says what the ranks' gradients are averaged in, and --ddp none averages "
                     "nothing: add a strategy that communicates (e.g. --ddp none,bucketed)");
  // An option no case can honour is refused, not dropped: zero2 and zero3 take neither.
  if (!reduced_in_bf16 && std::count(reductions.begin(), reductions.end(), true) > 0)
    throw UsageError("--grad-reduce-dtype bf16: no case here averages its gradients in bf16 (zero2 and zero3 reduce "
                     "them in the dtype backward writes them in): for bf16 on the wire use --grad-dtype bf16 (with "
                     "--precision bf16), or add --shard-optimizer none, broadcast or zero1");
  if (!copy_engines_taken && std::count(engines.begin(), engines.end(), CollectiveEngine::Copy) > 0)
    throw UsageError("--collective-engine copy: no case here can use the copy engines (zero2 and zero3 move their "
                     "gradients and weights with NCCL's kernels): use sm, or add --shard-optimizer none or zero1");
  if (units_asked && !bucketed)
    throw UsageError(std::string("--shard-optimizer ") + sharding_name(*units_asked) +
                     " reduce-scatters the model unit by unit (its buckets are the units): it runs under --ddp "
                     "bucketed; add bucketed to --ddp");
  const std::vector<Sharding> stages = shardings(vm, world_size);
  if (shard_group(vm, world_size) != Parallelism::kAutoShardGroup &&
      std::none_of(stages.begin(), stages.end(),
                   [](Sharding s) { return s == Sharding::Zero1 || shards_parameters(s); }))
    throw UsageError("--shard-group says how many ranks share one copy of the model state under --shard-optimizer "
                     "zero1, zero2 or zero3: add one of them, or leave --shard-group out");
  if (std::count(choices.begin(), choices.end(), ShareWeights::Bf16) > 0 && !bf16_taken)
    throw UsageError("--share-weights bf16 sends the bf16 copy of a sharded optimizer's weights: no case here has "
                     "one (it needs --shard-optimizer broadcast or zero1 and --precision bf16 without --low-memory)");
  return cases;
}

// Everything mode ddp takes from the command line, parsed and checked once (the same verdict
// on every rank) before any file or device is touched; run() reads only this.
struct DdpOptions {
  int64_t warmup = 0, steps = 0;
  double duration_s = 0, heat_s = 0;
  std::vector<DdpCase> cases;
  uint64_t seed = 0;
  MemoryPlan memory = MemoryPlan::Fast;
  GradientDType grads = GradientDType::Master;
  std::string backend;        // --backend as given
  bool copy_engines = false;  // some case asks for the copy engines
  std::string left_out;       // LeftOut::text(): the combinations that are no configuration
};

DdpOptions parse_options(const po::variables_map& vm, int world_size) {
  DdpOptions o;
  o.warmup = opt_nonnegative(vm, "warmup");
  o.steps = opt_positive(vm, "steps");
  o.duration_s = duration_seconds(vm, "steps");
  o.heat_s = heat_seconds(vm);
  LeftOut left_out;
  o.cases = sweep_cases(vm, world_size, &left_out);
  o.left_out = left_out.text();
  o.seed = uint64_t(opt_int(vm, "seed"));
  o.memory = memory_plan(vm);
  o.grads = grad_dtype(vm);
  o.backend = opt_string(vm, "backend");
  const std::vector<CollectiveEngine> engines = collective_engines(vm);
  o.copy_engines = std::find(engines.begin(), engines.end(), CollectiveEngine::Copy) != engines.end();
  return o;
}

struct Samples {
  std::vector<double> forward, backward, comm, param_comm, optimizer, step;
  std::array<std::vector<double>*, 6> arrays() { return {&forward, &backward, &comm, &param_comm, &optimizer, &step}; }
  void reserve(size_t n) {
    for (auto* v : arrays()) reserve_touched(*v, n);
  }
  int64_t reserved_bytes() {
    size_t n = 0;
    for (auto* v : arrays()) n += v->capacity();
    return int64_t(n * sizeof(double));
  }
  void add(const StepTimes& t) {
    forward.push_back(t.forward_ms);
    backward.push_back(t.backward_ms);
    param_comm.push_back(std::isnan(t.param_sync_ms) ? 0.0 : t.param_sync_ms);
    comm.push_back((std::isnan(t.sync_ms) ? 0.0 : t.sync_ms) + param_comm.back());
    optimizer.push_back(t.optimizer_ms);
    step.push_back(t.step_ms);
  }
  void record(Record& r, const std::string& prefix) const {
    r.add(prefix + "forward_ms", forward)
        .add(prefix + "backward_ms", backward)
        .add(prefix + "comm_ms", comm)
        .add(prefix + "param_comm_ms", param_comm);
    r.add(prefix + "optimizer_ms", optimizer).add(prefix + "step_ms", step);
  }
};

// Times the tensor-parallel group's collectives while it lives (null: no group).
class TimedCollectives {
 public:
  explicit TimedCollectives(CommTensorParallelGroup* group) : group_(group) {
    if (group_) group_->time_collectives(true);
  }
  ~TimedCollectives() {
    if (group_) group_->time_collectives(false);
  }
  TimedCollectives(const TimedCollectives&) = delete;
  TimedCollectives& operator=(const TimedCollectives&) = delete;

 private:
  CommTensorParallelGroup* group_;
};

// The model of the current run of cases with one key, and its memory right after it was
// built (its parameters, gradients and bf16 copy; the first of the three memory points).
struct LiveModel {
  std::string key;
  std::unique_ptr<TransformerLM> model;
  MemoryBreakdown after_init;
};

// `base` plus what changed from `before` to `after`, category by category.
MemoryBreakdown with_change(MemoryBreakdown base, const MemoryBreakdown& before, const MemoryBreakdown& after) {
  for (auto& [category, bytes] : base.bytes) bytes += after.of(category) - before.of(category);
  base.total += after.total - before.total;
  return base;
}

// One cell of the memory table: a category at the three points, in MiB.
std::string mib_at_points(const std::string& category, const MemoryBreakdown* points[3]) {
  std::string cell;
  for (int k = 0; k < 3; ++k) {
    const int64_t bytes = category.empty() ? points[k]->total : points[k]->of(category);
    cell += (k ? " / " : "") + fmt(double(bytes) / double(1 << 20), 1);
  }
  return cell;
}

void add_options(po::options_description& desc) {
  po::options_description ddp("DDP options (comma-separated lists sweep)");
  ddp.add_options()("warmup", po::value<std::string>()->default_value("5"),
                    "untimed steps before the timed ones (recorded apart)")(
      "steps", po::value<std::string>()->default_value("10"), "timed steps per configuration");
  add_duration_option(ddp, "steps");
  add_heat_option(ddp);
  add_data_parallel_options(ddp, ListUse{});
  po::options_description model(
      "Model options (--batch-size is the global batch, shared equally by the data-parallel ranks)");
  add_model_options(model, ListUse{});
  add_precision_options(model, ListUse{});
  desc.add(ddp).add(model);
}


// The ranks and communicators of one --tp: data parallelism among the ranks holding the same
// part (every rank at tp 1), hybrid sharding's groups among those, and the tensor-parallel
// group's collectives inside each layer.
struct Mesh {
  std::unique_ptr<TensorParallelMesh> tp;
  std::map<int, ShardGroups> groups;  // by the ranks in a shard group: every data-parallel rank, and hybrid's
  const MeshRuntimes& ranks() const { return tp->ranks; }
  // Where the state `group` ranks share is reduced: among the group, and over the ranks holding
  // the same parts in the other groups (replicas: null where one group holds every rank).
  const ShardGroups& of(int group) const { return groups.at(group); }
  Communicator& every_rank() const { return *of(ranks().dp.world_size).shard; }
};

// One Mesh per --tp among `cases`, and each case's group resolved (DdpCase::group) with the
// communicators of its hybrid sharding; made on every rank in the cases' order. Collective.
std::map<int, std::unique_ptr<Mesh>> make_meshes(const Runtime& rt, const DdpOptions& o, Device& dev,
                                                 std::vector<DdpCase>& cases) {
  std::map<int, std::unique_ptr<Mesh>> meshes;
  const std::string backend = resolve_backend(o.backend, dev.kind());
  bool warned_of_placement = false;  // of node shard groups that span nodes or shard nothing: once
  for (DdpCase& c : cases) {
    std::unique_ptr<Mesh>& mesh = meshes[c.tp()];
    if (!mesh) {
      mesh = std::make_unique<Mesh>();
      mesh->tp = make_tensor_parallel_mesh(rt, c.tp(), o.backend, dev);
      const Runtime& dp = mesh->ranks().dp;
      collective_check(rt, [&] {
        mesh->groups.emplace(dp.world_size, make_shard_groups(dp, backend, dev, dp.world_size, o.copy_engines));
      });
    }
    const Runtime& dp = mesh->ranks().dp;
    collective_check(rt, [&] {
      c.group = resolve_shard_group(c.shard_group, c.sharding, dp);
      if (!mesh->groups.count(c.group)) mesh->groups.emplace(c.group, make_shard_groups(dp, backend, dev, c.group));
    });
    if (!warned_of_placement) warned_of_placement = warn_of_node_shard_groups(rt, dp, c.shard_group, c.group);
  }
  return meshes;
}

// The cases as they run: --collective-engine auto resolved per case, and a case that it makes the
// same as another once. Hybrid zero1 averages over the groups with NCCL's kernels, in the
// gradients' dtype: a sweep leaves its copy-engine and bf16-wire cases out, counted in
// `hybrid_left_out`. Every case is one train would run (check_parallelism), less the
// compute-only baseline (none on several ranks).
std::vector<DdpCase> resolve_cases(std::vector<DdpCase> cases, const std::map<int, std::unique_ptr<Mesh>>& meshes,
                                   Device& dev, MemoryPlan memory, int world_size, int* hybrid_left_out) {
  std::vector<DdpCase> resolved;
  *hybrid_left_out = 0;
  for (DdpCase c : cases) {
    const Mesh& mesh = *meshes.at(c.tp());
    const bool hybrid_zero1 = c.sharding == Sharding::Zero1 && mesh.of(c.group).replicas;
    if (hybrid_zero1 && (c.engine == CollectiveEngine::Copy || c.reduce_in_bf16)) {
      ++*hybrid_left_out;
      continue;
    }
    c.engine = hybrid_zero1 ? CollectiveEngine::Sm
                            : resolve_collective_engine(c.engine, c.strategy, c.sharding, mesh.ranks().dp, dev,
                                                        mesh.every_rank());
    if (c.strategy != SyncStrategy::None || mesh.ranks().dp.world_size == 1)
      check_parallelism(c, c.precision, memory, world_size);
    if (std::none_of(resolved.begin(), resolved.end(), [&](const DdpCase& r) { return r.label() == c.label(); }))
      resolved.push_back(c);
  }
  return resolved;
}

// The configuration's record as this rank runs it: its place in the tp x dp layout, its share of
// the batch, its part of the model, what the gradients travel over.
Record case_record(const DdpCase& c, const DdpOptions& o, const MeshPlace& place, const LocalBatch& mine,
                   const ParameterLayout& layout, const Communicator& comm, int world_size) {
  Record rec;
  rec.group = "ddp/" + c.label();
  add_shape_attrs(rec, c.model);
  rec.attr("batch_size", c.batch)
      .attr("local_batch_size", mine.count)
      .attr("world_size", int64_t(world_size))
      .attr("tp", int64_t(c.tp()))
      .attr("dp", int64_t(place.dp_size))
      .attr("tp_rank", int64_t(place.tp_rank))
      .attr("dp_rank", int64_t(place.dp_rank))
      .attr("sequence_parallel", int64_t(c.sequence_parallel ? 1 : 0))
      .attr("tp_overlap", int64_t(c.tp_overlap))
      .attr("precision", std::string(precision_name(c.precision)))
      .attr("attention", std::string(attention_name(c.attention)))
      .attr("low_memory", int64_t(o.memory == MemoryPlan::LowMemory ? 1 : 0))
      .attr("grad_dtype", std::string(dtype_name(gradient_dtype(c.precision, c.grads))))
      .attr("ddp", std::string(sync_strategy_name(c.strategy)))
      .attr("bucket_mb", c.strategy == SyncStrategy::Bucketed ? c.bucket_mb : 0.0)
      .attr("shard_optimizer", std::string(sharding_name(c.sharding)))
      .attr("shard_group", int64_t(c.group))
      .attr("share_weights", std::string(shared_weights_name(c.share_copy(), c.sharding, c.precision)))
      .attr("collective_engine", std::string(collective_engine_name(c.engine)))
      .attr("grad_reduce_dtype", grad_reduce_dtype_name(c.reduce_in_bf16, gradient_dtype(c.precision, c.grads)))
      .attr("backend", comm.backend_name())
      .attr("warmup", o.warmup)
      .attr("steps", o.steps)
      .attr("duration_s", o.duration_s)
      .attr("num_params", c.model.num_params())
      .attr("part_params", layout.total())  // this rank's part under --tp, padding included
      .attr("model_flops_fwd_bwd", model_flops_fwd_bwd(c.model, mine.count, c.model.context_length) / c.tp());
  return rec;
}

// The summary table's row of a configuration: its times, what it communicated, its peak.
std::vector<std::string> summary_row(const DdpCase& c, const SweepStatus& status, const SyncStats& stats,
                                     const Samples& timed, const std::vector<double>& collectives_ms,
                                     const std::vector<double>& slowest, Device& dev) {
  const double step = mean(timed.step), comm_ms = mean(timed.comm);
  return {shape_label(c.model),
          std::to_string(c.model.context_length),
          std::to_string(c.batch),
          precision_name(c.precision),
          c.impl_column(),
          c.sharding_column(),
          c.strategy == SyncStrategy::Bucketed ? fmt_exact(c.bucket_mb) : "-",
          status.ok() ? std::to_string(stats.buckets) : "-",
          fmt(step),
          fmt(stddev(timed.step)),
          fmt(comm_ms),
          fmt(stddev(timed.comm)),
          status.ok() ? fmt(100.0 * comm_ms / step, 1) + "%" : "-",
          collectives_ms.empty() ? "-" : fmt(mean(collectives_ms)),
          fmt(mean(slowest)),
          status.ok() ? fmt(double(stats.bytes + stats.param_bytes) / double(1 << 20), 1) : "-",
          fmt(double(dev.allocator().peak_bytes()) / double(1 << 30)),
          status.column()};
}

// The memory table's row: each category at the three points, and the configuration's peak.
std::vector<std::string> memory_row(const DdpCase& c, const SweepStatus& status, const MemoryBreakdown* points[3],
                                    Device& dev) {
  std::vector<std::string> row = {shape_label(c.model),    std::to_string(c.model.context_length),
                                  std::to_string(c.batch), precision_name(c.precision),
                                  c.impl_column(),         c.sharding_column()};
  for (const TagCategory& category : model_memory_categories())
    row.push_back(status.ok() ? mib_at_points(category.name, points) : "-");
  row.push_back(status.ok() ? mib_at_points("other", points) : "-");
  row.push_back(status.ok() ? mib_at_points("", points) : "-");
  row.push_back(fmt(double(dev.allocator().peak_bytes()) / double(1 << 20), 1));
  return row;
}

// One configuration as this rank runs it: where (its mesh, communicators, part of the model and
// share of the batch), and what it measured, for its record and its rows of the two tables.
struct Configuration {
  Configuration(const DdpCase& c, const Mesh& mesh, Device& dev)
      : c(c), mesh(mesh), place(mesh.ranks().place), tp_group(mesh.tp->group.get()), comm(*mesh.of(c.group).shard),
        replicas(mesh.of(c.group).replicas.get()), layout(c.model, TensorSplit{c.tp(), place.tp_rank}),
        mine(local_batch(c.batch, mesh.ranks().dp.rank, mesh.ranks().dp.world_size)),
        plan(data_parallel_plan(c.strategy, c.sharding, layout, c.precision, c.grads, c.bucket_mb, c.group,
                                shard_alignment(dev, c.precision, c.share_copy()), c.reduce_in_bf16)) {}

  const DdpCase& c;
  const Mesh& mesh;
  const MeshPlace& place;
  CommTensorParallelGroup* tp_group;
  Communicator& comm;
  Communicator* replicas;
  const ParameterLayout layout;  // this rank's part
  const LocalBatch mine;         // its share of the global batch (the data-parallel rank's)
  const SyncPlan plan;
  std::unique_ptr<DataParallelTraining> training;  // made where running out of memory is agreed on

  Samples warm, timed;
  std::vector<double> slowest, collectives_ms;  // the slowest rank's steps; the collectives' device time
  std::vector<double> tp_comm;                  // per timed step, what the layers waited for the tp group
  SyncStats stats;
  // after_init: the model as built; under zero2 and zero3 with this rank's shards of it.
  MemoryBreakdown after_init, before_optimizer, after_optimizer;
};

// One run of mode ddp on this rank. The constructor resolves the cases on their meshes (every
// check agreed on by all ranks) and says what runs; run() measures each configuration in the
// sweep and prints the two tables.
class DdpRun {
 public:
  DdpRun(ModeContext& ctx, const DdpOptions& o);
  void run();

 private:
  void describe(int hybrid_left_out) const;  // rank 0's lines on what runs
  // The model (shared with the next cases of its key), the configuration's training and its
  // optimizer state: everything that may run out of memory, inside Sweep::agree.
  void prepare(size_t i, Configuration& k);
  // Starts from rank 0's weights, then the warm-up, --heat-s and the timed steps into `rec`;
  // returns the progress text.
  std::string measure(Sweep& sweep, Configuration& k, Record& rec);
  // --heat-s, then the timed steps, into `rec` and `k`; `step` runs one.
  void time_steps(Sweep& sweep, Configuration& k, Record& rec,
                  const std::function<StepTimes(Timer&, const std::function<void()>&)>& step);
  void print_summaries(const Sweep& sweep, const TextTable& memory_table) const;

  ModeContext& ctx;
  const DdpOptions& o;
  const Runtime& rt;
  Device& dev;
  Ops& ops;
  std::vector<DdpCase> cases;
  std::map<int, std::unique_ptr<Mesh>> meshes;
  std::unique_ptr<Timer> timer, other_timer;  // timed steps alternate between the two (DataParallelBusy)
  LiveModel live;
};

DdpRun::DdpRun(ModeContext& ctx, const DdpOptions& o)
    : ctx(ctx), o(o), rt(ctx.rt), dev(*ctx.backend.device), ops(*ctx.backend.ops), cases(o.cases) {
  check_cases_run(ctx, std::vector<ModelCase>(cases.begin(), cases.end()));
  collective_check(rt, [&] {
    for (const DdpCase& c : cases) {  // divides by the data-parallel ranks
      const MeshPlace place = mesh_place(rt.rank, rt.world_size, c.tp());
      local_batch(c.batch, place.dp_rank, place.dp_size);
    }
  });
  meshes = make_meshes(rt, o, dev, cases);
  int hybrid_left_out = 0;
  cases = resolve_cases(std::move(cases), meshes, dev, o.memory, rt.world_size, &hybrid_left_out);
  describe(hybrid_left_out);
  timer = dev.make_timer(kStepMarks);
  other_timer = dev.make_timer(kStepMarks);
}

void DdpRun::describe(int hybrid_left_out) const {
  const std::string backend_name = meshes.begin()->second->every_rank().backend_name();
  const std::string timed = timed_text(o.duration_s, o.steps, "steps");
  log_root(rt, "ddp: %zu configuration(s), %lld warm-up steps, %s, %d rank(s) on %s, backend %s%s%s\n", cases.size(),
           (long long)o.warmup, timed.c_str(), rt.world_size, dev.name().c_str(), backend_name.c_str(),
           o.memory == MemoryPlan::LowMemory ? ", --low-memory" : "",
           (std::string(o.grads == GradientDType::BF16 ? ", bf16 gradients" : "") +
            (o.heat_s > 0 ? ", each configuration heated for ~" + fmt_exact(o.heat_s) + " s" : ""))
               .c_str());
  if (!o.left_out.empty()) log_root(rt, "ddp: note: combinations left out: %s\n", o.left_out.c_str());
  if (hybrid_left_out > 0)
    log_root(rt,
             "ddp: note: %s of zero1 in shard groups (--shard-group) left out: its groups average with NCCL's "
             "kernels in the gradients' dtype, so --collective-engine copy and --grad-reduce-dtype bf16 do not apply "
             "to it\n",
             counted(hybrid_left_out, "configuration").c_str());
  // A data-parallel group of one rank (the world, or --tp the whole world) times its strategies
  // with no peer: say so, as their rows otherwise read as data parallelism measured.
  std::set<int> alone;
  for (const DdpCase& c : cases)
    if (c.strategy != SyncStrategy::None && rt.world_size / c.tp() == 1) alone.insert(c.tp());
  for (int tp : alone)
    log_root(rt, "ddp: note: %s: the strategies and shardings run with no peer, their collectives moving nothing\n",
             tp > 1 ? ("at --tp " + std::to_string(tp) + " the data-parallel group is one rank").c_str() : "one rank");
}

void DdpRun::run() {
  Sweep sweep(ctx, "ddp", cases.size(),
              {"model", "ctx", "batch", "prec", "impl", "shard", "bucket MiB", "buckets", "Step mean", "Step std",
               "Comm mean", "Comm std", "Comm %", "Coll. time", "Slowest step", "MiB/step", "Peak GiB", "status"});
  std::vector<std::string> memory_columns = {"model", "ctx", "batch", "prec", "impl", "shard"};
  for (const TagCategory& category : model_memory_categories()) memory_columns.push_back(category.name);
  for (const char* extra : {"other", "total", "Peak"}) memory_columns.push_back(extra);
  TextTable memory_table(memory_columns);
  for (size_t i = 0; i < cases.size(); ++i) {
    const DdpCase& c = cases[i];
    if (live.key != c.model_key()) {  // free the previous model before building the next
      live.model.reset();
      live.key = c.model_key();
    }
    Configuration k(c, *meshes.at(c.tp()), dev);
    Record rec = case_record(c, o, k.place, k.mine, k.layout, k.comm, rt.world_size);
    dev.allocator().reset_peak();
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          sweep.agree([&] { prepare(i, k); });  // before the first collective
          return measure(sweep, k, rec);
        },
        [&](Record& r) {
          record_memory(r, "after_init", k.after_init);
          r.attr("peak_memory_bytes", dev.allocator().peak_bytes());
          if (r.status != "ok") {  // free what this configuration held; the next one builds its own model
            k.training.reset();
            live = LiveModel{};
          }
        });
    k.training.reset();
    sweep.add_row(summary_row(c, status, k.stats, k.timed, k.collectives_ms, k.slowest, dev));
    const MemoryBreakdown* points[3] = {&k.after_init, &k.before_optimizer, &k.after_optimizer};
    memory_table.add_row(memory_row(c, status, points, dev));
  }
  print_summaries(sweep, memory_table);
}

void DdpRun::prepare(size_t i, Configuration& k) {
  const DdpCase& c = k.c;
  if (!live.model) {  // sized for the longest context and buffer among the cases that will share it
    ModelConfig shape = c.model;
    int64_t flat_elements = 0;
    for (size_t n = i; n < cases.size() && cases[n].model_key() == live.key; ++n) {
      const DdpCase& next = cases[n];
      shape.context_length = std::max(shape.context_length, next.model.context_length);
      flat_elements = std::max(
          flat_elements, model_storage(data_parallel_plan(next.strategy, next.sharding,
                                                          ParameterLayout(next.model, k.layout.tensor_split()),
                                                          next.precision, next.grads, next.bucket_mb, next.group,
                                                          shard_alignment(dev, next.precision, next.share_copy())))
                             .flat_elements);
    }
    live.model = std::make_unique<TransformerLM>(
        TransformerLM::Config{shape, c.precision, c.attention, o.memory, flat_elements, GradientStorage::Whole, c.grads,
                              model_storage(k.plan).parameters,
                              k.mesh.tp->model_config(c.sequence_parallel, c.tp_overlap)},
        dev, ops);
    // Different per rank: the broadcast must work. (Shards are drawn from one seed below.)
    if (!c.sharded()) live.model->init_parameters(o.seed + uint64_t(k.place.dp_rank));
    live.after_init = model_memory(dev.allocator());
  }
  // Each data-parallel rank its own batch.
  set_random_batch(*live.model, k.mine.count, c.model.context_length, o.seed, 16 * uint64_t(k.place.dp_rank) + 1);
  // zero2, zero3: the shards, their places and windows, and the optimizer state, what a sharded
  // step keeps (after_init: the model as built with this rank's shards, not the batch). A step
  // runs here where it holds no collectives: not sharded, not tensor-parallel (elsewhere the
  // activations come with the first step).
  const MemoryBreakdown before_shards = model_memory(dev.allocator());
  k.training = std::make_unique<DataParallelTraining>(k.plan, &k.comm, k.replicas, *live.model, ops, AdamWHyper{});
  k.after_init = with_change(live.after_init, before_shards, model_memory(dev.allocator()));
  const bool step_here = !c.sharded() && c.tp() == 1;
  // The gradients exist; the activations and backward's scratch come and go with it.
  if (step_here) run_step(*live.model, nullptr, Phase::ForwardBackward, *timer);
  k.before_optimizer = model_memory(dev.allocator());
  k.training->optimizer().allocate_state();  // here, where running out of memory is agreed on
  // A step's peak (activations and scratch beside the state) once more, so that a timed step
  // does not run out of memory where the state took their cached blocks.
  if (step_here) run_step(*live.model, nullptr, Phase::ForwardBackward, *timer);
}

std::string DdpRun::measure(Sweep& sweep, Configuration& k, Record& rec) {
  const DdpCase& c = k.c;
  TransformerLM& model = *live.model;
  for (const auto& [name, value] : ops.attention_variant(
           {k.mine.count, c.model.context_length, c.model.num_heads / c.tp(), c.model.head_dim(), true, c.attention},
           compute_dtype(c.precision)))
    rec.attr(name, value);
  // Every configuration starts from rank 0's weights: the seed's where sharded, else broadcast.
  if (c.sharded()) k.training->initialize(o.seed);
  k.training->start(c.share_copy(), c.engine);
  GradientSync* const sync = k.training->sync();
  rt.barrier();
  int64_t steps_run = 0;
  auto step = [&](Timer& on, const std::function<void()>& while_device_runs) {
    Watchdog::instance().set_step(steps_run++);  // warm-up and --heat-s steps count too
    return run_step(model, &k.training->optimizer(), Phase::TrainStep, on, sync, nullptr, nullptr, while_device_runs);
  };
  for (int64_t s = 0; s < o.warmup; ++s) k.warm.add(step(*timer, nullptr));
  time_steps(sweep, k, rec, step);
  model.wait_parameters();  // the last step's all-gathers, before the sync goes and the next case
  k.slowest = rt.reduce_all(k.timed.step, HostReduce::Max);
  k.timed.record(rec, "");
  if (o.warmup > 0) k.warm.record(rec, "warmup_");
  rec.add("step_ms_max_over_ranks", k.slowest);
  if (sync) k.stats = sync->stats();
  rec.attr("buckets", k.stats.buckets)
      .attr("collectives_per_step", k.stats.collectives)
      .attr("comm_bytes_per_step", k.stats.bytes)
      .attr("collectives_issued_after_backward", k.stats.issued_in_finish)
      .attr("param_collectives_per_step", k.stats.param_collectives)
      .attr("param_comm_bytes_per_step", k.stats.param_bytes)
      .attr("comm_bus_bytes_per_step", k.stats.bus_bytes)
      .attr("optimizer_owned_elements", k.training->optimizer().owned_elements());
  record_memory(rec, "before_optimizer", k.before_optimizer);
  record_memory(rec, "after_optimizer", k.after_optimizer);
  return fmt(mean(k.timed.step)) + " ms/step, exposed comm " + fmt(mean(k.timed.comm)) + " ms" +
         (k.tp_comm.empty() ? "" : ", waits for the tp collectives " + fmt(mean(k.tp_comm)) + " ms");
}

void DdpRun::time_steps(Sweep& sweep, Configuration& k, Record& rec,
                        const std::function<StepTimes(Timer&, const std::function<void()>&)>& step) {
  const double pace_s = o.duration_s > 0 || o.heat_s > 0 ? agreed_iteration_s(rt, k.warm.step, 1e-3) : 0;
  if (o.heat_s > 0) {
    rec.attr("heat_steps", heat_up(&rt, o.heat_s, pace_s, [&] { step(*timer, nullptr); }));
    sweep.restart_sensors();  // the record's clocks: the timed steps', not the heat's
  }
  CommTensorParallelGroup* tp_group = k.tp_group;
  if (tp_group) tp_group->take_traffic();  // the timed steps' alone
  StepTimeline timeline;
  DataParallelBusy busy(k.comm, k.replicas, timeline);  // the timed steps' alone
  TimedCollectives tp_timed(tp_group);
  CommTensorParallelGroup::Traffic tp_total;
  std::vector<double>& tp_comm = k.tp_comm;
  std::vector<double> tp_busy;  // per timed step, the group's collectives' device time
  DurationCount count(rt, o.duration_s, o.steps, pace_s, std::numeric_limits<int64_t>::max());
  Samples& timed = k.timed;
  timed.reserve(size_t(count.total()));
  MemorySamples memory_samples{size_t(count.total())};
  // A signal keeps the steps so far (each rank its own; a rank already inside the next step's
  // collectives keeps none).
  SweepSteps progress(sweep, rec, count.total(), "steps", [&](Record& r) {
    timed.record(r, "");
    if (o.warmup > 0) k.warm.record(r, "warmup_");
    memory_samples.record(r);
    keep_timed_steps(r, int64_t(timed.step.size()), count.total());
  });
  for (int64_t s = 0; s < count.total();) {
    for (const int64_t end = s + count.next_chunk(s); s < end; ++s) {
      Timer& on = s % 2 == 0 ? *timer : *other_timer;
      busy.step_begins(on);
      const StepTimes times = step(on, [&] { busy.settle_previous(); });
      timed.add(times);
      CommTensorParallelGroup::Traffic t;
      if (tp_group) {
        t = tp_group->take_traffic(&on);  // complete: the step waited for each
        tp_total.collectives += t.collectives;
        tp_total.bytes += t.bytes;
        tp_comm.push_back(t.exposed_ms);
        tp_busy.push_back(t.busy_ms);
      }
      busy.step_ended(times, std::move(t.spans));
      memory_samples.take(s, dev, timed.reserved_bytes());  // after the step's end: outside its timing
      progress.update(s + 1, count.total());
    }
    count.after_chunk(s);  // between steps (and one of the steps' host reductions)
    timed.reserve(size_t(count.total()));
    memory_samples.expect(size_t(count.total()));
    progress.update(s, count.total());
  }
  rec.attr("steps", int64_t(timed.step.size()));
  if (tp_group) {
    rec.attr("tp_collectives_per_step", tp_total.collectives / int64_t(timed.step.size()))
        .attr("tp_bus_bytes_per_step", tp_total.bytes / int64_t(timed.step.size()));
    rec.add("tp_comm_ms", tp_comm);
    if (std::all_of(tp_busy.begin(), tp_busy.end(), [](double ms) { return std::isfinite(ms); }))
      rec.add("tp_comm_busy_ms", tp_busy);
  }
  // As training holds it between steps: a sharded optimizer's parameters still arriving (under
  // bf16 without the bf16 copy, which the next forward casts again).
  k.after_optimizer = model_memory(dev.allocator());
  // The last step's collectives, before wait_parameters() issues more: under --share-weights
  // bf16 it all-gathers the masters other ranks own, which no step does (2.3 s more in the last
  // xl step over NCCL's socket transport).
  if (busy.measured()) {
    k.collectives_ms = busy.finish();
    rec.add("comm_busy_ms", k.collectives_ms);
  }
  timeline.record(rec);
  memory_samples.record(rec);
}

void DdpRun::print_summaries(const Sweep& sweep, const TextTable& memory_table) const {
  sweep.print_summary(
      "ddp summary (ms per step, rank 0 of " + std::to_string(rt.world_size) +
      "; Comm: exposed communication, from the end of backward until the gradients are reduced (a "
      "sharded optimizer's parameters are waited for during the next forward, inside the step); "
      "Coll. time: the collectives' own device time per step, hidden or not (nccl); Slowest step: the slowest "
      "rank's step, averaged; MiB/step: what the gradient and parameter "
      "collectives cover; every rank's raw times are in " +
      ctx.out_dir + "):");
  if (rt.is_root()) {
    std::printf("\nddp memory of rank 0 by category (MiB; each cell: after the model was built / before the first "
                "optimizer step, its state not yet allocated / after the last step; Peak: the configuration's):\n");
    memory_table.print();
  }
}

}  // namespace

ModeSpec ddp_mode() {
  return {"ddp",
          "data-parallel train step under each gradient synchronisation strategy (naive, flat, overlap, bucketed) "
          "and sharding (broadcast, ZeRO-1, ZeRO-2, ZeRO-3), alone or beside tensor parallelism",
          add_options, [](const po::variables_map& vm, int world_size) -> ModeRun {
            const DdpOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { DdpRun(ctx, options).run(); };
          }};
}

}  // namespace llmhpc

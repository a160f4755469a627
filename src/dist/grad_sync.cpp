#include "src/dist/grad_sync.h"

#include <algorithm>

#include "src/core/check.h"
#include "src/core/units.h"
#include "src/dist/reducer.h"
#include "src/dist/shard_sync.h"
#include "src/model/params.h"

namespace llmhpc {
namespace {

// The choice `text` names among `all`; throws UsageError naming --option and the choices.
template <class Choice>
Choice parse_choice(const std::string& text, const std::vector<Choice>& all, const char* (*name)(Choice),
                    const std::string& option) {
  std::vector<std::string> names;
  for (Choice c : all) {
    if (text == name(c)) return c;
    names.push_back(name(c));
  }
  require_choice(text, names, option);  // throws: text is none of them
  LLMHPC_FATAL("unreachable");
}

}  // namespace

const std::vector<SyncStrategy>& all_sync_strategies() {
  static const std::vector<SyncStrategy> all = {SyncStrategy::None, SyncStrategy::Naive, SyncStrategy::Flat,
                                                SyncStrategy::Overlap, SyncStrategy::Bucketed};
  return all;
}

const char* sync_strategy_name(SyncStrategy s) {
  switch (s) {
    case SyncStrategy::None: return "none";
    case SyncStrategy::Naive: return "naive";
    case SyncStrategy::Flat: return "flat";
    case SyncStrategy::Overlap: return "overlap";
    case SyncStrategy::Bucketed: return "bucketed";
  }
  LLMHPC_FATAL("unknown SyncStrategy");
}

SyncStrategy parse_sync_strategy(const std::string& text) {
  return parse_choice(text, all_sync_strategies(), sync_strategy_name, "ddp");
}

const std::vector<Sharding>& all_shardings() {
  static const std::vector<Sharding> all = {Sharding::None, Sharding::Broadcast, Sharding::Zero1, Sharding::Zero2,
                                            Sharding::Zero3};
  return all;
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::None: return "none";
    case Sharding::Broadcast: return "broadcast";
    case Sharding::Zero1: return "zero1";
    case Sharding::Zero2: return "zero2";
    case Sharding::Zero3: return "zero3";
  }
  LLMHPC_FATAL("unknown Sharding");
}

bool shards_parameters(Sharding s) { return s == Sharding::Zero2 || s == Sharding::Zero3; }

Sharding parse_sharding(const std::string& text) {
  return parse_choice(text, all_shardings(), sharding_name, "shard-optimizer");
}

std::vector<FlatRange> SyncPlan::owned(int rank) const {
  if (sharding == Sharding::None) return {{0, parameters}};
  LLMHPC_CHECK(!shards_parameters(sharding), "zero2 and zero3 shards are not ranges of the flat buffer: ShardLayout");
  std::vector<FlatRange> out;
  for (size_t g = shard_groups.size(); g-- > 0;) out.push_back(shard(g, rank));  // forward order
  return out;
}

void require_reduced_gradients(SyncStrategy strategy, Sharding sharding) {
  if (sharding != Sharding::None && strategy == SyncStrategy::None)
    throw UsageError(std::string("{shard_optimizer} ") + sharding_name(sharding) +
                     " needs the gradients reduced over the ranks: choose {ddp} naive, flat, overlap or bucketed, "
                     "not none");
}

// Each strategy is a plan (which ranges one collective covers) and a time to issue them;
// sharding adds who owns what, and zero1 re-cuts the ranges so they divide among the ranks.
SyncPlan plan_sync(SyncStrategy strategy, Sharding sharding, const std::vector<ParamSpan>& params, size_t element_bytes,
                   double bucket_mb, int ranks, int64_t alignment) {
  LLMHPC_CHECK(ranks >= 1, "a plan for no ranks");
  LLMHPC_CHECK(alignment >= kShardAlignment && alignment % kShardAlignment == 0,
               "shards align to a multiple of kShardAlignment");
  require_reduced_gradients(strategy, sharding);
  LLMHPC_CHECK(!shards_parameters(sharding), "zero2 and zero3 plan by units: unit_plan");
  SyncPlan plan;
  plan.strategy = strategy;
  plan.sharding = sharding;
  plan.ranks = ranks;
  plan.alignment = alignment;
  for (const ParamSpan& p : params) plan.parameters = std::max(plan.parameters, p.end);
  plan.flat_elements = plan.parameters;
  switch (strategy) {
    case SyncStrategy::None: break;
    case SyncStrategy::Naive:
    case SyncStrategy::Overlap: plan.buckets = plan_per_tensor(params); break;
    case SyncStrategy::Flat: plan.buckets = plan_flat(params); break;
    case SyncStrategy::Bucketed: plan.buckets = plan_buckets(params, element_bytes, bucket_mb); break;
  }
  plan.when_ready = strategy == SyncStrategy::Overlap || strategy == SyncStrategy::Bucketed;
  if (sharding == Sharding::Broadcast) plan.shard_groups = {{0, plan.parameters}};
  if (sharding == Sharding::Zero1) {
    plan.flat_elements = round_up(plan.parameters, int64_t(ranks) * alignment);
    plan.buckets = plan.shard_groups = plan_zero1_buckets(plan.buckets, plan.flat_elements, ranks, alignment);
  }
  return plan;
}

std::unique_ptr<GradientSync> make_gradient_sync(const SyncPlan& plan, Communicator& comm, Tensor flat_grads,
                                                 Tensor flat_params, CopySharing sharing, ReduceScratch scratch,
                                                 Communicator* replicas) {
  // Longer is fine: a model shared by several plans is padded for the one that needs most.
  LLMHPC_CHECK(flat_grads.numel() >= plan.flat_elements, "the gradient buffer is shorter than the plan");
  LLMHPC_CHECK(comm.size() == plan.ranks, "the plan was made for another number of ranks");
  std::unique_ptr<GradientSync> gradients = make_reducer(plan, comm, flat_grads, scratch, replicas);
  if (plan.sharding == Sharding::None) return gradients;
  LLMHPC_CHECK(flat_params.numel() >= plan.flat_elements,
               "a sharded optimizer needs the flat parameters, as long as the plan");
  return make_parameter_sharing(std::move(gradients), comm, flat_params, std::move(sharing));
}

std::vector<ParamSpan> param_spans(const ParameterLayout& layout) {
  std::vector<ParamSpan> spans;
  for (const ParamInfo& p : layout.params()) spans.push_back({p.name, p.offset, p.offset + p.shape.numel(), true});
  return spans;
}

void broadcast_parameters(Communicator& comm, Tensor flat_params, Communicator* replicas) {
  comm.broadcast(flat_params.data, flat_params.data, size_t(flat_params.numel()), flat_params.dtype, /*root=*/0);
  if (replicas)
    replicas->broadcast(flat_params.data, flat_params.data, size_t(flat_params.numel()), flat_params.dtype, 0);
}

}  // namespace llmhpc

#include "src/dist/parallelism.h"

#include "src/dist/tensor_parallel.h"

#include <algorithm>

#include "src/core/check.h"
#include "src/core/table.h"
#include "src/core/units.h"
#include "src/model/checkpoint.h"

namespace llmhpc {

void check_grad_reduce(bool in_bf16, Precision precision) {
  if (in_bf16 && param_dtype(precision) != DType::F32)
    throw UsageError(std::string("{grad_reduce_dtype} bf16 rounds fp32 gradients, and {precision} ") +
                     precision_name(precision) + " keeps them in " + dtype_name(param_dtype(precision)) +
                     ": use {grad_reduce_dtype} same");
}

std::string grad_reduce_dtype_name(bool in_bf16, DType grads) { return in_bf16 ? "bf16" : dtype_name(grads); }

const char* collective_engine_name(CollectiveEngine engine) {
  switch (engine) {
    case CollectiveEngine::Sm: return "sm";
    case CollectiveEngine::Copy: return "copy";
    case CollectiveEngine::Auto: return "auto";
  }
  return "?";
}

std::string copy_engines_unavailable(const Runtime& rt, Allocator& allocator, const std::string& backend) {
  if (backend != "nccl")
    return "{collective_engine} copy moves the gradients with the GPUs' copy engines, which needs the nccl backend "
           "({device} cuda); this run's collectives go over " +
           backend;
  if (rt.local_size != rt.world_size)  // the same verdict on every rank: one node holds all or not
    return "{collective_engine} copy works between the GPUs of one node (NCCL's copy-engine collectives); this "
           "job's " +
           std::to_string(rt.world_size) + " ranks span several nodes";
  if (!allocator.shares_memory())
    return "{collective_engine} copy needs device memory the node's other ranks can map (CUDA virtual memory "
           "exported as POSIX file descriptors, which NCCL registers), and this GPU's driver does not give it";
  return "";
}

CollectiveEngine resolve_collective_engine(CollectiveEngine engine, SyncStrategy strategy, Sharding sharding,
                                           const Runtime& rt, Device& dev, const Communicator& comm) {
  if (engine != CollectiveEngine::Auto) return engine;
  const bool copy = strategy != SyncStrategy::None && sharding == Sharding::Zero1 && rt.world_size > 1 &&
                    copy_engines_unavailable(rt, dev.allocator(), comm.backend_name()).empty();
  return copy ? CollectiveEngine::Copy : CollectiveEngine::Sm;
}

bool can_share_compute_copy(Precision precision, MemoryPlan memory, Sharding sharding) {
  return (sharding == Sharding::Broadcast || sharding == Sharding::Zero1) && precision == Precision::BF16 &&
         memory != MemoryPlan::LowMemory;
}

const char* shared_weights_name(bool share_copy, Sharding sharding, Precision precision) {
  return share_copy || (shards_parameters(sharding) && precision == Precision::BF16) ? "bf16" : "master";
}

bool shares_compute_copy(ShareWeights choice, Precision precision, MemoryPlan memory, Sharding sharding) {
  if (choice != ShareWeights::Bf16)
    return choice == ShareWeights::Auto && can_share_compute_copy(precision, memory, sharding);
  if (sharding == Sharding::None)
    throw UsageError("{share_weights} bf16 says what a sharded optimizer sends: it needs {shard_optimizer} "
                     "broadcast or zero1");
  if (shards_parameters(sharding))
    throw UsageError(std::string("{shard_optimizer} ") + sharding_name(sharding) +
                     " gathers the weights in the dtype the model reads them in (bf16 under {precision} bf16) "
                     "already: {share_weights} applies to broadcast and zero1; leave it out");
  if (!can_share_compute_copy(precision, memory, sharding))
    throw UsageError("{share_weights} bf16 sends the bf16 copy of the weights, which only {precision} bf16 without "
                     "{low_memory} keeps: use {share_weights} master");
  return true;
}

std::unique_ptr<GradientSync> make_model_sync(const SyncPlan& plan, Communicator& comm, TransformerLM& model,
                                              bool share_copy, CollectiveEngine engine, Communicator* replicas) {
  LLMHPC_CHECK(engine != CollectiveEngine::Auto, "resolve_collective_engine first");
  const ReduceScratch scratch{&model.device().allocator(), engine == CollectiveEngine::Copy};
  if (!share_copy || plan.sharding == Sharding::None)
    return make_gradient_sync(plan, comm, model.grads(), model.params(), {}, scratch, replicas);
  LLMHPC_CHECK(!model.params_lowp().empty(), "{share_weights} bf16 with a model that keeps no bf16 copy");
  return make_gradient_sync(plan, comm, model.grads(), model.params(),
                            {model.params_lowp(), model.full_precision_ranges(), &model.device().allocator(),
                             engine == CollectiveEngine::Copy},
                            scratch, replicas);
}

SyncPlan data_parallel_plan(SyncStrategy strategy, Sharding sharding, const ParameterLayout& layout,
                            Precision precision, GradientDType grads, double bucket_mb, int ranks, int64_t alignment,
                            bool reduce_in_bf16) {
  check_grad_reduce(reduce_in_bf16, precision);
  const DType grad_dtype = gradient_dtype(precision, grads);  // buckets hold --bucket-mb of these
  if (shards_parameters(sharding)) return unit_plan(layout, strategy, sharding, ranks, alignment);
  SyncPlan plan =
      plan_sync(strategy, sharding, param_spans(layout), dtype_size(grad_dtype), bucket_mb, ranks, alignment);
  // Gradients made in bf16 travel as they are: there is nothing to round.
  plan.reduce_in_bf16 = reduce_in_bf16 && strategy != SyncStrategy::None && grad_dtype != DType::BF16;
  return plan;
}

int64_t shard_alignment(Device& dev, Precision precision, bool share_copy) {
  const int64_t page = int64_t(dev.allocator().page_bytes()) / int64_t(dtype_size(param_dtype(precision)));
  return share_copy && page > kShardAlignment ? round_up(page, kShardAlignment) : kShardAlignment;
}

namespace {
// Writes `path` from the whole checkpoint of this rank's parameters (`params`, `state` in its
// layout), which the data-parallel root (rt's rank 0) holds: alone, or under tensor
// parallelism with the parts of the other ranks of its group `tp`, which its rank 0 (rank 0 of
// every rank) puts together. Collective over rt and tp: every tensor-parallel group gathers and
// waits, the groups of the other data-parallel ranks with nothing to send, so that every rank
// issues the same calls and the collectives stay numbered alike on every rank (the watchdog's
// hang report compares the ranks' calls by number). A write the system refused (a full disk)
// is the writer's alone: it tells the others in the collective that ends the save, and every
// rank throws AgreedWriteFailed with its message.
void write_parts(const Runtime& rt, const Runtime* tp, const std::string& path, const ModelConfig& config,
                 const std::vector<float>& params, const OptimizerState& state) {
  std::string failed;  // the writer's WriteFailed
  auto write = [&](const std::vector<float>& values, const OptimizerState& of) {
    try {
      save_checkpoint(path, config, values, &of);
    } catch (const WriteFailed& e) {
      failed = e.what();
    }
  };
  if (!tp || tp->world_size == 1) {
    if (rt.is_root()) write(params, state);
  } else {
    const bool writer = rt.is_root();  // its group's parts make the file
    const int64_t total = ParameterLayout(config).total();
    std::vector<float> whole_params, packed;
    OptimizerState whole{state.step, state.hyper, {{0, total}}, {}, {}, state.options};
    if (writer) {
      packed = params;
      packed.insert(packed.end(), state.m.begin(), state.m.end());
      packed.insert(packed.end(), state.v.begin(), state.v.end());
    }
    if (writer && tp->is_root()) whole_params.assign(size_t(total), 0.0f), whole.m = whole.v = whole_params;
    tp->gather_to_root(packed, [&](int rank, const std::vector<float>& theirs) {
      if (!writer) return;
      const ParameterLayout part(config, TensorSplit{tp->world_size, rank});
      const auto n = size_t(part.total());
      LLMHPC_CHECK(theirs.size() == 3 * n, "rank " + std::to_string(rank) + " sent a part of the wrong size");
      place_part(whole_params, part, {theirs.begin(), theirs.begin() + long(n)});
      place_part(whole.m, part, {theirs.begin() + long(n), theirs.begin() + long(2 * n)});
      place_part(whole.v, part, {theirs.begin() + long(2 * n), theirs.end()});
    });
    if (writer && tp->is_root()) write(whole_params, whole);
    failed = tp->broadcast(failed);  // the file is complete before any data-parallel group goes on
  }
  failed = rt.broadcast(failed);  // the file is complete when any rank returns
  if (!failed.empty()) throw AgreedWriteFailed(failed);
}
}  // namespace

void save_checkpoint_from_ranks(const Runtime& rt, const std::string& path, TransformerLM& model, const AdamW& opt,
                                const SyncPlan& plan, const Runtime* tp, const std::string& options) {
  model.wait_parameters();  // on every rank, so that no rank's all-gathers wait on the others' progress
  OptimizerState mine = host_state(opt);
  const int64_t total = model.layout().total();
  OptimizerState whole{mine.step, mine.hyper, {{0, total}}, {}, {}, options};
  if (plan.sharding == Sharding::None) {  // rank 0 holds all of it
    whole.m = std::move(mine.m), whole.v = std::move(mine.v);
  } else {
    // Each rank of the first group (hybrid: rt's first plan.ranks; every group holds the whole
    // state) sends m then v of what it owns; rank 0 places them by the sender's ranges.
    std::vector<float> packed;
    if (rt.rank < plan.ranks) {
      packed = std::move(mine.m);
      packed.insert(packed.end(), mine.v.begin(), mine.v.end());
    }
    if (rt.is_root()) whole.m.assign(size_t(total), 0.0f), whole.v.assign(size_t(total), 0.0f);
    rt.gather_to_root(packed, [&](int rank, const std::vector<float>& theirs) {
      if (rank >= plan.ranks) return;
      const std::vector<FlatRange> owned = plan.owned(rank);
      const int64_t n = packed_size(owned);
      LLMHPC_CHECK(int64_t(theirs.size()) == 2 * n, "rank " + std::to_string(rank) + " sent a state of the wrong size");
      for (const PackedPiece& piece : packed_pieces(owned, {0, total})) {  // not the padding
        const auto from = theirs.begin() + piece.packed_offset;
        std::copy(from, from + piece.flat.size(), whole.m.begin() + piece.flat.begin);
        std::copy(from + n, from + n + piece.flat.size(), whole.v.begin() + piece.flat.begin);
      }
    });
  }
  std::vector<float> params;  // rank 0's, which it writes (or puts together with its group's other parts)
  if (rt.is_root()) params = to_host_floats(model.device(), model.params().slice(0, {total}));
  write_parts(rt, tp, path, model.config(), params, whole);
}

namespace {
// A shard-sized buffer (the masters, m or v) put together in the flat layout on rt's rank 0 only:
// the ranks of its shard group (rt's first ranks) send their shards one at a time, and the other
// groups, which hold the same values, send nothing. Every rank holds one shard on the host, rank
// 0 the whole buffer besides; gathered on every rank, the masters, m and v would take 12 bytes a
// parameter on every rank's host at once (18 GB a rank at xl). Collective over rt.
std::vector<float> gathered_on_root(const Runtime& rt, UnitShards& shards, const Tensor& shard,
                                    const ParameterLayout& layout) {
  const ShardLayout& cut = shards.layout();
  const bool sends = rt.rank < cut.ranks;  // rank r of rt is rank r % cut.ranks of its group
  const std::vector<float> mine = sends ? shards.host_shard(shard) : std::vector<float>{};
  std::vector<float> whole;
  if (rt.is_root()) whole.assign(size_t(layout.total()), 0.0f);
  rt.gather_to_root(mine, [&](int rank, const std::vector<float>& theirs) {
    if (rank >= cut.ranks) return;
    LLMHPC_CHECK(int64_t(theirs.size()) == cut.shard_elements,
                 "rank " + std::to_string(rank) + " sent a shard of the wrong size");
    for (const ShardLayout::Piece& piece : cut.pieces(layout, rank))
      std::copy(theirs.begin() + piece.shard, theirs.begin() + piece.shard + piece.count, whole.begin() + piece.flat);
  });
  return whole;
}
}  // namespace

void save_checkpoint_from_shards(const Runtime& rt, const std::string& path, UnitShards& shards, AdamW& opt,
                                 const Runtime* tp, const std::string& options) {
  opt.allocate_state();  // zeros before the first step, as an unsharded optimizer's
  const ParameterLayout& layout = opt.model().layout();
  OptimizerState whole{opt.steps_taken(),
                       opt.hyper(),
                       {{0, layout.total()}},
                       gathered_on_root(rt, shards, opt.m(), layout),
                       gathered_on_root(rt, shards, opt.v(), layout),
                       options};
  const std::vector<float> params = gathered_on_root(rt, shards, shards.masters(), layout);
  write_parts(rt, tp, path, opt.model().config(), params, whole);
}

void load_checkpoint_into_shards(const std::string& path, UnitShards& shards, AdamW& opt) {
  const HostCheckpoint file = read_checkpoint(path, opt.model().layout());
  if (!file.state) return shards.load(file.params);
  shards.load(file.params, &opt, &file.state->m, &file.state->v);
  opt.set_steps_taken(file.state->step);
}

GradClipping gradient_clipping(double max_norm, Sharding sharding, const Runtime& rt, int replicas) {
  GradClipping clipping{max_norm, nullptr, {}};
  if (sharding != Sharding::None)
    clipping.sum_over_ranks = [rt, replicas](double squares) { return rt.sum_in_rank_order(squares) / replicas; };
  return clipping;
}

GradClipping tensor_parallel_clipping(double max_norm, const Runtime& rt, int copies, const ParameterLayout& layout,
                                      const UnitShards* shards) {
  // Each rank's sum divided by its own copies: the data-parallel groups of different tensor
  // parallel ranks may cut their state into different shard groups (nodes of uneven sizes).
  GradClipping clipping{max_norm, [rt, copies](double squares) { return rt.sum_in_rank_order(squares / copies); }, {}};
  if (layout.tensor_split().rank == 0) return clipping;
  std::vector<FlatRange> whole;
  for (const ParamInfo& p : layout.params())
    if (p.split == Split::Whole) whole.push_back({p.offset, p.offset + p.shape.numel()});
  clipping.counted_elsewhere = shards ? shards->in_shard(whole) : whole;
  return clipping;
}

LocalBatch local_batch(int64_t global_batch, int rank, int world_size) {
  if (global_batch % world_size != 0)
    throw UsageError(
        "{batch_size} " + std::to_string(global_batch) + " is the global batch and must divide by the " +
        counted(world_size, "data-parallel rank") +
        " (each takes an equal share of its sequences; the ranks of a tensor-parallel group count as one)");
  const int64_t count = global_batch / world_size;
  return {int64_t(rank) * count, count};
}

std::unique_ptr<Communicator> make_model_communicator(const Runtime& rt, const std::string& backend, Device& dev,
                                                      bool copy_engines, int color) {
  if (backend == "mpi" && dev.kind() == DeviceKind::Cuda)
    throw UsageError("{backend} mpi reduces host buffers, but the model's gradients are on the GPU: use {backend} "
                     "nccl (or auto) with {device} cuda, or {device} cpu with mpi");
  if (backend == "nccl" && dev.kind() != DeviceKind::Cuda)
    throw UsageError("{backend} nccl needs GPUs: run with {device} cuda (or auto on a host with GPUs)");
  if (copy_engines) {
    const std::string why = copy_engines_unavailable(rt, dev.allocator(), backend);
    if (!why.empty()) throw UsageError(why + ": use {collective_engine} sm (or auto)");
  }
  CommOptions o;
  o.backend = backend == "nccl" ? CommBackend::Nccl : CommBackend::Mpi;
  o.gpu = dev.ordinal();
  o.compute_stream = dev.native_stream();
  o.parent = rt.comm;  // every rank of rt, which may be a group of the job's (Runtime::group)
  if (color < 0) return make_communicator(o);
  o.parent = rt.split(color);
  std::unique_ptr<Communicator> comm = make_communicator(o);  // which duplicates the parent
  Runtime::free_split(o.parent);
  return comm;
}

int resolve_shard_group(int shard_group, Sharding sharding, const Runtime& rt) {
  const bool hybrid = sharding == Sharding::Zero1 || shards_parameters(sharding);
  if (!hybrid || (shard_group == Parallelism::kAutoShardGroup && sharding == Sharding::Zero1)) return rt.world_size;
  const int group = shard_group > 0 ? shard_group : rt.local_size;
  const int64_t fewest = shard_group > 0 ? group : rt.reduce_all(int64_t(group), HostReduce::Min);
  const int64_t most = shard_group > 0 ? group : rt.reduce_all(int64_t(group), HostReduce::Max);
  if (fewest != most)  // a node's ranks, on nodes of different sizes
    throw UsageError((shard_group == Parallelism::kAutoShardGroup
                          ? std::string("{shard_optimizer} ") + sharding_name(sharding) +
                                " shards within each node by default ({shard_group} auto)"
                          : std::string("{shard_group} node shards within each node")) +
                     ", and this job's nodes hold " + std::to_string(fewest) + " to " + std::to_string(most) +
                     " ranks: give {shard_group} world (one copy of the state over every rank) or a number of ranks "
                     "that divides " +
                     std::to_string(rt.world_size));
  if (rt.world_size % group != 0)
    throw UsageError("{shard_group} " + std::to_string(group) + " does not divide the " +
                     std::to_string(rt.world_size) + " ranks into equal groups: give a divisor of " +
                     std::to_string(rt.world_size));
  return group;
}

bool rank_block_spans_nodes(const Runtime& rt, int group) {
  Runtime block = rt.group(rt.rank / group);
  const bool spans = block.spans_nodes();
  Runtime::free_group(block);
  return spans;
}

ShardGroups make_shard_groups(const Runtime& rt, const std::string& backend, Device& dev, int group,
                              bool copy_engines) {
  ShardGroups g;
  if (group == rt.world_size) {
    g.shard = make_model_communicator(rt, backend, dev, copy_engines);
    return g;
  }
  LLMHPC_CHECK(!copy_engines, "hybrid sharding averages over its groups with NCCL's kernels (check_zero1_groups)");
  g.shard = make_model_communicator(rt, backend, dev, false, rt.rank / group);
  g.replicas = make_model_communicator(rt, backend, dev, false, rt.rank % group);
  return g;
}

void check_zero1_groups(const Parallelism& p, int group, int world_size) {
  if (p.sharding != Sharding::Zero1 || group <= 0 || group == world_size) return;
  if (p.engine == CollectiveEngine::Copy)
    throw UsageError("{shard_optimizer} zero1 in groups ({shard_group}) averages its parts over the groups with "
                     "NCCL's kernels: use {collective_engine} sm (or auto)");
  if (p.reduce_in_bf16)
    throw UsageError("{shard_optimizer} zero1 in groups ({shard_group}) averages its parts over the groups in the "
                     "gradients' own dtype: leave {grad_reduce_dtype} bf16 out, or use {grad_dtype} bf16");
}

void check_parallelism(const Parallelism& p, Precision precision, MemoryPlan memory, int ranks) {
  mesh_place(0, ranks, p.tensor_parallel);  // tp divides the ranks
  if (p.sequence_parallel && p.tensor_parallel == 1)
    throw UsageError("{sequence_parallel} splits the tokens among the ranks of a tensor-parallel group: give {tp} 2 "
                     "or more");
  if (p.tp_overlap < 1) throw UsageError("{tp_overlap} " + std::to_string(p.tp_overlap) + ": give 1 or more chunks");
  if (p.tp_overlap > 1 && p.tensor_parallel == 1)
    throw UsageError("{tp_overlap} splits the products of a tensor-parallel group to hide its collectives: give {tp} "
                     "2 or more");
  const int world_size = p.data_parallel(ranks);  // what follows is among the data-parallel ranks
  require_reduced_gradients(p.strategy, p.sharding);
  shares_compute_copy(p.share_weights, precision, memory, p.sharding);
  check_grad_reduce(p.reduce_in_bf16, precision);
  if (!(p.bucket_mb > 0)) throw UsageError("{bucket_mb} " + fmt_exact(p.bucket_mb) + ": must be greater than 0");
  if (p.reduce_in_bf16 && p.strategy == SyncStrategy::None)
    throw UsageError("{grad_reduce_dtype} bf16 says what the ranks' gradients are averaged in, and {ddp} none "
                     "averages nothing (one rank trains alone by default): give several ranks, or leave it out");
  if (p.shard_group != Parallelism::kAutoShardGroup && p.sharding != Sharding::Zero1 && !shards_parameters(p.sharding))
    throw UsageError(std::string("{shard_group} says how many ranks share one copy of the model state under "
                                 "{shard_optimizer} zero1, zero2 or zero3, and this run uses ") +
                     sharding_name(p.sharding) + ": leave it out");
  check_zero1_groups(p, p.shard_group, world_size);  // a node's: once the nodes are known
  if (p.shard_group > 0 && world_size % p.shard_group != 0)
    throw UsageError("{shard_group} " + std::to_string(p.shard_group) + " does not divide the " +
                     counted(world_size, "data-parallel rank") + " into equal groups: give a divisor of " +
                     std::to_string(world_size));
  if (shards_parameters(p.sharding)) {
    const std::string stage = std::string("{shard_optimizer} ") + sharding_name(p.sharding);
    if (p.reduce_in_bf16)
      throw UsageError(stage + " reduces the gradients in the dtype backward writes them in: for bf16 on the wire, "
                               "use {grad_dtype} bf16 (with {precision} bf16) instead of {grad_reduce_dtype} bf16");
    if (p.engine == CollectiveEngine::Copy)
      throw UsageError(stage + " moves its gradients and weights with NCCL's kernels: {collective_engine} copy "
                               "applies to zero1; use {collective_engine} sm (or auto)");
  }
  if (world_size > 1 && p.strategy == SyncStrategy::None)
    throw UsageError("{ddp} none on " + counted(world_size, "data-parallel rank") +
                     " would train independent copies of the model: choose naive, flat, overlap or bucketed");
}

}  // namespace llmhpc

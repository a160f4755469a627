#include "src/modes/data_parallel.h"

#include <algorithm>

#include "src/core/units.h"
#include "src/model/checkpoint.h"
#include "src/modes/options.h"

namespace llmhpc {

void add_data_parallel_options(po::options_description& desc, bool sweep) {
  const std::string list = sweep ? " (a comma-separated list sweeps)" : "";
  desc.add_options()(
      "ddp", po::value<std::string>()->default_value(sweep ? "none,naive,flat,overlap,bucketed" : "auto"),
      ("gradient synchronisation over ranks: none | naive | flat | overlap | bucketed | auto (" +
       std::string(sweep ? "bucketed" : "bucketed on several ranks or with --shard-optimizer, none otherwise") + ")" +
       list + (sweep ? "; none: no communication, the compute-only baseline" : ""))
          .c_str())(
      "bucket-mb", po::value<std::string>()->default_value("25"),
      ("bucketed: bucket capacity in MiB, as PyTorch's bucket_cap_mb (a real number > 0)" + list).c_str())(
      "shard-optimizer", po::value<std::string>()->default_value("none"),
      ("optimizer state sharding: none | broadcast (each rank updates 1/n of the parameters and broadcasts "
       "them, the reference optimizer-sharding study's scheme) | zero1 (ZeRO stage 1: gradients "
       "reduce-scattered, updated parameters all-gathered); needs a --ddp other than none; checkpoints hold the "
       "whole optimizer state and resume under any sharding and rank count" +
       list)
          .c_str())(
      "share-weights", po::value<std::string>()->default_value("auto"),
      ("what a sharded optimizer's owners send after their update: master (the fp32 master weights; each rank "
       "casts its bf16 copy again in the next forward and holds none between steps) | bf16 (--precision bf16 "
       "without --low-memory: the bf16 copy itself, plus the masters of the embedding and norm gains: fewer "
       "bytes and no cast, the copy held between steps; the other masters come when a checkpoint reads them) | "
       "auto (bf16 where a run can, master otherwise)" +
       list)
          .c_str())(
      "collective-engine", po::value<std::string>()->default_value("sm"),
      ("what moves the gradients' bytes between GPUs (nccl): sm (NCCL's kernels, which hold SMs for as long as "
       "the transfer runs beside backward) | copy (the GPUs' copy engines: NCCL's zero-CTA all-to-all and "
       "all-gather into registered memory, the SMs only summing each rank's part; zero1's all-gathers of a "
       "shared bf16 copy too; the nccl backend on one node; faster where backward is long enough to hide its "
       "slower transfer, slower where communication dominates)" +
       list)
          .c_str())(
      "grad-reduce-dtype", po::value<std::string>()->default_value("same"),
      ("what the gradients travel and are averaged in: same (their own dtype, fp32: the exact average) | bf16 "
       "(each bucket rounded to bf16 before its collective and widened after, as PyTorch DDP's bf16_compress_hook: "
       "half the bytes, the average of the rounded gradients; not with --precision fp64); gradients made in bf16 "
       "(--grad-dtype bf16) travel as they are, with no casts" +
       list)
          .c_str());
}

std::vector<bool> grad_reduce_in_bf16(const po::variables_map& vm) {
  return opt_list(vm, "grad-reduce-dtype", [](const std::string& s) {
    require_choice(s, {"same", "bf16"}, "grad-reduce-dtype");
    return s == "bf16";
  });
}

void check_grad_reduce(bool in_bf16, Precision precision) {
  if (in_bf16 && param_dtype(precision) != DType::F32)
    throw UsageError(std::string("--grad-reduce-dtype bf16 rounds fp32 gradients, and --precision ") +
                     precision_name(precision) + " keeps them in " + dtype_name(param_dtype(precision)) +
                     ": use --grad-reduce-dtype same");
}

std::string grad_reduce_dtype_name(bool in_bf16, DType grads) { return in_bf16 ? "bf16" : dtype_name(grads); }

const char* collective_engine_name(CollectiveEngine engine) { return engine == CollectiveEngine::Copy ? "copy" : "sm"; }

std::vector<CollectiveEngine> collective_engines(const po::variables_map& vm) {
  return opt_list(vm, "collective-engine", [](const std::string& s) {
    require_choice(s, {"sm", "copy"}, "collective-engine");
    return s == "copy" ? CollectiveEngine::Copy : CollectiveEngine::Sm;
  });
}

std::vector<ShareWeights> share_weights(const po::variables_map& vm) {
  return opt_list(vm, "share-weights", [](const std::string& s) {
    require_choice(s, {"auto", "master", "bf16"}, "share-weights");
    return s == "auto" ? ShareWeights::Auto : s == "bf16" ? ShareWeights::Bf16 : ShareWeights::Master;
  });
}

bool can_share_compute_copy(Precision precision, MemoryPlan memory, Sharding sharding) {
  return sharding != Sharding::None && precision == Precision::BF16 && memory != MemoryPlan::LowMemory;
}

bool shares_compute_copy(ShareWeights choice, Precision precision, MemoryPlan memory, Sharding sharding) {
  if (choice != ShareWeights::Bf16)
    return choice == ShareWeights::Auto && can_share_compute_copy(precision, memory, sharding);
  if (sharding == Sharding::None)
    throw UsageError("--share-weights bf16 says what a sharded optimizer sends: it needs --shard-optimizer "
                     "broadcast or zero1");
  if (!can_share_compute_copy(precision, memory, sharding))
    throw UsageError("--share-weights bf16 sends the bf16 copy of the weights, which only --precision bf16 without "
                     "--low-memory keeps: use --share-weights master");
  return true;
}

std::unique_ptr<GradientSync> make_model_sync(const SyncPlan& plan, Communicator& comm, TransformerLM& model,
                                              bool share_copy, CollectiveEngine engine) {
  const ReduceScratch scratch{&model.device().allocator(), engine == CollectiveEngine::Copy};
  if (!share_copy || plan.sharding == Sharding::None)
    return make_gradient_sync(plan, comm, model.grads(), model.params(), {}, scratch);
  LLMHPC_CHECK(!model.params_lowp().empty(), "--share-weights bf16 with a model that keeps no bf16 copy");
  return make_gradient_sync(plan, comm, model.grads(), model.params(),
                            {model.params_lowp(), model.full_precision_ranges(), &model.device().allocator(),
                             engine == CollectiveEngine::Copy},
                            scratch);
}

std::vector<SyncStrategy> sync_strategies(const po::variables_map& vm, int world_size, bool sharded) {
  return opt_list(vm, "ddp", [&](const std::string& s) {
    return s == "auto" ? (world_size > 1 || sharded ? SyncStrategy::Bucketed : SyncStrategy::None)
                       : parse_sync_strategy(s);
  });
}

std::vector<double> bucket_sizes_mb(const po::variables_map& vm) {
  return opt_list(vm, "bucket-mb", [](const std::string& s) {
    const double mb = parse_double(s, "bucket-mb");
    if (!(mb > 0))
      throw UsageError("--bucket-mb '" + s + "': must be a number of MiB greater than 0 (e.g. 25, or 0.05)");
    return mb;
  });
}

std::vector<Sharding> shardings(const po::variables_map& vm) {
  return opt_list(vm, "shard-optimizer", [](const std::string& s) { return parse_sharding(s); });
}

SyncPlan data_parallel_plan(SyncStrategy strategy, Sharding sharding, const ModelConfig& config, Precision precision,
                            GradientDType grads, double bucket_mb, int ranks, int64_t alignment, bool reduce_in_bf16) {
  check_grad_reduce(reduce_in_bf16, precision);
  const DType grad_dtype = gradient_dtype(precision, grads);  // buckets hold --bucket-mb of these
  SyncPlan plan = plan_sync(strategy, sharding, param_spans(ParameterLayout(config)), dtype_size(grad_dtype), bucket_mb,
                            ranks, alignment);
  // Gradients made in bf16 travel as they are: there is nothing to round.
  plan.reduce_in_bf16 = reduce_in_bf16 && strategy != SyncStrategy::None && grad_dtype != DType::BF16;
  return plan;
}

int64_t shard_alignment(Device& dev, Precision precision, bool share_copy) {
  const int64_t page = int64_t(dev.allocator().page_bytes()) / int64_t(dtype_size(param_dtype(precision)));
  return share_copy && page > kShardAlignment ? round_up(page, kShardAlignment) : kShardAlignment;
}

void save_checkpoint_from_ranks(const Runtime& rt, const std::string& path, TransformerLM& model, const AdamW& opt,
                                const SyncPlan& plan) {
  model.wait_parameters();  // on every rank, so that no rank's all-gathers wait on the others' progress
  OptimizerState mine = host_state(opt);
  if (plan.sharding == Sharding::None) {  // rank 0 holds all of it
    if (rt.is_root()) save_checkpoint(path, model, &mine);
  } else {
    // Each rank sends m then v of what it owns; rank 0 places them by the sender's ranges.
    std::vector<float> packed = std::move(mine.m);
    packed.insert(packed.end(), mine.v.begin(), mine.v.end());
    const int64_t total = model.layout().total();
    OptimizerState whole{mine.step, mine.hyper, {{0, total}}, {}, {}};
    if (rt.is_root()) whole.m.assign(size_t(total), 0.0f), whole.v.assign(size_t(total), 0.0f);
    rt.gather_to_root(packed, [&](int rank, const std::vector<float>& theirs) {
      const std::vector<FlatRange> owned = plan.owned(rank);
      const int64_t n = packed_size(owned);
      LLMHPC_CHECK(int64_t(theirs.size()) == 2 * n, "rank " + std::to_string(rank) + " sent a state of the wrong size");
      for (const PackedPiece& piece : packed_pieces(owned, {0, total})) {  // not the padding
        const auto from = theirs.begin() + piece.packed_offset;
        std::copy(from, from + piece.flat.size(), whole.m.begin() + piece.flat.begin);
        std::copy(from + n, from + n + piece.flat.size(), whole.v.begin() + piece.flat.begin);
      }
    });
    if (rt.is_root()) save_checkpoint(path, model, &whole);
  }
  rt.barrier();  // the file is complete when any rank returns
}

void record_memory(Record& rec, const std::string& point, const MemoryBreakdown& memory) {
  rec.attr("memory_" + point + "_bytes", memory.total);
  for (const auto& [category, bytes] : memory.bytes) rec.attr("memory_" + point + "_" + category + "_bytes", bytes);
}

std::unique_ptr<Communicator> make_gradient_communicator(const Runtime& rt, const po::variables_map& vm, Device& dev) {
  std::unique_ptr<Communicator> comm;
  collective_check(rt, [&] {
    const std::string backend = resolve_backend(vm, dev.kind());
    if (backend == "mpi" && dev.kind() == DeviceKind::Cuda)
      throw UsageError("--backend mpi reduces host buffers, but the model's gradients are on the GPU: use --backend "
                       "nccl (or auto) with --device cuda, or --device cpu with mpi");
    if (backend == "nccl" && dev.kind() != DeviceKind::Cuda)
      throw UsageError("--backend nccl needs GPUs: run with --device cuda (or auto on a host with GPUs)");
    for (CollectiveEngine engine : collective_engines(vm)) {
      if (engine != CollectiveEngine::Copy) continue;
      if (backend != "nccl")
        throw UsageError("--collective-engine copy moves the gradients with the GPUs' copy engines, which needs the "
                         "nccl backend (--device cuda); this run's collectives go over " +
                         backend + ": use --collective-engine sm");
      if (rt.local_size != rt.world_size)  // the same verdict on every rank: one node holds all or not
        throw UsageError("--collective-engine copy works between the GPUs of one node (NCCL's copy-engine "
                         "collectives); this job's " +
                         std::to_string(rt.world_size) + " ranks span several nodes: use --collective-engine sm");
      if (!dev.allocator().shares_memory())
        throw UsageError("--collective-engine copy needs device memory the node's other ranks can map (CUDA "
                         "virtual memory exported as POSIX file descriptors, which NCCL registers), and this "
                         "GPU's driver does not give it: use --collective-engine sm");
    }
    CommOptions o;
    o.backend = backend == "nccl" ? CommBackend::Nccl : CommBackend::Mpi;
    o.gpu = dev.ordinal();
    o.compute_stream = dev.native_stream();
    comm = make_communicator(o);
  });
  return comm;
}

GradClipping gradient_clipping(double max_norm, Sharding sharding, const Runtime& rt) {
  GradClipping clipping{max_norm, nullptr};
  if (sharding != Sharding::None)
    clipping.sum_over_ranks = [rt](double squares) { return rt.sum_in_rank_order(squares); };
  return clipping;
}

LocalBatch local_batch(int64_t global_batch, int rank, int world_size) {
  if (global_batch % world_size != 0)
    throw UsageError("--batch-size " + std::to_string(global_batch) + " is the global batch and must divide by the " +
                     std::to_string(world_size) + " ranks (each takes an equal share of its sequences)");
  const int64_t count = global_batch / world_size;
  return {int64_t(rank) * count, count};
}

}  // namespace llmhpc

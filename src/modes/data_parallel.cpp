#include "src/modes/data_parallel.h"

#include <algorithm>

#include "src/core/units.h"
#include "src/modes/options.h"

namespace llmhpc {

void add_tensor_parallel_options(po::options_description& desc, const ListUse& use) {
  const bool sweep = use.sweeps();
  const std::string list = sweep ? " (a comma-separated list sweeps)" : "";
  desc.add_options()(
      "tp", listable(use, "tp", "1"),
      ("tensor parallelism: ranks in each tensor-parallel group (Megatron-LM's split: q/k/v and w1/w3 by output "
       "rows, the attention output and w2 by input columns, the embedding and the LM head by vocabulary, padded to "
       "a multiple of 8 x tp, every rank holding some of it); groups of consecutive ranks, so inside a node where a "
       "node's ranks divide by it, data parallelism across the groups (ranks / tp of them); the heads and d_ff "
       "must divide by it" +
       list)
          .c_str())(
      "sequence-parallel", po::bool_switch(),
      ("with --tp: the norms and the residual stream split among a group's ranks by tokens too (an all-gather "
       "before each column-parallel product and a reduce-scatter after each row-parallel one instead of the "
       "all-reduce: the same bytes in forward, and backward gathers each column-parallel input again for its "
       "weight gradient; 1/tp of those activations' memory); each micro-batch's tokens (a data-parallel rank's "
       "share of the batch x context, in train over --grad-accum) must divide by --tp" +
       std::string(sweep ? "; applies to every --tp above 1" : ""))
          .c_str())(
      "tp-overlap", listable(use, "tp-overlap", "1"),
      ("with --tp: forward's products split into this many chunks of tokens to hide the group's collectives "
       "(torchtitan's async tensor parallelism): each row-parallel product's all-reduce or reduce-scatter runs "
       "chunk by chunk under the next chunk's product, and under --sequence-parallel each all-gather under the "
       "product of the rank's own tokens; 1: not split (backward hides each input gradient's reduction under the "
       "weight gradient either way)" +
       std::string(sweep ? "; a comma-separated list sweeps, each --tp above 1" : ""))
          .c_str());
}

void add_data_parallel_options(po::options_description& desc, const ListUse& use) {
  const bool sweep = use.sweeps();
  const std::string list = sweep ? " (a comma-separated list sweeps)" : "";
  desc.add_options()(
      "ddp", listable(use, "ddp", sweep ? "none,naive,flat,overlap,bucketed" : "auto"),
      ("gradient synchronisation over ranks: none | naive | flat | overlap | bucketed | auto (" +
       std::string(sweep ? "bucketed"
                         : "bucketed on several data-parallel ranks or with --shard-optimizer, none otherwise") +
       ")" + list + (sweep ? "; none: no communication, the compute-only baseline" : ""))
          .c_str())(
      "bucket-mb", listable(use, "bucket-mb", "25"),
      ("bucketed: bucket capacity in MiB, as PyTorch's bucket_cap_mb (a real number > 0)" + list).c_str())(
      "shard-optimizer", listable(use, "shard-optimizer", sweep ? "none" : "auto"),
      ("what is sharded among the data-parallel ranks (ZeRO's stages): auto (zero1 on several: the same weights, "
       "half the optimizer state and time per rank; none on one) | none | broadcast (each rank updates 1/n of the "
       "parameters and broadcasts them, the reference optimizer-sharding study's scheme) | zero1 (ZeRO stage 1: "
       "the optimizer state; gradients reduce-scattered, updated parameters all-gathered) | zero2 (stage 2: the "
       "gradients and fp32 master weights too; each unit of the model, the embedding, a layer or the head, "
       "reduce-scattered as backward finishes it, the weights all-gathered once a step) | zero3 (stage 3, FSDP: "
       "the weights too; each unit all-gathered just before forward and again before backward reads it, one "
       "unit ahead, and let go after: 12 bytes per parameter / ranks between steps, 16 during one with the "
       "gradients' shards, plus two units); needs a --ddp other than "
       "none (zero2 and zero3: bucketed, their buckets are the units); checkpoints hold the whole optimizer state "
       "and resume under any sharding and rank count" +
       list)
          .c_str())(
      "shard-group", po::value<std::string>()->default_value("auto"),
      "zero1, zero2 and zero3: how many data-parallel ranks (all ranks without --tp; under --tp, the ranks "
      "holding the same part of the model) share one copy of the model state: auto (node for zero2 and zero3, "
      "world for zero1) | node (the ranks of one node: sharded within each node, replicated across nodes, each "
      "step's gradients averaged over the nodes as backward goes on; every rank on one node) | world | N (groups "
      "of N consecutive data-parallel ranks, N dividing them)")(
      "share-weights", listable(use, "share-weights", "auto"),
      ("what a sharded optimizer's owners send after their update: master (the fp32 master weights; each rank "
       "casts its bf16 copy again in the next forward and holds none between steps) | bf16 (--precision bf16 "
       "without --low-memory: the bf16 copy itself, plus the masters of the embedding and norm gains: fewer "
       "bytes and no cast, the copy held between steps; the other masters come when a checkpoint reads them) | "
       "auto (bf16 where a run can, master otherwise)" +
       list)
          .c_str())(
      "collective-engine", listable(use, "collective-engine", sweep ? "sm" : "auto"),
      ("what moves the gradients' bytes between GPUs (nccl): auto (copy under zero1 where the run can use the "
       "copy engines, sm otherwise: the fastest exact choice measured) | sm (NCCL's kernels, which hold SMs for as "
       "long as "
       "the transfer runs beside backward) | copy (the GPUs' copy engines: NCCL's zero-CTA all-to-all and "
       "all-gather into registered memory, the SMs only summing each rank's part; zero1's all-gathers of a "
       "shared bf16 copy too; the nccl backend on one node; faster where backward is long enough to hide its "
       "slower transfer, slower where communication dominates)" +
       list)
          .c_str())(
      "grad-reduce-dtype", listable(use, "grad-reduce-dtype", "same"),
      ("what the gradients travel and are averaged in: same (their own dtype, fp32: the exact average) | bf16 "
       "(each bucket rounded to bf16 before its collective and widened after, as PyTorch DDP's bf16_compress_hook: "
       "half the bytes, the average of the rounded gradients; not with --precision fp64, nor under zero2 and "
       "zero3, which reduce in the dtype backward writes); gradients made in bf16 (--grad-dtype bf16) travel as "
       "they are, with no casts" +
       list)
          .c_str());
  add_tensor_parallel_options(desc, use);
}

std::string tensor_parallel_label(int tp, bool sequence_parallel, int overlap) {
  return tp == 1 ? ""
                 : "_tp" + std::to_string(tp) + (sequence_parallel ? "sp" : "") +
                       (overlap > 1 ? "ov" + std::to_string(overlap) : "");
}

std::vector<int> tensor_parallel_overlaps(const po::variables_map& vm) {
  return opt_list(vm, "tp-overlap", [](const std::string& s) {
    const int64_t k = parse_int(s, "tp-overlap");
    if (k < 1) throw UsageError("--tp-overlap must be positive (got " + std::to_string(k) + "; 1: products not split)");
    return fits_int(k, "tp-overlap");
  });
}

std::vector<int> tensor_parallel_sizes(const po::variables_map& vm) {
  return opt_list(vm, "tp", [](const std::string& s) {
    const int64_t tp = parse_int(s, "tp");
    if (tp < 1) throw UsageError("--tp must be positive (got " + std::to_string(tp) + "; 1: no tensor parallelism)");
    return fits_int(tp, "tp");
  });
}

TensorParallelSweep tensor_parallel_sweep(const po::variables_map& vm) {
  TensorParallelSweep t{tensor_parallel_sizes(vm), opt_flag(vm, "sequence-parallel"), tensor_parallel_overlaps(vm)};
  const bool any_tp = std::any_of(t.sizes.begin(), t.sizes.end(), [](int tp) { return tp > 1; });
  if (t.sequence_parallel && !any_tp)
    throw UsageError("--sequence-parallel splits the tokens among the ranks of a tensor-parallel group: add a --tp "
                     "above 1 (e.g. --tp 2)");
  if (std::any_of(t.overlaps.begin(), t.overlaps.end(), [](int k) { return k > 1; }) && !any_tp)
    throw UsageError("--tp-overlap splits the products of a tensor-parallel group to hide its collectives: add a "
                     "--tp above 1 (e.g. --tp 2)");
  return t;
}

void check_tensor_parallel_case(const ModelConfig& model, int world_size, int tp, bool sequence_parallel, int overlap,
                                int64_t tokens, const std::string& tokens_from) {
  mesh_place(0, world_size, tp);  // tp divides the ranks
  // The heads and d_ff divide among tp ranks (offering the sizes that divide the ranks too), and
  // the last rank, which holds the least of the vocabulary, holds some: every rank finds the
  // same error, before any collective.
  check_tensor_split(model, tp, world_size);
  ParameterLayout(model, TensorSplit{tp, tp - 1});
  if (sequence_parallel && tokens % tp != 0)
    throw UsageError("--sequence-parallel splits each micro-batch's " + std::to_string(tokens) + " tokens among --tp " +
                     std::to_string(tp) + " ranks: give a " + tokens_from + " whose tokens per micro-batch divide by " +
                     std::to_string(tp));
  const int64_t split = sequence_parallel ? tokens / tp : tokens;  // the tokens forward's products split
  if (tp > 1 && overlap > split)
    throw UsageError("--tp-overlap " + std::to_string(overlap) + " splits forward's products, of " +
                     std::to_string(split) + " tokens each" + (sequence_parallel ? " (a rank's share)" : "") +
                     ", into " + std::to_string(overlap) + " chunks: give at most " + std::to_string(split));
}

std::vector<bool> grad_reduce_in_bf16(const po::variables_map& vm) {
  return opt_list(vm, "grad-reduce-dtype", [](const std::string& s) {
    require_choice(s, {"same", "bf16"}, "grad-reduce-dtype");
    return s == "bf16";
  });
}

std::vector<CollectiveEngine> collective_engines(const po::variables_map& vm) {
  return opt_list(vm, "collective-engine", [](const std::string& s) {
    require_choice(s, {"auto", "sm", "copy"}, "collective-engine");
    return s == "copy" ? CollectiveEngine::Copy : s == "sm" ? CollectiveEngine::Sm : CollectiveEngine::Auto;
  });
}

std::vector<ShareWeights> share_weights(const po::variables_map& vm) {
  return opt_list(vm, "share-weights", [](const std::string& s) {
    require_choice(s, {"auto", "master", "bf16"}, "share-weights");
    return s == "auto" ? ShareWeights::Auto : s == "bf16" ? ShareWeights::Bf16 : ShareWeights::Master;
  });
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

std::vector<Sharding> shardings(const po::variables_map& vm, int world_size) {
  return opt_list(vm, "shard-optimizer", [&](const std::string& s) {
    if (s == "auto") return world_size > 1 ? Sharding::Zero1 : Sharding::None;
    return parse_sharding(s);
  });
}

void record_memory(Record& rec, const std::string& point, const MemoryBreakdown& memory) {
  rec.attr("memory_" + point + "_bytes", memory.total);
  for (const auto& [category, bytes] : memory.bytes) rec.attr("memory_" + point + "_" + category + "_bytes", bytes);
}

Parallelism parallelism(const po::variables_map& vm, int ranks) {
  Parallelism p;
  p.tensor_parallel = tensor_parallel_sizes(vm).front();
  p.sequence_parallel = opt_flag(vm, "sequence-parallel");
  p.tp_overlap = tensor_parallel_overlaps(vm).front();
  // What follows is among the data-parallel ranks (all of them without tensor parallelism).
  const int world_size = ranks % p.tensor_parallel == 0 ? p.data_parallel(ranks) : ranks;
  p.sharding = shardings(vm, world_size).front();
  p.strategy = sync_strategies(vm, world_size, p.sharding != Sharding::None).front();
  // --ddp none trains each rank alone: auto shards nothing there (check_parallelism says why).
  if (p.strategy == SyncStrategy::None && opt_string(vm, "shard-optimizer") == "auto") p.sharding = Sharding::None;
  p.bucket_mb = bucket_sizes_mb(vm).front();
  p.share_weights = share_weights(vm).front();
  p.engine = collective_engines(vm).front();
  p.reduce_in_bf16 = grad_reduce_in_bf16(vm).front();
  p.shard_group = shard_group(vm, world_size);
  return p;
}

int shard_group(const po::variables_map& vm, int world_size) {
  const std::string group = opt_string(vm, "shard-group");
  if (group == "auto") return Parallelism::kAutoShardGroup;
  if (group == "node") return 0;
  if (group == "world") return world_size;
  return fits_int(opt_positive(vm, "shard-group"), "shard-group");
}

std::unique_ptr<TensorParallelMesh> make_tensor_parallel_mesh(const Runtime& rt, int tp, const std::string& backend,
                                                              Device& dev) {
  std::unique_ptr<TensorParallelMesh> mesh;
  collective_check(
      rt, [&] { mesh = std::make_unique<TensorParallelMesh>(rt, tp, resolve_backend(backend, dev.kind()), dev); });
  // Every rank's group, not rank 0's alone: --map-by node, or nodes of uneven sizes, leave
  // other groups across nodes.
  if (tp > 1 && rt.reduce_all(int64_t(mesh->ranks.tp_spans_nodes()), HostReduce::Max) > 0)
    log_root(rt,
             "warning: a tensor-parallel group of --tp %d spans nodes: its collectives (four per layer and step in "
             "forward and backward, each of batch x context x d_model elements; more with --sequence-parallel) "
             "cross the network, typically "
             "10-20x slower than NVLink inside a node; place tp groups inside nodes (tp dividing the ranks per "
             "node)\n",
             tp);
  return mesh;
}

bool warn_of_node_shard_groups(const Runtime& world, const Runtime& dp, int requested, int group) {
  if (requested > 0) return false;  // the option: the same on every rank
  // `group` is agreed within `dp`, not across data-parallel groups: every rank takes part below.
  const bool alone = group == 1 && dp.world_size > 1;  // one rank of the group on each node
  const bool spans = group < dp.world_size && rank_block_spans_nodes(dp, group);
  const int64_t found = world.reduce_all(int64_t(alone) * 2 + int64_t(spans), HostReduce::Max);
  const char* option = requested == Parallelism::kAutoShardGroup ? "auto" : "node";
  if (found >= 2)
    log_root(world,
             "warning: sharding within each node (--shard-group %s), and here (--tp %d) a node holds one rank of a "
             "data-parallel group: such groups shard nothing (1 rank, holding the whole state); give "
             "--shard-group world (or a number) to shard across the nodes\n",
             option, world.world_size / dp.world_size);
  else if (found == 1)
    log_root(world,
             "warning: sharding within each node (--shard-group %s) cuts the state within groups of %d consecutive "
             "ranks, and here such "
             "groups span nodes (ranks not numbered node by node, as mpirun --map-by node places them): their "
             "collectives cross the network; launch with the ranks of a node numbered together (mpirun's and "
             "srun's default placement), or give --shard-group a number\n",
             option, group);
  return found > 0;
}

}  // namespace llmhpc

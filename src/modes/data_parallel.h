// The command line of data parallelism (modes train and ddp; --tp also memory and profile): --ddp, --bucket-mb,
// --shard-optimizer, --share-weights, --collective-engine and --grad-reduce-dtype parsed into
// the fields of src/dist/parallelism.h, and the memory attributes of the reference
// optimizer-sharding study's three points. What the options do lives in src/dist.
#pragma once
#include <memory>
#include <vector>

#include "src/dist/parallelism.h"
#include "src/dist/tensor_parallel.h"
#include "src/modes/mode.h"
#include "src/modes/options.h"

namespace llmhpc {

// The options. A sweep (ddp) takes comma-separated lists and every strategy by default;
// training takes one value each: bucketed and zero1 on several ranks, the collective engine
// chosen by resolve_collective_engine.
void add_data_parallel_options(po::options_description& desc, const ListUse& use);
// --ddp, with "auto" resolved: bucketed on several ranks or for a sharded optimizer (which
// needs its gradients reduced, even on one rank), none otherwise. Throws UsageError.
std::vector<SyncStrategy> sync_strategies(const po::variables_map& vm, int world_size, bool sharded = false);
// --bucket-mb values (MiB, as PyTorch's bucket_cap_mb), each > 0. Throws UsageError.
std::vector<double> bucket_sizes_mb(const po::variables_map& vm);
// --shard-optimizer values, auto resolved for `world_size` ranks: zero1 on several ranks (the same
// weights as unsharded, bitwise on 2 ranks, half AdamW's state and time per rank, and never a
// slower step on the measured grid: docs/results/sharding.md), none on one. Throws UsageError.
std::vector<Sharding> shardings(const po::variables_map& vm, int world_size);
// --share-weights values. Throws UsageError.
std::vector<ShareWeights> share_weights(const po::variables_map& vm);
// --collective-engine values. Throws UsageError.
std::vector<CollectiveEngine> collective_engines(const po::variables_map& vm);
// --grad-reduce-dtype values: whether the gradients travel as bf16 (SyncPlan::reduce_in_bf16)
// rather than in their own dtype (`same`). Throws UsageError.
std::vector<bool> grad_reduce_in_bf16(const po::variables_map& vm);
// --tp, --sequence-parallel and --tp-overlap (part of add_data_parallel_options; mode memory's alone).
void add_tensor_parallel_options(po::options_description& desc, const ListUse& use);
// A configuration's label suffix: "" at tp 1, "_tp2", "_tp2sp" with sequence parallelism,
// "_tp2ov4" with forward's products in 4 chunks.
std::string tensor_parallel_label(int tp, bool sequence_parallel, int overlap = 1);
// --tp values, each at least 1 (whether one divides the ranks: mesh_place). Throws UsageError.
std::vector<int> tensor_parallel_sizes(const po::variables_map& vm);
// --tp-overlap values, each at least 1. Throws UsageError.
std::vector<int> tensor_parallel_overlaps(const po::variables_map& vm);
// A sweep's --tp values, and --sequence-parallel and the --tp-overlap values, which apply to
// every one above 1: a UsageError where none is.
struct TensorParallelSweep {
  std::vector<int> sizes;
  bool sequence_parallel = false;
  std::vector<int> overlaps{1};
  bool sequence_parallel_at(int tp) const { return sequence_parallel && tp > 1; }
  std::vector<int> overlaps_at(int tp) const { return tp > 1 ? overlaps : std::vector<int>{1}; }
};
TensorParallelSweep tensor_parallel_sweep(const po::variables_map& vm);
// A UsageError unless `tp` divides the `world_size` ranks and the model's heads, d_ff and
// vocabulary, under sequence parallelism the `tokens` of a tensor-parallel group's micro-batch,
// and the `overlap` chunks of forward's products hold a token each.
// `tokens_from`: the options that set the micro-batch, for the refusal.
void check_tensor_parallel_case(const ModelConfig& model, int world_size, int tp, bool sequence_parallel, int overlap,
                                int64_t tokens, const std::string& tokens_from = "--batch-size or --context-length");
// Training's one Parallelism (each option's single value) for `world_size` ranks.
Parallelism parallelism(const po::variables_map& vm, int world_size);
// --shard-group as Parallelism::shard_group: kAutoShardGroup for auto, 0 for node, the world size
// for world, else the number.
int shard_group(const po::variables_map& vm, int world_size);

// The tp x dp layout of `rt`'s ranks with the tensor-parallel group's collectives on --backend
// `backend` (TensorParallelMesh): a UsageError agreed by every rank, and a warning from rank 0
// where a tensor-parallel group spans nodes. Collective.
std::unique_ptr<TensorParallelMesh> make_tensor_parallel_mesh(const Runtime& rt, int tp, const std::string& backend,
                                                              Device& dev);

// Rank 0 of `world` warns, once, where the shard groups of --shard-group node (zero2's and
// zero3's default), blocks of `group` consecutive ranks of this rank's data-parallel group `dp`,
// shard nothing (one rank of the group on each node: tp groups filling the nodes) or span nodes.
// `requested`: Parallelism's shard_group. Returns whether it warned (the same on every rank).
// Collective over `world`.
bool warn_of_node_shard_groups(const Runtime& world, const Runtime& dp, int requested, int group);

// The memory at one of the reference optimizer-sharding study's points ("after_init",
// "before_optimizer", "after_optimizer") as attributes: memory_<point>_bytes, and
// memory_<point>_<category>_bytes for each category of model_memory_categories() and "other".
void record_memory(Record& rec, const std::string& point, const MemoryBreakdown& memory);

}  // namespace llmhpc

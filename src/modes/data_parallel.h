// The command line of data parallelism (modes train and ddp): --ddp, --bucket-mb,
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
// --tp and --sequence-parallel (part of add_data_parallel_options; mode memory's alone).
void add_tensor_parallel_options(po::options_description& desc, const ListUse& use);
// A configuration's label suffix: "" at tp 1, "_tp2", "_tp2sp" with sequence parallelism.
std::string tensor_parallel_label(int tp, bool sequence_parallel);
// --tp values, each at least 1 (whether one divides the ranks: mesh_place). Throws UsageError.
std::vector<int> tensor_parallel_sizes(const po::variables_map& vm);
// Training's one Parallelism (each option's single value) for `world_size` ranks.
Parallelism parallelism(const po::variables_map& vm, int world_size);
// --shard-group as Parallelism::shard_group: kAutoShardGroup for auto, 0 for node, the world size
// for world, else the number.
int shard_group(const po::variables_map& vm, int world_size);

// The warning for a tensor-parallel group whose ranks sit on several nodes, printed by rank 0.
// Collective.
void warn_if_tp_spans_nodes(const Runtime& rt, const MeshRuntimes& mesh);

// The memory at one of the reference optimizer-sharding study's points ("after_init",
// "before_optimizer", "after_optimizer") as attributes: memory_<point>_bytes, and
// memory_<point>_<category>_bytes for each category of model_memory_categories() and "other".
void record_memory(Record& rec, const std::string& point, const MemoryBreakdown& memory);

}  // namespace llmhpc

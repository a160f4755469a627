// Parallelism: how a training step is spread over the ranks, in one typed config, and what
// a mode needs to run it: the plan (which ranges travel, who updates what), the communicator
// the gradients travel over, the synchronisation the model's backward and the optimizer drive,
// the gradient clipping over ranks, a checkpoint gathered from sharded optimizer state, and
// each rank's share of a global batch. The command line fills a Parallelism (src/modes);
// everything below names configuration fields, never flags.
//
// The model speaks one protocol to it (src/model/parallel_hooks.h): gradients of a range
// final as backward finishes them, parameters of a range needed before forward reads them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "src/core/runtime.h"
#include "src/dist/grad_sync.h"
#include "src/dist/unit_shards.h"
#include "src/model/adamw.h"
#include "src/model/transformer.h"

namespace llmhpc {

// What a sharded optimizer's owners send after their update (grad_sync.h): the fp32 masters,
// the bf16 copy the model reads (bf16 without --low-memory), or bf16 wherever a run can.
enum class ShareWeights { Auto, Master, Bf16 };

// What moves the gradients' bytes between GPUs. Sm: NCCL's kernels; Copy: the GPUs' copy
// engines, the SMs only summing each rank's part (src/dist/copy_engine_reduction.h); Auto:
// resolve_collective_engine's choice.
enum class CollectiveEngine { Sm, Copy, Auto };
const char* collective_engine_name(CollectiveEngine engine);  // "sm", "copy", "auto"

struct Parallelism {
  SyncStrategy strategy = SyncStrategy::None;
  Sharding sharding = Sharding::None;
  double bucket_mb = 25;  // bucketed: capacity in MiB of gradient bytes, as PyTorch's bucket_cap_mb
  ShareWeights share_weights = ShareWeights::Auto;
  CollectiveEngine engine = CollectiveEngine::Auto;
  bool reduce_in_bf16 = false;  // fp32 gradients travel and are averaged as bf16
  // zero1, zero2, zero3: how many ranks share one copy of the model state (hybrid sharding:
  // sharded within each group of consecutive ranks, replicated across the groups, as
  // torchtitan's HSDP); 0: the ranks of one node (every rank when the job is one node);
  // kAutoShardGroup: a node's for zero2 and zero3, whose state is what hybrid sharding is for,
  // every rank's for zero1 (resolve_shard_group).
  static constexpr int kAutoShardGroup = -1;
  int shard_group = kAutoShardGroup;
  // Tensor parallelism (src/model/tensor_parallel.h): ranks in each tensor-parallel group, the
  // world being tensor_parallel x data-parallel ranks (mesh_place); everything above applies
  // among the data-parallel ranks. sequence_parallel: the norms and the residual stream split
  // among a group's ranks by tokens too. tp_overlap: forward's products split into that many
  // chunks of tokens, each chunk's collective under the next chunk's product (1: not split;
  // TensorParallel::overlap_chunks).
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  int tp_overlap = 1;
  int data_parallel(int world_size) const { return world_size / tensor_parallel; }
};

// Throws UsageError (naming the fields) where `p` cannot run a model of `precision` and
// `memory` on `world_size` ranks: a sharding whose gradients nobody reduces, a bf16 copy that
// is not kept, bf16 on the wire for fp64, several ranks training apart, a tensor-parallel size
// that does not divide the ranks.
void check_parallelism(const Parallelism& p, Precision precision, MemoryPlan memory, int world_size);
// zero1 in shard groups of `group` ranks (fewer than `world_size`; 0: a node's, not yet known)
// averages its parts over the groups with NCCL's kernels, in the gradients' dtype: the copy
// engines and a bf16 wire are refused.
void check_zero1_groups(const Parallelism& p, int group, int world_size);

// Whether a run of `precision` and `memory` with `sharding` keeps a bf16 copy that its
// optimizer's owners can send instead of the masters.
bool can_share_compute_copy(Precision precision, MemoryPlan memory, Sharding sharding);
// Whether such a run sends the bf16 copy under `choice`. Throws UsageError for bf16 where it
// cannot (can_share_compute_copy), saying why.
bool shares_compute_copy(ShareWeights choice, Precision precision, MemoryPlan memory, Sharding sharding);
// What the rank files call the weights the optimizer's owners send (share_weights): "bf16" for
// the bf16 copy (shares_compute_copy) and for zero2/zero3 under bf16, which gather the weights
// as the model reads them; "master" otherwise.
const char* shared_weights_name(bool share_copy, Sharding sharding, Precision precision);

// Why this run's gradients cannot move through the copy engines ("" where they can): they need
// the nccl backend, the ranks of one node and device memory the node's other ranks can map.
std::string copy_engines_unavailable(const Runtime& rt, Allocator& allocator, const std::string& backend);
// `engine` with Auto resolved for a run of `strategy` and `sharding` over `comm`: the copy
// engines where the optimizer is sharded by zero1 and the run can use them, NCCL's kernels
// otherwise. On 2 H200 (xl, contexts 128-1024, fp32 and bf16, global batch 4-16) zero1 on the
// copy engines was within 2.2% of the fastest exact configuration at every point, on NCCL's
// kernels up to 5.8% behind, and unsharded on the copy engines up to 25% behind
// (docs/results/ddp.md, "Defaults").
CollectiveEngine resolve_collective_engine(CollectiveEngine engine, SyncStrategy strategy, Sharding sharding,
                                           const Runtime& rt, Device& dev, const Communicator& comm);

// Throws UsageError where gradients of `precision` cannot travel as bf16 (fp64: the casts
// narrow fp32 only).
void check_grad_reduce(bool in_bf16, Precision precision);
// What the gradients travel as: "bf16", or their own dtype's name (the rank files' grad_reduce_dtype).
std::string grad_reduce_dtype_name(bool in_bf16, DType grads);

// The plan of the parameters a rank holds (`layout`: the model's, or its tensor-parallel part) in `precision` with gradients in `grads` on `ranks`
// (plan_sync over its parameters, buckets of `bucket_mb` of gradient bytes), its shards aligned
// to `alignment` elements (shard_alignment), its fp32 gradients travelling as bf16 where
// `reduce_in_bf16` and the strategy communicates (bf16 gradients travel as they are). Throws
// UsageError as plan_sync, check_grad_reduce and gradient_dtype do.
SyncPlan data_parallel_plan(SyncStrategy strategy, Sharding sharding, const ParameterLayout& layout,
                            Precision precision, GradientDType grads, double bucket_mb, int ranks,
                            int64_t alignment = kShardAlignment, bool reduce_in_bf16 = false);
// Where shards start: a page of the device's master weights when the bf16 copy is shared
// (whole pages of the masters others own can then be given back), else kShardAlignment.
int64_t shard_alignment(Device& dev, Precision precision, bool share_copy);

// The gradient synchronisation of `plan` over the model's buffers; a sharded plan shares the
// model's bf16 copy when `share_copy`, else its master weights. `engine` resolved (not Auto).
std::unique_ptr<GradientSync> make_model_sync(const SyncPlan& plan, Communicator& comm, TransformerLM& model,
                                              bool share_copy, CollectiveEngine engine = CollectiveEngine::Sm,
                                              Communicator* replicas = nullptr);

// The communicator over the ranks of `rt` for the model's buffers (gradients, weights, a
// tensor-parallel group's activations): nccl on the model's GPU, ordered after its compute
// stream; mpi where the model lives in host memory. `copy_engines`: the run asks for them, so
// copy_engines_unavailable is an error. `color` >= 0: over the ranks of that color only
// (Runtime::split). Collective; throws the same UsageError on every rank (wrap it in
// collective_check).
std::unique_ptr<Communicator> make_model_communicator(const Runtime& rt, const std::string& backend, Device& dev,
                                                      bool copy_engines, int color = -1);

// Hybrid sharding's groups: `shard_group` (Parallelism::shard_group) of `sharding` resolved to a
// number of ranks, the same on every rank: 0 takes the ranks of one node, which must then be the
// same number on every node; every rank unsharded. Throws UsageError where the groups would not
// divide the ranks evenly. Collective.
int resolve_shard_group(int shard_group, Sharding sharding, const Runtime& rt);
// Whether this rank's block of `group` consecutive ranks of `rt` (its shard group) holds ranks of
// several nodes: ranks not numbered node by node (mpirun --map-by node). Collective.
bool rank_block_spans_nodes(const Runtime& rt, int group);
// The communicators of data parallelism over the ranks of `rt` in shard groups of `group`
// consecutive ranks (SyncPlan::ranks; resolve_shard_group): `shard` over this rank's group,
// where the gradients are reduced and the shards cut; `replicas` over the ranks holding the
// same part in every group, where the groups' gradients are averaged (null when one group
// holds every rank, the only layout `copy_engines` applies to). Collective.
struct ShardGroups {
  std::unique_ptr<Communicator> shard, replicas;
};
ShardGroups make_shard_groups(const Runtime& rt, const std::string& backend, Device& dev, int group,
                              bool copy_engines = false);

// Writes `path` on rank 0 with the parameters and the whole optimizer state, in the layout of
// an unsharded run: under sharding every rank sends the state it owns (plan.owned) to rank 0,
// which places it. Collective; the file is complete when it returns on any rank.
// Under tensor parallelism `rt` holds the data-parallel ranks of this rank's part and `tp` the
// ranks of its tensor-parallel group: the parts are put together into the whole model's
// tensors, which rank 0 of every rank writes (a file any tp x dp loads). Collective over every rank.
// `options`: OptimizerState::options.
void save_checkpoint_from_ranks(const Runtime& rt, const std::string& path, TransformerLM& model, const AdamW& opt,
                                const SyncPlan& plan, const Runtime* tp = nullptr, const std::string& options = "");

// The same file from a run whose parameters are sharded (zero2, zero3): every rank's parts of the
// parameters, m and v gathered, rank 0 writing. `opt` is the shards' optimizer. Collective.
void save_checkpoint_from_shards(const Runtime& rt, const std::string& path, UnitShards& shards, AdamW& opt,
                                 const Runtime* tp = nullptr, const std::string& options = "");
// A checkpoint (any run's) into sharded parameters: every rank reads the file and takes its
// parts of the parameters and, where the file has them, of m and v and the step. Collective.
void load_checkpoint_into_shards(const std::string& path, UnitShards& shards, AdamW& opt);

// Gradient clipping at `max_norm` for this rank's optimizer: under a sharded optimizer a rank
// holds the averaged gradients of its own ranges only, so the ranks add their sums of squares
// in rank order (Runtime::sum_in_rank_order); unsharded, each rank's sum is the whole.
// Under hybrid sharding `replicas` groups hold the same gradients: the sum over ranks counts each
// once (divided by the groups).
GradClipping gradient_clipping(double max_norm, Sharding sharding, const Runtime& rt, int replicas = 1);
// The same under tensor parallelism, `rt` every rank of the tp x dp layout: the parameters each
// rank holds are its part, so the sums of the whole world are added in rank order; the whole
// parameters (the norm gains, alike on every rank of a group) are counted by each group's rank
// 0 only, and each of the `copies` ranks that hold the same gradients (unsharded data
// parallelism's dp ranks, hybrid sharding's groups) once: each rank's sum divided by its own
// `copies`, which may differ between data-parallel groups (--shard-group node on nodes of uneven
// sizes, with tensor-parallel groups across them). Under zero2 and zero3 the optimizer
// holds `shards`: the whole parameters' gradients are then skipped where they lie in its shard.
GradClipping tensor_parallel_clipping(double max_norm, const Runtime& rt, int copies, const ParameterLayout& layout,
                                      const UnitShards* shards = nullptr);

// This rank's sequences of a global batch: rank r of n takes [r*B/n, (r+1)*B/n). Throws
// UsageError when the batch does not divide by the ranks (the same verdict on every rank).
struct LocalBatch {
  int64_t first = 0, count = 0;
};
LocalBatch local_batch(int64_t global_batch, int rank, int world_size);

}  // namespace llmhpc

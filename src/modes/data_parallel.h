// What the modes that train over ranks (train, ddp) share: the --ddp, --bucket-mb,
// --shard-optimizer and --share-weights options and the plan and sync they make, the communicator that reduces the
// model's gradients, which sequences of a global batch are this rank's (rank r of n
// takes [r*B/n, (r+1)*B/n)), a checkpoint written from a sharded optimizer, and the memory
// attributes at the reference optimizer-sharding study's three points.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "src/dist/grad_sync.h"
#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/modes/mode.h"

namespace llmhpc {

// --ddp, --bucket-mb, --shard-optimizer, --share-weights, --collective-engine and
// --grad-reduce-dtype. A sweep takes
// comma-separated lists, and every strategy by default; training takes one value, bucketed on
// several ranks by default. Both leave the optimizer unsharded and NCCL's kernels moving the
// bytes by default.
void add_data_parallel_options(po::options_description& desc, bool sweep);
// --ddp, with "auto" resolved: bucketed on several ranks or for a sharded optimizer (which
// needs its gradients reduced, even on one rank), none otherwise. Throws UsageError.
std::vector<SyncStrategy> sync_strategies(const po::variables_map& vm, int world_size, bool sharded = false);
// --bucket-mb values (MiB, as PyTorch's bucket_cap_mb), each > 0. Throws UsageError.
std::vector<double> bucket_sizes_mb(const po::variables_map& vm);
// --shard-optimizer values. Throws UsageError.
std::vector<Sharding> shardings(const po::variables_map& vm);
// --share-weights: what a sharded optimizer sends (src/dist/grad_sync.h). Auto is bf16 wherever
// a run keeps a bf16 copy to send, master otherwise.
enum class ShareWeights { Auto, Master, Bf16 };
// --share-weights values. Throws UsageError.
std::vector<ShareWeights> share_weights(const po::variables_map& vm);
// Whether a run of `precision` and `memory` with `sharding` keeps a bf16 copy that its
// optimizer's owners can send instead of the masters.
bool can_share_compute_copy(Precision precision, MemoryPlan memory, Sharding sharding);
// Whether such a run sends the bf16 copy under `choice`. Throws UsageError for bf16 where it
// cannot (can_share_compute_copy), saying why.
bool shares_compute_copy(ShareWeights choice, Precision precision, MemoryPlan memory, Sharding sharding);
// --collective-engine: what moves the gradients' bytes. sm: NCCL's kernels; copy: the GPUs'
// copy engines, the SMs only summing each rank's part (Communicator::use_copy_engines).
enum class CollectiveEngine { Sm, Copy };
const char* collective_engine_name(CollectiveEngine engine);  // "sm", "copy"
// --collective-engine values. Throws UsageError.
std::vector<CollectiveEngine> collective_engines(const po::variables_map& vm);
// --grad-reduce-dtype values: whether the gradients travel as bf16 (SyncPlan::reduce_in_bf16)
// rather than in their own dtype (`same`). Throws UsageError.
std::vector<bool> grad_reduce_in_bf16(const po::variables_map& vm);
// Throws UsageError where gradients of `precision` cannot travel as bf16 (fp64: the casts
// narrow fp32 only).
void check_grad_reduce(bool in_bf16, Precision precision);
// What the gradients travel as: "bf16", or their own dtype's name (the rank files' grad_reduce_dtype).
std::string grad_reduce_dtype_name(bool in_bf16, DType grads);

// The gradient synchronisation of `plan` over the model's buffers; a sharded plan shares the
// model's bf16 copy when `share_copy` (--share-weights bf16), else its master weights.
std::unique_ptr<GradientSync> make_model_sync(const SyncPlan& plan, Communicator& comm, TransformerLM& model,
                                              bool share_copy, CollectiveEngine engine = CollectiveEngine::Sm);

// The plan of a model of `config` in `precision` with gradients in `grads` on `ranks`
// (plan_sync over its parameters, buckets of --bucket-mb of gradient bytes), its shards aligned
// to `alignment` elements (shard_alignment), its fp32 gradients travelling as bf16 where
// `reduce_in_bf16` and the strategy communicates (bf16 gradients travel as they are). Throws
// UsageError as plan_sync (a sharding with --ddp none), check_grad_reduce and gradient_dtype do.
SyncPlan data_parallel_plan(SyncStrategy strategy, Sharding sharding, const ModelConfig& config, Precision precision,
                            GradientDType grads, double bucket_mb, int ranks, int64_t alignment = kShardAlignment,
                            bool reduce_in_bf16 = false);
// Where shards start: a page of the device's master weights when the bf16 copy is shared
// (whole pages of the masters others own can then be given back), else kShardAlignment.
int64_t shard_alignment(Device& dev, Precision precision, bool share_copy);

// Writes `path` on rank 0 with the parameters and the whole optimizer state, in the layout of
// an unsharded run: under sharding every rank sends the state it owns (plan.owned) to rank 0,
// which places it. Collective; the file is complete when it returns on any rank.
void save_checkpoint_from_ranks(const Runtime& rt, const std::string& path, TransformerLM& model, const AdamW& opt,
                                const SyncPlan& plan);

// The memory at one of the reference optimizer-sharding study's three points ("after_init",
// "before_optimizer", "after_optimizer") as attributes: memory_<point>_bytes, and memory_<point>_<category>_bytes
// for each category of model_memory_categories() and "other".
void record_memory(Record& rec, const std::string& point, const MemoryBreakdown& memory);

// --clip-grad-norm `max_norm` for this rank's optimizer: under a sharded optimizer a rank holds
// the averaged gradients of its own ranges only, so the ranks add their sums of squares in
// rank order (Runtime::sum_in_rank_order); unsharded, each rank's sum is the whole.
GradClipping gradient_clipping(double max_norm, Sharding sharding, const Runtime& rt);

// The communicator the gradients are reduced over: nccl on the model's GPU, ordered after its
// compute stream; mpi where the model lives in host memory. Collective; a UsageError (the mpi
// backend with a GPU model, --collective-engine copy without nccl) on every rank alike.
std::unique_ptr<Communicator> make_gradient_communicator(const Runtime& rt, const po::variables_map& vm, Device& dev);

// This rank's sequences of a global batch. Throws UsageError when the batch does not divide
// by the ranks (the same verdict on every rank).
struct LocalBatch {
  int64_t first = 0, count = 0;
};
LocalBatch local_batch(int64_t global_batch, int rank, int world_size);

}  // namespace llmhpc

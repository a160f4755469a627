// Data parallelism applied to a model, apart from the model (as torchtitan's parallelize step):
// the one way mode train, mode ddp and the tests make a rank's optimizer and gradient
// synchronisation from a SyncPlan.
//
//   ShardGroups comms = make_shard_groups(dp_ranks, backend, dev, plan.ranks);  // or borrowed
//   TransformerLM model({..., model_storage(plan) ...}, dev, ops);
//   DataParallelTraining run(plan, comms.shard.get(), comms.replicas.get(), model, ops, hyper);
//   run.initialize(seed);              // or run.load(checkpoint)
//   run.start(share_copy, engine);     // every rank from rank 0's weights, then the sync
//   run_step(model, &run.optimizer(), Phase::TrainStep, timer, run.sync());
//
// zero2 and zero3 (shards_parameters) hand the parameters to UnitShards, which is then the sync;
// the other stages keep them in the model's flat buffers, averaged by make_model_sync's sync.
#pragma once
#include <memory>
#include <string>

#include "src/dist/parallelism.h"

namespace llmhpc {

// What the model keeps under `plan`: flat buffers of `flat_elements` for its parameters and
// gradients (none under zero2 and zero3, whose shards hold them) and where its parameters live.
struct ModelStorage {
  int64_t flat_elements = 0;
  ParameterStorage parameters = ParameterStorage::Local;
};
ModelStorage model_storage(const SyncPlan& plan);

class DataParallelTraining {
 public:
  // `model` built with model_storage(plan). `comm`: the ranks `plan` was made for (plan.ranks:
  // the shard group), null where this rank trains alone; `replicas`: hybrid sharding's groups
  // (make_shard_groups), else null. The communicators outlive this. `accumulate`: each step's
  // gradients come in several micro-batches (--grad-accum). The optimizer updates this rank's
  // ranges (plan.owned) or shard; its state appears with the first step or a checkpoint's.
  DataParallelTraining(const SyncPlan& plan, Communicator* comm, Communicator* replicas, TransformerLM& model, Ops& ops,
                       const AdamWHyper& hyper, bool accumulate = false);
  ~DataParallelTraining();
  DataParallelTraining(const DataParallelTraining&) = delete;
  DataParallelTraining& operator=(const DataParallelTraining&) = delete;

  // The weights, before start(). Unsharded, each rank draws its own from `seed` (start() then gives
  // every rank rank 0's); sharded, every rank keeps its parts of the weights drawn from `seed`,
  // which must be the same on every rank. Collective under zero2 and zero3.
  void initialize(uint64_t seed);
  // The weights and the optimizer state of a checkpoint (any run's, of the same model), before
  // start(). Throws UsageError as load_checkpoint. Collective under zero2 and zero3.
  void load(const std::string& checkpoint);
  // Every rank from rank 0's weights (unsharded: broadcast over the ranks, and the groups under
  // hybrid sharding; sharded: they already are), then the synchronisation of the gradients under
  // `plan`, sending the model's bf16 copy where `share_copy` (shares_compute_copy) with `engine`
  // (resolve_collective_engine). Nothing where this rank trains alone. Collective.
  void start(bool share_copy, CollectiveEngine engine);

  // Gradient clipping at `max_norm` for this optimizer, over every rank of `world` (tp x the
  // data-parallel ranks): gradient_clipping, or tensor_parallel_clipping where `tp` > 1.
  void clip_gradients(double max_norm, const Runtime& world, int tp);
  // Writes the whole model and optimizer state to `path` (rank 0 of `dp` writes): the data-parallel
  // ranks `dp` and the tensor-parallel group `tp` (null: none) put it together.
  // `options`: OptimizerState::options. Collective.
  void save(const Runtime& dp, const std::string& path, const Runtime* tp, const std::string& options);

  AdamW& optimizer() { return *opt_; }
  const AdamW& optimizer() const { return *opt_; }
  // What backward and the optimizer drive: null where this rank trains alone, and unsharded
  // until start().
  GradientSync* sync() { return sync_.get(); }
  // zero2, zero3: what holds the parameters (null otherwise).
  UnitShards* shards() { return shards_; }
  const SyncPlan& plan() const { return plan_; }

 private:
  SyncPlan plan_;
  Communicator* comm_;
  Communicator* replicas_;
  TransformerLM& model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<GradientSync> sync_;  // after the optimizer: gone before the shards' optimizer
  UnitShards* shards_ = nullptr;        // sync_, under zero2 and zero3
};

}  // namespace llmhpc

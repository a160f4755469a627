#include "src/dist/data_parallel_training.h"

#include "src/core/check.h"
#include "src/dist/tensor_parallel.h"
#include "src/model/checkpoint.h"

namespace llmhpc {

ModelStorage model_storage(const SyncPlan& plan) {
  if (shards_parameters(plan.sharding)) return {0, ParameterStorage::Sharded};
  return {plan.flat_elements, ParameterStorage::Local};
}

DataParallelTraining::DataParallelTraining(const SyncPlan& plan, Communicator* comm, Communicator* replicas,
                                           TransformerLM& model, Ops& ops, const AdamWHyper& hyper, bool accumulate)
    : plan_(plan), comm_(comm), replicas_(replicas), model_(model) {
  LLMHPC_CHECK(!comm || comm->size() == plan.ranks, "the plan's ranks are the communicator's");
  if (shards_parameters(plan.sharding)) {
    LLMHPC_CHECK(comm, "zero2 and zero3 shard over a communicator");
    auto shards = std::make_unique<UnitShards>(plan, *comm, model, ops, replicas);
    shards->accumulate_micro_batches(accumulate);
    shards_ = shards.get();
    opt_ = std::make_unique<AdamW>(model, ops, hyper, shards->optimizer_shard());
    sync_ = std::move(shards);
  } else {
    opt_ = std::make_unique<AdamW>(model, ops, hyper, plan.owned(comm ? comm->rank() : 0));
  }
}

DataParallelTraining::~DataParallelTraining() = default;

void DataParallelTraining::initialize(uint64_t seed) {
  if (shards_) shards_->initialize(seed);
  else model_.init_parameters(seed);
}

void DataParallelTraining::load(const std::string& checkpoint) {
  if (shards_) load_checkpoint_into_shards(checkpoint, *shards_, *opt_);
  else load_checkpoint(checkpoint, model_, opt_.get());
}

void DataParallelTraining::start(bool share_copy, CollectiveEngine engine) {
  if (!comm_ || shards_) return;
  broadcast_parameters(*comm_, model_.params(), replicas_);
  model_.parameters_changed();
  if (plan_.strategy != SyncStrategy::None)
    sync_ = make_model_sync(plan_, *comm_, model_, share_copy, engine, replicas_);
}

void DataParallelTraining::clip_gradients(double max_norm, const Runtime& world, int tp) {
  const int dp = world.world_size / tp;
  // The ranks that hold the same gradients: unsharded data parallelism's, hybrid sharding's groups.
  const int copies = plan_.sharding == Sharding::None ? dp : dp / plan_.ranks;
  if (tp > 1) opt_->set_clipping(tensor_parallel_clipping(max_norm, world, copies, model_.layout(), shards_));
  else opt_->set_clipping(gradient_clipping(max_norm, plan_.sharding, world, copies));
}

void DataParallelTraining::save(const Runtime& dp, const std::string& path, const Runtime* tp,
                                const std::string& options) {
  if (shards_) save_checkpoint_from_shards(dp, path, *shards_, *opt_, tp, options);
  else save_checkpoint_from_ranks(dp, path, model_, *opt_, plan_, tp, options);
}

}  // namespace llmhpc

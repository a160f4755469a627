#include "src/dist/shard_sync.h"

#include <algorithm>

#include "comm/collectives.h"
#include "src/core/check.h"
#include "src/core/nvtx.h"

namespace llmhpc {
namespace {

// A shard group is shared as soon as this rank's part of it is updated: a broadcast or
// all-gather reads on each rank that rank's own part only, and writes only the parts this
// rank does not update. Groups are shared strictly in the plan's order, the same on every
// rank: an update reported for group g first shares every earlier group not shared yet (a
// rank whose part of it is empty reports nothing for it), and finish_parameters() shares
// the rest. So the collectives match across ranks whatever each rank owns.
//
// Stream safety (nccl) is the reducer's: each collective is ordered after the optimizer's
// work enqueued before it, touches the persistent parameters only, and finish_parameters()
// makes the compute stream wait for all of them before the next forward reads them.
class ParameterSharing final : public GradientSync {
 public:
  ParameterSharing(std::unique_ptr<GradientSync> gradients, Communicator& comm, Tensor flat_params)
      : gradients_(std::move(gradients)), comm_(comm), params_(flat_params) {
    const SyncPlan& plan = gradients_->plan();
    LLMHPC_CHECK(plan.sharding != Sharding::None, "parameter sharing without a sharded plan");
    for (size_t g = 0; g < plan.shard_groups.size(); ++g) {
      LLMHPC_CHECK(plan.shard_groups[g].end <= params_.numel(), "a shard group lies beyond the parameters");
      LLMHPC_CHECK(g == 0 || plan.shard_groups[g].end <= plan.shard_groups[g - 1].begin,
                   "shard groups must be in reverse parameter order, without overlap");
    }
    begin_step();
  }

  const SyncPlan& plan() const override { return gradients_->plan(); }
  const SyncStats& stats() const override {
    merged_ = gradients_->stats();
    merged_.param_collectives = param_stats_.param_collectives;
    merged_.param_bytes = param_stats_.param_bytes;
    merged_.bus_bytes += param_stats_.bus_bytes;
    return merged_;
  }

  void begin_step() override {
    LLMHPC_CHECK(in_flight_.empty(), "begin_step() before the last step's finish_parameters()");
    gradients_->begin_step();
    next_group_ = 0;
    param_stats_ = SyncStats{};
  }
  void on_gradients_ready(int64_t begin, int64_t end) override { gradients_->on_gradients_ready(begin, end); }
  void finish() override { gradients_->finish(); }

  void on_parameters_updated(int64_t begin, int64_t end) override {
    if (begin == end) return;
    const SyncPlan& plan = gradients_->plan();
    const std::vector<FlatRange>& groups = plan.shard_groups;
    // Groups are in descending order: the first one that starts at or below `begin`.
    const size_t g =
        size_t(std::partition_point(groups.begin(), groups.end(), [&](const FlatRange& r) { return r.begin > begin; }) -
               groups.begin());
    const FlatRange mine = g < groups.size() ? plan.shard(g, comm_.rank()) : FlatRange{};
    LLMHPC_CHECK(mine.begin <= begin && end <= mine.end && begin < mine.end,
                 "the optimizer reported parameters this rank does not own");
    LLMHPC_CHECK(g >= next_group_, "the optimizer reported its ranges out of the plan's order");
    while (next_group_ <= g) share(next_group_++);
  }

  bool finish_parameters() override {
    NvtxRange range("parameter sharing");
    while (next_group_ < gradients_->plan().shard_groups.size()) share(next_group_++);
    for (CommHandle& h : in_flight_) h.wait();
    in_flight_.clear();
    return true;
  }

 private:
  void* at(FlatRange r) const { return params_.slice(r.begin, {r.size()}).data; }

  // zero1: one in-place all-gather of the group (rank r's part lands at part r). broadcast:
  // each owner's part from its owner, fused into one launch where the backend can.
  void share(size_t g) {
    const SyncPlan& plan = gradients_->plan();
    const FlatRange group = plan.shard_groups[g];
    const int64_t es = int64_t(dtype_size(params_.dtype)), bytes = group.size() * es;
    if (plan.sharding == Sharding::Zero1) {
      const FlatRange mine = plan.shard(g, comm_.rank());
      in_flight_.push_back(comm_.all_gather_async(at(mine), at(group), size_t(mine.size()), params_.dtype));
      ++param_stats_.param_collectives;
      param_stats_.bus_bytes += int64_t(double(bytes) * bus_factor(Collective::AllGather, plan.ranks));
    } else {
      comm_.group_start();
      for (int owner = 0; owner < plan.ranks; ++owner) {
        const FlatRange part = plan.shard(g, owner);
        if (part.size() == 0) continue;
        in_flight_.push_back(comm_.broadcast_async(at(part), at(part), size_t(part.size()), params_.dtype, owner));
        ++param_stats_.param_collectives;
        param_stats_.bus_bytes += int64_t(double(part.size() * es) * bus_factor(Collective::Broadcast, plan.ranks));
      }
      comm_.group_end();
    }
    param_stats_.param_bytes += bytes;
  }

  std::unique_ptr<GradientSync> gradients_;
  Communicator& comm_;
  Tensor params_;
  size_t next_group_ = 0;  // groups before it are shared this step
  std::vector<CommHandle> in_flight_;
  SyncStats param_stats_;     // the parameter fields only
  mutable SyncStats merged_;  // what stats() returns: the gradients' and the parameters'
};

}  // namespace

std::unique_ptr<GradientSync> make_parameter_sharing(std::unique_ptr<GradientSync> gradients, Communicator& comm,
                                                     Tensor flat_params) {
  return std::make_unique<ParameterSharing>(std::move(gradients), comm, flat_params);
}

}  // namespace llmhpc

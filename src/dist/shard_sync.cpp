#include "src/dist/shard_sync.h"

#include <algorithm>

#include "comm/collectives.h"
#include "src/core/check.h"
#include "src/core/nvtx.h"

namespace llmhpc {
namespace {

// A shard group is shared as soon as this rank's part of it is updated: a broadcast or
// all-gather reads on each rank that rank's own part only, and writes only the parts this
// rank does not update. Groups are shared strictly in forward order (ascending offsets: the
// plan's groups from the last to the first), the same on every rank: an update reported for
// group g first shares every group before it in that order not shared yet (a rank whose part
// of it is empty reports nothing for it), and finish_parameters() shares the rest.
// So the collectives match across ranks whatever each rank owns.
//
// Why forward order: finish_parameters() does not wait. The next forward asks for each range
// before it reads it (on_parameters_needed), and only the groups that range overlaps are
// waited for, so the rest keep arriving while forward computes (ZeRO's and FSDP's prefetch).
// The optimizer updates its ranges in that order too (SyncPlan::owned), so the embedding's
// and the first layers' all-gathers, which forward needs first, are issued first and overlap
// the rest of the optimizer; in the gradients' (reverse) order forward would wait for the
// last-issued one before its first layer, i.e. for all of them. Broadcast has one group, the
// whole model: the first range forward asks for waits for all of it (nothing to overlap, as
// before), by the same code.
//
// Stream safety (nccl) is the reducer's: each collective is ordered after the optimizer's
// work enqueued before it and touches the persistent parameters only; a wait is the compute
// stream's (cudaStreamWaitEvent), never the host's. Nothing may read a group in flight, and
// the device allocator does not know streams, so a group still in flight is waited for by
// on_parameters_needed, by the next begin_step() (before the optimizer can write it again:
// the padding, which forward never asks for) and by the destructor (before the parameters
// may be freed). mpi: a wait completes that group's requests on the host.
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
    arriving_.resize(plan.shard_groups.size());
    begin_step();
  }
  ~ParameterSharing() override { on_parameters_needed(0, params_.numel()); }

  const SyncPlan& plan() const override { return gradients_->plan(); }
  const SyncStats& stats() const override {
    merged_ = gradients_->stats();
    merged_.param_collectives = param_stats_.param_collectives;
    merged_.param_bytes = param_stats_.param_bytes;
    merged_.bus_bytes += param_stats_.bus_bytes;
    return merged_;
  }

  void begin_step() override {
    LLMHPC_CHECK(shared_ == 0 || shared_ == arriving_.size(),
                 "begin_step() before the last step's finish_parameters()");
    on_parameters_needed(0, params_.numel());  // what forward did not ask for
    gradients_->begin_step();
    shared_ = 0;
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
    const size_t position = groups.size() - 1 - g;  // in forward order
    LLMHPC_CHECK(position >= shared_, "the optimizer reported its ranges out of the plan's order");
    while (shared_ <= position) share_next();
  }

  bool finish_parameters() override {
    NvtxRange range("parameter sharing");
    while (shared_ < arriving_.size()) share_next();
    return true;
  }

  void on_parameters_needed(int64_t begin, int64_t end) override {
    const std::vector<FlatRange>& groups = gradients_->plan().shard_groups;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (arriving_[g].empty() || groups[g].end <= begin || end <= groups[g].begin) continue;
      for (CommHandle& h : arriving_[g]) h.wait();
      arriving_[g].clear();
    }
  }

 private:
  void* at(FlatRange r) const { return params_.slice(r.begin, {r.size()}).data; }

  // The next group in forward order. zero1: one in-place all-gather of the group (rank r's
  // part lands at part r). broadcast: each owner's part from its owner, fused into one launch
  // where the backend can.
  void share_next() {
    const SyncPlan& plan = gradients_->plan();
    const size_t g = plan.shard_groups.size() - 1 - shared_++;
    const FlatRange group = plan.shard_groups[g];
    const int64_t es = int64_t(dtype_size(params_.dtype)), bytes = group.size() * es;
    if (plan.sharding == Sharding::Zero1) {
      const FlatRange mine = plan.shard(g, comm_.rank());
      arriving_[g].push_back(comm_.all_gather_async(at(mine), at(group), size_t(mine.size()), params_.dtype));
      ++param_stats_.param_collectives;
      param_stats_.bus_bytes += int64_t(double(bytes) * bus_factor(Collective::AllGather, plan.ranks));
    } else {
      comm_.group_start();
      for (int owner = 0; owner < plan.ranks; ++owner) {
        const FlatRange part = plan.shard(g, owner);
        if (part.size() == 0) continue;
        arriving_[g].push_back(comm_.broadcast_async(at(part), at(part), size_t(part.size()), params_.dtype, owner));
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
  size_t shared_ = 0;                              // groups shared this step, in forward order
  std::vector<std::vector<CommHandle>> arriving_;  // per group: the collectives still bringing it
  SyncStats param_stats_;                          // the parameter fields only
  mutable SyncStats merged_;                       // what stats() returns: the gradients' and the parameters'
};

}  // namespace

std::unique_ptr<GradientSync> make_parameter_sharing(std::unique_ptr<GradientSync> gradients, Communicator& comm,
                                                     Tensor flat_params) {
  return std::make_unique<ParameterSharing>(std::move(gradients), comm, flat_params);
}

}  // namespace llmhpc

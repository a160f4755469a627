#include "src/dist/replica_average.h"

#include "comm/collectives.h"
#include "src/core/nvtx.h"

namespace llmhpc {

ReplicaAverage::ReplicaAverage(Communicator* replicas, DType dtype)
    : replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), dtype_(dtype) {}

void ReplicaAverage::next(std::vector<Part> parts, std::function<void()> ready, SyncStats& stats) {
  if (!active()) return;
  average_held(stats);
  held_ = std::move(parts);
  ready_ = std::move(ready);
}

void ReplicaAverage::finish(SyncStats& stats) {
  if (!active()) return;
  average_held(stats);
  for (CommHandle& h : averages_) h.wait();
  averages_.clear();
}

void ReplicaAverage::release() {
  if (!active()) return;
  held_.clear();
  ready_ = nullptr;
  averages_.clear();
  replicas_->synchronize();
}

void ReplicaAverage::average_held(SyncStats& stats) {
  if (ready_) ready_();
  ready_ = nullptr;
  if (held_.empty()) return;
  NvtxRange range("average over groups");
  const int64_t es = int64_t(dtype_size(dtype_));
  const double bus = bus_factor(Collective::AllReduce, replicas_->size());
  for (const Part& p : held_) {
    if (p.count == 0) continue;
    averages_.push_back(replicas_->all_reduce_async(p.data, p.data, size_t(p.count), dtype_, ReduceOp::Average));
    ++stats.collectives;
    stats.bytes += p.count * es;
    stats.bus_bytes += int64_t(double(p.count * es) * bus);
  }
  held_.clear();
}

}  // namespace llmhpc

// Hybrid sharding's second reduction (zero1, zero2, zero3 under --shard-group): each group has
// reduce-scattered (averaged) its own ranks' gradients into the parts each rank holds; those
// parts are then averaged over `replicas`, the ranks holding the same parts in the other groups.
//
// One batch behind (a batch: the buckets that became final together, or one unit of the model):
// a batch's average goes out when the next batch has been issued, once the compute stream waits
// for the batch's own reduce-scatters (issued a batch ago, so done or nearly). Waiting for the
// ones just issued would hold backward until each is reduced; one all-reduce of the shards after
// backward instead left 13.1 ms of exposed communication a step for xl bf16 on 4 H200 in 2
// groups of 2 (docs/results/zero.md). Used by the Reducer (hybrid zero1) and UnitShards (hybrid
// zero2 and zero3).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "src/dist/grad_sync.h"

namespace llmhpc {

class ReplicaAverage {
 public:
  struct Part {
    void* data;
    int64_t count;  // elements of the gradients' dtype
  };
  // Null or one rank: nothing to average (active() false, every call a no-op).
  ReplicaAverage(Communicator* replicas, DType dtype);
  bool active() const { return replicas_ != nullptr; }
  // A batch was issued: `parts` hold this rank's final gradients once `ready` returns (it makes
  // the compute stream wait for the batch's reduce-scatters). Averages the batch before it,
  // counting its all-reduces into `stats`.
  void next(std::vector<Part> parts, std::function<void()> ready, SyncStats& stats);
  // Averages the last batch and waits for every average (the compute stream, on NCCL).
  void finish(SyncStats& stats);
  // Drops what is held and in flight (completed under mpi, released under nccl) and waits for
  // the replicas' stream: for an owner going away without finish() (an exception mid-step).
  void release();

 private:
  void average_held(SyncStats& stats);
  Communicator* replicas_;
  DType dtype_;
  std::vector<Part> held_;       // the batch issued last, not yet averaged
  std::function<void()> ready_;  // its reduce-scatters, waited for
  std::vector<CommHandle> averages_;
};

}  // namespace llmhpc

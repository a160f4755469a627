#include "src/dist/reducer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "comm/collectives.h"
#include "src/core/allocator.h"
#include "src/core/check.h"
#include "src/core/nvtx.h"
#include "src/dist/bf16_wire.h"
#include "src/dist/copy_engine_reduction.h"
#include "src/dist/replica_average.h"

namespace llmhpc {
namespace {

// Averages, not sums: the loss is a mean over the local batch, and with equal local batches
// the mean over the global batch is the average of the local means, so its gradient is the
// average of the local gradients. ReduceOp::Average does that in the collective's one pass
// (ncclAvg; the mpi backend's sum and one division), with no scaling kernel after it; for a
// power-of-two rank count in fp32 the division is exact, so the result is the rounded sum
// scaled exactly.
//
// Under zero1 a bucket is reduce-scattered instead: the same average, and each rank gets the
// part it owns (in place: rank r's part of bucket [b, e) is [b + r*s, b + (r+1)*s), s = (e-b)/n,
// which is where reduce_scatter's in-place result lands). The rest of the bucket is left
// undefined (the mpi backend computes in its first chunk), and nothing reads it: the
// optimizer reads the gradients it owns only.
//
// Stream safety (nccl): the collectives run on the communicator's stream, ordered after the
// compute work enqueued before them, and read and write the gradients in place. The caching
// device allocator does not know streams, so nothing they touch may be freed or reused while
// they run: the gradients are the model's persistent buffer, never freed during training,
// and finish() makes the compute stream wait for every collective before anything after it
// (the optimizer, the next backward) touches them.
//
// Through the copy engines (ReduceScratch::copy_engines, where the communicator has them): the
// buckets move with the copy engines and each rank's part is summed on the SMs
// (src/dist/copy_engine_reduction.h), through a scratch of the largest bucket; the result is
// the same average.
//
// In bf16 (SyncPlan::reduce_in_bf16): each bucket is rounded into a wire as long as the largest
// bucket, reduced there and widened back (src/dist/bf16_wire.h). One wire serves every bucket:
// such operations run one after another on the communicator's stream, which is also what
// reuses the wire; the copy engines then work in the wire.
//
// Either is several steps on the communicator's stream, which a group would reorder (it
// launches its collectives at group_end(), after the steps issued behind them): their buckets
// are issued one after another, never grouped.
//
// Hybrid zero1 (`replicas`: the ranks holding the same parts in the other groups of `comm`):
// each bucket's part, reduce-scattered within the group, is then averaged over the groups, the
// buckets that became final together as one batch of src/dist/replica_average.h.
class Reducer final : public GradientSync {
 public:
  Reducer(const SyncPlan& plan, Communicator& comm, Tensor flat_grads, ReduceScratch memory, Communicator* replicas)
      : plan_(plan), comm_(comm), average_(replicas, flat_grads.dtype), grads_(flat_grads), buckets_(plan_.buckets),
        collective_(plan.sharding == Sharding::Zero1 ? Collective::ReduceScatter : Collective::AllReduce),
        by_begin_(buckets_.size()), ready_(buckets_.size()), expected_(buckets_.size()), issued_(buckets_.size()) {
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const FlatRange& b = buckets_[k];
      LLMHPC_CHECK(0 <= b.begin && b.begin < b.end && b.end <= grads_.numel(), "bucket outside the gradient buffer");
      LLMHPC_CHECK(collective_ != Collective::ReduceScatter || b.size() % plan_.ranks == 0,
                   "a reduce-scattered bucket must divide among the ranks");
      // Backward reports [0, parameters) only: zero1's padding is final from the start.
      expected_[k] = std::max<int64_t>(0, std::min(b.end, plan_.parameters) - b.begin);
    }
    std::iota(by_begin_.begin(), by_begin_.end(), size_t(0));
    std::sort(by_begin_.begin(), by_begin_.end(),
              [&](size_t a, size_t b) { return buckets_[a].begin < buckets_[b].begin; });
    for (size_t i = 1; i < by_begin_.size(); ++i)
      LLMHPC_CHECK(buckets_[by_begin_[i - 1]].end <= buckets_[by_begin_[i]].begin, "buckets overlap");
    LLMHPC_CHECK(
        !average_.active() || (plan_.sharding == Sharding::Zero1 && !plan_.reduce_in_bf16 && !memory.copy_engines),
        "hybrid sharding averages zero1's parts over the groups in the gradients' dtype, with NCCL's kernels");
    int64_t largest = 0;
    for (const FlatRange& b : buckets_) largest = std::max(largest, b.size());
    const bool needs_memory = largest > 0 && (plan_.reduce_in_bf16 || memory.copy_engines);
    LLMHPC_CHECK(!needs_memory || memory.allocator, "the reducer's wire or scratch needs an allocator");
    if (plan_.reduce_in_bf16 && largest > 0) {
      LLMHPC_CHECK(grads_.dtype == DType::F32, "gradients travel as bf16 from fp32 only");
      wire_ = Buffer(*memory.allocator, DType::BF16, {largest}, "comm.wire",
                     memory.copy_engines ? MemoryKind::Shareable : MemoryKind::Plain);
    }
    // None where nothing moves them (mpi, one rank).
    CopyEngines* copy_engines = memory.copy_engines && largest > 0 ? comm_.copy_engines() : nullptr;
    if (copy_engines) {
      Buffer scratch(*memory.allocator, moved().dtype, {largest}, "comm.scratch", MemoryKind::Shareable);
      engines_ = std::make_unique<CopyEngineReduction>(comm_, *copy_engines, moved(), std::move(scratch));
    }
    if (!wire_.empty()) bf16_ = std::make_unique<Bf16Wire>(comm_, wire_.tensor(), engines_.get());
    begin_step();
  }

  // finish() leaves nothing in flight; an exception between begin_step() and finish() may, and
  // the wire and the scratch go with this object.
  ~Reducer() override {
    in_flight_.clear();  // completes (mpi) or releases (nccl) what is in flight
    batch_.clear();
    average_.release();
    comm_.synchronize();
  }

  const SyncPlan& plan() const override { return plan_; }
  const SyncStats& stats() const override { return stats_; }

  void begin_step() override {
    LLMHPC_CHECK(in_flight_.empty() && batch_.empty(), "begin_step() before the last step's finish()");
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(issued_.begin(), issued_.end(), false);
    stats_ = SyncStats{};
    stats_.buckets = int64_t(buckets_.size());
  }

  // Counts the reported elements of every bucket the range touches, so ranges may come in
  // any order, in pieces, and straddle buckets; a bucket whose count reaches its size is final.
  void gradients_final(int64_t begin, int64_t end) override {
    LLMHPC_CHECK(0 <= begin && begin <= end && end <= grads_.numel(), "reported gradients outside the buffer");
    if (!plan_.when_ready) return;
    // The first bucket (by offset) that ends after `begin`, then on while buckets start before `end`.
    auto it =
        std::partition_point(by_begin_.begin(), by_begin_.end(), [&](size_t k) { return buckets_[k].end <= begin; });
    std::vector<size_t> complete;
    for (; it != by_begin_.end() && buckets_[*it].begin < end; ++it) {
      const size_t k = *it;
      const FlatRange& b = buckets_[k];
      ready_[k] += std::min(end, b.end) - std::max(begin, b.begin);
      LLMHPC_CHECK(ready_[k] <= expected_[k], "gradients reported final twice in one step (begin_step() not called?)");
      if (ready_[k] == expected_[k]) complete.push_back(k);
    }
    issue_together(complete, /*in_finish=*/false);
  }

  void finish() override {
    NvtxRange range("gradient sync");
    std::vector<size_t> left;
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (!issued_[k]) left.push_back(k);
    if (!plan_.when_ready)
      for (size_t k : left) issue_together({k}, /*in_finish=*/true);  // one after another, as the reference naive DDP
    else issue_together(left, /*in_finish=*/true);
    for (CommHandle& h : in_flight_) h.wait();
    in_flight_.clear();
    average_.finish(stats_);  // the last buckets'
  }

 private:
  // The collectives of ranges that became final at the same moment (the tensors of one layer,
  // which backward reports at once) go out as one group: each is still its own collective, but
  // NCCL launches them together, so a layer's nine tensors pay one launch and one
  // synchronisation instead of nine (per-collective latency dominates small tensors).
  void issue_together(const std::vector<size_t>& ks, bool in_finish) {
    if (ks.empty()) return;
    const bool group = ks.size() > 1 && !bf16_ && !engines_;
    if (group) comm_.group_start();
    for (size_t k : ks) issue(k, in_finish);
    if (group) comm_.group_end();
    if (!average_.active()) return;
    // Hybrid: this batch's parts, averaged over the groups once the next batch is issued.
    std::vector<ReplicaAverage::Part> parts;
    for (size_t k : ks) {
      const FlatRange mine = plan_.shard(k, comm_.rank());
      parts.push_back({grads_.slice(mine.begin, {mine.size()}).data, mine.size()});
    }
    auto reduce_scatters = std::make_shared<std::vector<CommHandle>>(std::exchange(batch_, {}));
    average_.next(
        std::move(parts),
        [reduce_scatters] {
          for (CommHandle& h : *reduce_scatters) h.wait();
        },
        stats_);
  }

  // Where the collectives work: the gradients, or the bf16 wire they travel in.
  const Tensor& moved() const { return wire_.empty() ? grads_ : wire_.tensor(); }

  void issue(size_t k, bool in_finish) {
    const FlatRange& b = buckets_[k];
    void* data = grads_.slice(b.begin, {b.size()}).data;
    const bool blocking = !plan_.when_ready;
    const bool all = collective_ == Collective::AllReduce;
    const size_t count = size_t(all ? b.size() : b.size() / plan_.ranks);  // per rank for a reduce-scatter
    CommHandle h;
    if (bf16_) {
      float* values = static_cast<float*>(data);
      h = all ? bf16_->all_reduce_async(values, count, ReduceOp::Average)
              : bf16_->reduce_scatter_async(values, count, ReduceOp::Average);
    } else if (engines_) {
      h = all ? engines_->all_reduce_async(data, count, ReduceOp::Average)
              : engines_->reduce_scatter_async(data, count, ReduceOp::Average);
    } else if (all) {
      if (blocking) comm_.all_reduce(data, data, count, grads_.dtype, ReduceOp::Average);
      else h = comm_.all_reduce_async(data, data, count, grads_.dtype, ReduceOp::Average);
    } else {
      const FlatRange mine = plan_.shard(k, comm_.rank());  // the bucket is its own shard group
      void* part = grads_.slice(mine.begin, {mine.size()}).data;
      if (blocking) comm_.reduce_scatter(data, part, count, grads_.dtype, ReduceOp::Average);
      else h = comm_.reduce_scatter_async(data, part, count, grads_.dtype, ReduceOp::Average);
    }
    if (blocking) h.wait();
    else (average_.active() ? batch_ : in_flight_).push_back(std::move(h));
    issued_[k] = true;
    const int64_t bytes = b.size() * int64_t(dtype_size(bf16_ ? DType::BF16 : grads_.dtype));
    ++stats_.collectives;
    stats_.bytes += bytes;
    stats_.bus_bytes += int64_t(double(bytes) * bus_factor(collective_, plan_.ranks));
    if (in_finish) ++stats_.issued_in_finish;
  }

  SyncPlan plan_;
  Communicator& comm_;
  ReplicaAverage average_;  // hybrid zero1: over the ranks holding this rank's parts in the other groups
  Tensor grads_;
  const std::vector<FlatRange>& buckets_;  // plan_'s, in issue order: reverse parameter order
  Collective collective_;
  std::vector<size_t> by_begin_;   // bucket indices by ascending offset, to find those a range touches
  std::vector<int64_t> ready_;     // elements reported final this step, per bucket
  std::vector<int64_t> expected_;  // elements backward reports, per bucket
  std::vector<bool> issued_;
  std::vector<CommHandle> in_flight_;
  std::vector<CommHandle> batch_;  // hybrid: the reduce-scatters of the batch being issued
  SyncStats stats_;
  // Declared in the order they are made: each goes before what it uses.
  Buffer wire_;                                   // in bf16: what every bucket travels in
  std::unique_ptr<CopyEngineReduction> engines_;  // through the copy engines, in the wire or the gradients
  std::unique_ptr<Bf16Wire> bf16_;                // in bf16: the casts around the collective
};

}  // namespace

std::unique_ptr<GradientSync> make_reducer(const SyncPlan& plan, Communicator& comm, Tensor flat_grads,
                                           ReduceScratch scratch, Communicator* replicas) {
  return std::make_unique<Reducer>(plan, comm, flat_grads, scratch, replicas);
}

}  // namespace llmhpc

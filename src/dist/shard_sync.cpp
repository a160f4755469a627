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
// before it reads it (parameters_needed), and only the groups that range overlaps are
// waited for, so the rest keep arriving while forward computes (ZeRO's and FSDP's prefetch).
// The optimizer updates its ranges in that order too (SyncPlan::owned), so the embedding's
// and the first layers' all-gathers, which forward needs first, are issued first and overlap
// the rest of the optimizer; in the gradients' (reverse) order forward would wait for the
// last-issued one before its first layer, i.e. for all of them. Broadcast has one group, the
// whole model: the first range forward asks for waits for all of it (nothing to overlap), by
// the same code.
//
// Stream safety (nccl) is the reducer's: each collective is ordered after the optimizer's
// work enqueued before it and touches the persistent parameters only; a wait is the compute
// stream's (cudaStreamWaitEvent), never the host's. Nothing may read a group in flight, and
// the device allocator does not know streams, so a group still in flight is waited for by
// parameters_needed, by the next begin_step() (before the optimizer can write it again:
// the padding, which forward never asks for) and by the destructor (before the parameters
// may be freed). mpi: a wait completes that group's requests on the host.
//
// What travels: the master weights, or (given a compute copy: bf16 training that keeps one)
// the copy, which the owner's AdamW wrote from the masters it updated (round to nearest even,
// as a local cast would), and the masters only of the full-precision ranges (what the model
// reads as it is: the embedding, the norm gains), each owner broadcasting its pieces of
// them. Every value anyone reads is then bitwise the owner's, for two thirds of the bytes or
// less (a matrix element: 2 bytes instead of 4), and the next forward casts nothing. The
// masters of matrix elements other ranks own go stale: masters_needed() brings them (the
// fp32 collectives of the masters' scheme) when something reads them. Where the masters are
// paged, the pages of those stale masters go back to the allocator while they are stale:
// from the end of the first step's sharing until masters_needed() takes them again (and
// from the next step's end again). Giving pages back waits for the device; it happens once
// per run of steps, not per step. Given CopySharing::copy_engines, zero1's all-gathers of the
// copy go through the copy engines (CopyEngines, the copy a window of theirs): NCCL's kernels,
// resident for the whole transfer, would slow the next forward's GEMMs beside them. They run
// outside the group of the full-precision broadcasts, after it.
class ParameterSharing final : public GradientSync {
 public:
  ParameterSharing(std::unique_ptr<GradientSync> gradients, Communicator& comm, Tensor flat_params, CopySharing sharing)
      : gradients_(std::move(gradients)), comm_(comm), params_(flat_params), copy_(sharing.copy),
        full_precision_(std::move(sharing.full_precision)), pages_(copy_.empty() ? nullptr : sharing.pages) {
    LLMHPC_CHECK(copy_.empty() || copy_.numel() == params_.numel(), "the compute copy must be as long as the masters");
    for (size_t k = 1; k < full_precision_.size(); ++k)
      LLMHPC_CHECK(full_precision_[k - 1].end <= full_precision_[k].begin, "full-precision ranges must be in order");
    if (!copy_.empty()) pieces_ = full_precision_pieces();
    if (pages_) stale_ = stale_masters();
    const SyncPlan& plan = gradients_->plan();
    // Broadcasts have no zero-CTA form: only zero1's all-gathers move through the copy engines.
    if (sharing.copy_engines && !copy_.empty() && plan.sharding == Sharding::Zero1) engines_ = comm_.copy_engines();
    if (engines_) engines_->register_window(copy_.data, copy_.bytes());
    LLMHPC_CHECK(plan.sharding != Sharding::None, "parameter sharing without a sharded plan");
    for (size_t g = 0; g < plan.shard_groups.size(); ++g) {
      LLMHPC_CHECK(plan.shard_groups[g].end <= params_.numel(), "a shard group lies beyond the parameters");
      LLMHPC_CHECK(g == 0 || plan.shard_groups[g].end <= plan.shard_groups[g - 1].begin,
                   "shard groups must be in reverse parameter order, without overlap");
    }
    arriving_.resize(plan.shard_groups.size());
    begin_step();
  }
  ~ParameterSharing() override {
    parameters_needed(0, params_.numel());
    take_back_stale();  // the buffer whole again (by then wait_parameters() brought the masters)
    if (engines_) engines_->deregister_window(copy_.data);
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
    LLMHPC_CHECK(shared_ == 0 || shared_ == arriving_.size(),
                 "begin_step() before the last step's finish_parameters()");
    parameters_needed(0, params_.numel());  // what forward did not ask for
    gradients_->begin_step();
    shared_ = 0;
    param_stats_ = SyncStats{};
  }
  void gradients_final(int64_t begin, int64_t end) override { gradients_->gradients_final(begin, end); }
  void finish() override { gradients_->finish(); }

  void parameters_updated(int64_t begin, int64_t end) override {
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
    give_back_stale();  // once: after the first step, and after each masters_needed()
    return true;
  }

  bool shares_compute_copy() const override { return !copy_.empty(); }

  void masters_needed() override {
    if (copy_.empty()) return;  // the masters themselves were shared
    NvtxRange range("master weights");
    parameters_needed(0, params_.numel());
    take_back_stale();
    SyncStats outside_the_step;
    for (size_t k = 0; k < arriving_.size(); ++k) {
      const size_t g = arriving_.size() - 1 - k;
      comm_.group_start();
      send_parts(params_, g, outside_the_step);
      comm_.group_end();
    }
    parameters_needed(0, params_.numel());
  }

  void parameters_needed(int64_t begin, int64_t end) override {
    const std::vector<FlatRange>& groups = gradients_->plan().shard_groups;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (arriving_[g].empty() || groups[g].end <= begin || end <= groups[g].begin) continue;
      for (CommHandle& h : arriving_[g]) h.wait();
      arriving_[g].clear();
    }
  }

 private:
  static void* at(const Tensor& flat, FlatRange r) { return flat.slice(r.begin, {r.size()}).data; }

  // What this rank neither updates nor reads as a master: [0, flat_elements) less its parts
  // and the full-precision ranges, in order.
  std::vector<FlatRange> stale_masters() const {
    const SyncPlan& plan = gradients_->plan();
    std::vector<FlatRange> kept = plan.owned(comm_.rank());
    kept.insert(kept.end(), full_precision_.begin(), full_precision_.end());
    std::sort(kept.begin(), kept.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    std::vector<FlatRange> out;
    int64_t from = 0;
    for (const FlatRange& k : kept) {
      if (k.begin > from) out.push_back({from, k.begin});
      from = std::max(from, k.end);
    }
    if (from < plan.flat_elements) out.push_back({from, plan.flat_elements});
    return out;
  }
  void give_back_stale() {
    if (!pages_ || given_back_) return;
    const size_t es = dtype_size(params_.dtype);
    for (const FlatRange& r : stale_) pages_->release_pages(params_.data, size_t(r.begin) * es, size_t(r.size()) * es);
    given_back_ = true;
  }
  void take_back_stale() {
    if (!given_back_) return;
    const size_t es = dtype_size(params_.dtype);
    for (const FlatRange& r : stale_) pages_->restore_pages(params_.data, size_t(r.begin) * es, size_t(r.size()) * es);
    given_back_ = false;
  }

  // The next group in forward order, in one launch where the backend can: the masters, or
  // the compute copy and the full-precision pieces.
  void share_next() {
    const size_t g = arriving_.size() - 1 - shared_++;
    comm_.group_start();
    if (copy_.empty()) {
      send_parts(params_, g, param_stats_);
    } else {
      if (!engines_) send_parts(copy_, g, param_stats_);
      send_full_precision_pieces(g);
    }
    comm_.group_end();
    if (engines_) send_parts(copy_, g, param_stats_, engines_);  // never grouped (CopyEngines)
  }

  // Every owner's part of group g of `flat`, in place. zero1: one all-gather (rank r's part
  // lands at part r), through `engines` if given; broadcast: each owner's part from its owner.
  void send_parts(const Tensor& flat, size_t g, SyncStats& stats, CopyEngines* engines = nullptr) {
    const SyncPlan& plan = gradients_->plan();
    const FlatRange group = plan.shard_groups[g];
    const int64_t es = int64_t(dtype_size(flat.dtype));
    if (plan.sharding == Sharding::Zero1) {
      const FlatRange mine = plan.shard(g, comm_.rank());
      const size_t count = size_t(mine.size());
      arriving_[g].push_back(engines ? engines->all_gather_async(at(flat, mine), at(flat, group), count, flat.dtype)
                                     : comm_.all_gather_async(at(flat, mine), at(flat, group), count, flat.dtype));
      ++stats.param_collectives;
      stats.bus_bytes += int64_t(double(group.size() * es) * bus_factor(Collective::AllGather, plan.ranks));
    } else {
      for (int owner = 0; owner < plan.ranks; ++owner) {
        const FlatRange part = plan.shard(g, owner);
        if (part.size() == 0) continue;
        arriving_[g].push_back(
            comm_.broadcast_async(at(flat, part), at(flat, part), size_t(part.size()), flat.dtype, owner));
        ++stats.param_collectives;
        stats.bus_bytes += int64_t(double(part.size() * es) * bus_factor(Collective::Broadcast, plan.ranks));
      }
    }
    stats.param_bytes += group.size() * es;
  }

  // Per group, the full-precision ranges' pieces in it and the owner of the part each lies in.
  std::vector<std::vector<std::pair<int, FlatRange>>> full_precision_pieces() const {
    const SyncPlan& plan = gradients_->plan();
    std::vector<std::vector<std::pair<int, FlatRange>>> out(plan.shard_groups.size());
    for (size_t g = 0; g < out.size(); ++g)
      for (int owner = 0; owner < plan.ranks; ++owner) {
        const FlatRange part = plan.shard(g, owner);
        for (const FlatRange& r : full_precision_) {
          const FlatRange piece{std::max(r.begin, part.begin), std::min(r.end, part.end)};
          if (piece.size() > 0) out[g].push_back({owner, piece});
        }
      }
    return out;
  }

  // The masters of group g's full-precision pieces, each broadcast by its owner.
  void send_full_precision_pieces(size_t g) {
    const int64_t es = int64_t(dtype_size(params_.dtype));
    const double bus = bus_factor(Collective::Broadcast, gradients_->plan().ranks);
    for (const auto& [owner, piece] : pieces_[g]) {
      arriving_[g].push_back(
          comm_.broadcast_async(at(params_, piece), at(params_, piece), size_t(piece.size()), params_.dtype, owner));
      ++param_stats_.param_collectives;
      param_stats_.bus_bytes += int64_t(double(piece.size() * es) * bus);
      param_stats_.param_bytes += piece.size() * es;
    }
  }

  std::unique_ptr<GradientSync> gradients_;
  Communicator& comm_;
  Tensor params_;
  Tensor copy_;                            // the bf16 copy that travels instead of the masters, or empty
  CopyEngines* engines_ = nullptr;         // or the copy engines its all-gathers go through
  std::vector<FlatRange> full_precision_;  // with it, the masters that travel too
  std::vector<std::vector<std::pair<int, FlatRange>>> pieces_;  // of them, per group: (owner, piece)
  Allocator* pages_;                               // with it, where the stale masters' pages go back, or null
  std::vector<FlatRange> stale_;                   // the masters this rank neither updates nor reads
  bool given_back_ = false;                        // their pages are given back now
  size_t shared_ = 0;                              // groups shared this step, in forward order
  std::vector<std::vector<CommHandle>> arriving_;  // per group: the collectives still bringing it
  SyncStats param_stats_;                          // the parameter fields only
  mutable SyncStats merged_;                       // what stats() returns: the gradients' and the parameters'
};

}  // namespace

std::unique_ptr<GradientSync> make_parameter_sharing(std::unique_ptr<GradientSync> gradients, Communicator& comm,
                                                     Tensor flat_params, CopySharing sharing) {
  return std::make_unique<ParameterSharing>(std::move(gradients), comm, flat_params, std::move(sharing));
}

}  // namespace llmhpc

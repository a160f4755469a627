// ZeRO-2 and ZeRO-3: the master weights, their gradients and the optimizer state sharded among
// the ranks unit by unit (ParameterLayout::units: the embedding, each layer, the head), as
// PyTorch FSDP2 shards each block and DeepSpeed ZeRO partitions its parameters.
//
// Who holds what (ShardLayout): each lane of each unit (its matrices, its other parameters:
// ParamUnit) is cut into n equal parts of `part` elements (the lane rounded up to n x the
// alignment), part r to rank r; a rank's shard is its parts one after another, unit by unit,
// lane by lane. For its shard only, a rank keeps the master weights and AdamW's m and v, and from
// backward to the optimizer their gradients: 16 bytes x parameters / n at most, 12 between steps.
//
// One step, through the model's ParallelHooks:
//   forward    unit_parameters(u): the unit's lanes all-gathered from every rank's parts into a
//              place the model reads (the matrices in the compute dtype, so that under bf16 what
//              travels is bf16; the others, the embedding and norm gains, in the parameter
//              dtype), and the next unit's all-gather issued at once, so that it runs behind
//              this unit's compute (one unit ahead, as FSDP2 prefetches)
//   backward   unit_parameters(u) for the units backward reads, and unit_gradients(u): one of
//              two windows, where backward writes the unit's gradients; gradients_final(u)
//              reduce-scatters (averages) the window into this rank's shard of the gradients,
//              and the window serves again, two units later, once that is done
//   optimizer  AdamW on the shard (optimizer_shard()); finish_parameters() starts bringing
//              the updated parameters.
// Where gathered parameters stay: ZeRO-2 keeps every unit gathered (one place per unit), all
// gathered once a step after the optimizer, in forward order, and waited for unit by unit as the
// next forward reaches each (as ZeRO-1 shares its updates); ZeRO-3 keeps two places, gathers each
// unit when forward needs it and again when backward does (FSDP2's reshard_after_forward),
// keeping a unit that is still in its place, so a rank holds at most two units' parameters
// beyond its shard.
//
// Each element is updated by its owner alone, with AdamW's unchanged arithmetic on the averaged
// gradient, so the weights are bitwise those of the unsharded optimizer wherever the
// reduce-scatter adds the ranks' gradients in the all-reduce's order (any order on 2 ranks).
// Micro-batches (accumulate_micro_batches): every unit keeps a window of its own from the first
// micro-batch's backward to the step's reductions, the earlier backward passes adding into it
// and the last one's reduce-scatters emptying it, so the sum is the unsharded run's, bitwise; the
// windows then hold the whole model's gradients, as PyTorch FSDP2 keeps unsharded gradients while
// it does not synchronise.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "src/dist/grad_sync.h"
#include "src/dist/replica_average.h"
#include "src/model/adamw.h"
#include "src/model/transformer.h"

namespace llmhpc {

// Which elements each rank holds: a pure function of the layout, the same on every rank.
struct ShardLayout {
  struct Lane {
    int64_t elements = 0;      // the lane's elements in the unit
    int64_t part = 0;          // each rank's part: elements rounded up to ranks x alignment, / ranks
    int64_t shard_offset = 0;  // where this rank's part starts in its shard
  };
  // Elements [flat, flat + count) of the flat layout lie at [shard, shard + count) of a shard.
  struct Piece {
    int64_t flat, shard, count;
  };

  ShardLayout(const ParameterLayout& layout, int ranks, int64_t alignment);
  const Lane& lane(size_t unit, llmhpc::Lane which) const { return units[unit][size_t(which)]; }
  // What rank `rank`'s shard holds of every parameter, in layout order.
  std::vector<Piece> pieces(const ParameterLayout& layout, int rank) const;

  int ranks = 1;
  std::vector<std::array<Lane, 2>> units;
  int64_t shard_elements = 0;  // one rank's shard, padding included
};

// The plan of zero2 or zero3 (`sharding`) on `ranks`: one reduction per unit, in backward's
// order, as soon as backward finishes it. Throws UsageError unless `strategy` is bucketed (the
// units are the buckets).
SyncPlan unit_plan(const ParameterLayout& layout, SyncStrategy strategy, Sharding sharding, int ranks,
                   int64_t alignment = kShardAlignment);

class UnitShards final : public GradientSync {
 public:
  // `plan` from unit_plan over `comm`'s ranks; `model` has ParameterStorage::Sharded and runs its
  // ops on `ops`. Hybrid sharding: `comm` is this rank's group and `replicas` the ranks holding the
  // same part in the other groups (make_shard_groups), over which each step's gradient shard is
  // averaged unit by unit as backward goes on. Collective. The model asks it for its parameters from here on
  // (set_parallel_hooks).
  UnitShards(const SyncPlan& plan, Communicator& comm, TransformerLM& model, Ops& ops,
             Communicator* replicas = nullptr);
  ~UnitShards() override;

  const SyncPlan& plan() const override { return plan_; }
  const SyncStats& stats() const override { return stats_; }
  const ShardLayout& layout() const { return shards_; }
  void begin_step() override;
  UnitView unit_parameters(const ParamUnit& unit, const ParamUnit* next) override;
  UnitView unit_gradients(const ParamUnit& unit) override;
  void gradients_final(int64_t begin, int64_t end) override;
  void finish() override;
  bool finish_parameters() override;

  // The step's backward runs in several micro-batches, their gradients added up before the step's
  // reductions (train's --grad-accum): each unit gets a window of its own, kept across them.
  void accumulate_micro_batches(bool on) { accumulating_ = on; }

  // What this rank's optimizer updates: AdamW(model, ops, hyper, optimizer_shard()). Its gradients
  // exist from the step's backward to the end of its optimizer (finish_parameters()).
  AdamW::Shard optimizer_shard();
  // The model's initial parameters (TransformerLM::init_parameter, from `seed` on every rank),
  // each rank writing its parts only. Collective.
  void initialize(uint64_t seed);
  // Takes the whole model's parameters (flat layout, on the host), each rank its parts; and
  // where given, AdamW's m and v likewise into `opt` (made with optimizer_shard()). Collective.
  void load(const std::vector<float>& params, AdamW* opt = nullptr, const std::vector<float>* m = nullptr,
            const std::vector<float>* v = nullptr);
  // A shard-sized buffer (the masters, m or v: parameter dtype) of every rank, gathered into the
  // flat layout on the host of every rank. Collective. (A checkpoint gathers on one rank only:
  // save_checkpoint_from_shards.)
  std::vector<float> gathered(const Tensor& shard);
  std::vector<float> gathered_parameters() { return gathered(master_); }
  // This rank's shard of such a buffer, on the host.
  std::vector<float> host_shard(const Tensor& shard);
  Tensor masters() const { return master_.tensor(); }  // this rank's shard of the master weights
  // Where the elements of `flat` (ranges of the model's flat layout) lie in this rank's shard,
  // in ascending order: as AdamW's GradClipping::counted_elsewhere takes them.
  std::vector<FlatRange> in_shard(const std::vector<FlatRange>& flat) const;

 private:
  // Where a unit's lanes are gathered (ZeRO-2: one per unit; ZeRO-3: two).
  struct Place {
    Buffer lanes[2];
    int unit = -1;
    int64_t version = -1;  // the parameters' version gathered (version_ when current)
    std::vector<CommHandle> pending;
  };
  // Where backward writes one unit's gradients, and the reduce-scatter reading them.
  struct Window {
    Buffer lanes[2];
    int unit = -1;
    std::vector<CommHandle> pending;
  };
  int unit_index(const ParamUnit& unit) const;
  Place* resident(int unit);
  void gather(int unit, Place& place);
  void gather_for_forward();  // after the parameters changed
  void refresh();             // the masters changed: the bf16 copy again, then gathered anew
  DType lane_dtype(llmhpc::Lane lane) const;
  void take_gradients();  // the gradient shard, for this step's reductions

  Sharding stage_;
  Communicator& comm_;
  ReplicaAverage average_;  // hybrid sharding: over the ranks holding this rank's parts in the other groups
  TransformerLM& model_;
  Ops& ops_;
  Device& device_;
  ShardLayout shards_;
  SyncPlan plan_;
  SyncStats stats_;     // of the last whole step
  SyncStats counting_;  // since the last finish_parameters()
  Buffer master_;       // this rank's shard of the master weights
  Buffer grads_;        // and of the averaged gradients: from backward to the optimizer
  std::vector<Place> places_;
  Place* last_ = nullptr;  // the place of the unit asked for last
  Window windows_[2];
  int next_window_ = 0;
  bool accumulating_ = false;
  std::vector<Window> kept_;     // accumulating: one window per unit
  Window& window_for(int unit);  // where backward writes `unit`'s gradients now
  int64_t version_ = 0;          // changes whenever the parameters do
};

}  // namespace llmhpc

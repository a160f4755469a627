// Data-parallel gradient synchronisation: after backward, every rank holds the average over
// ranks of its gradients, so every rank takes the same optimizer step. The strategies below, behind
// one small interface; each is a ParallelHooks that backward tells when a range of the
// flat gradient is final, plus finish(), which the step calls before the optimizer.
//
//   none      nothing is communicated (one rank, or a run that measures without it)
//   naive     after backward, one blocking all-reduce per trainable parameter tensor
//   flat      after backward, one all-reduce of the range from the first trainable
//             element to the last (plan_flat: frozen tensors inside it are communicated too)
//   overlap   per trainable tensor, an asynchronous all-reduce issued as soon as backward
//             has reported all of it; finish() waits for all of them
//   bucketed  as overlap, per bucket: adjacent tensors packed in reverse parameter order up
//             to --bucket-mb (plan_buckets), so fewer, larger collectives overlap backward
//
// The strategies differ in two choices only, which ranges one collective covers
// (src/dist/bucket_plan.h) and whether it is issued after backward or as soon as its
// gradients are final, so one implementation serves the four that communicate (src/dist/reducer.cpp).
// Every range is reduced in place in the one flat buffer: no copies in or out (but for
// SyncPlan::reduce_in_bf16, whose ranges travel through a bf16 wire). Frozen parameters
// (ParamSpan::trainable false) are in no range, except inside flat's.
//
// Optimizer state sharding (--shard-optimizer) splits the AdamW state among the ranks: each
// rank's optimizer updates only the ranges it owns (SyncPlan::owned), and the listener's
// parameter half (ParallelHooks::parameters_updated, finish_parameters,
// parameters_needed) brings every owner's updates to every rank, in place in the flat
// parameters.
//
//   none       every rank holds all of m and v and updates every parameter
//   broadcast  the reference DDP study's scheme: gradients all-reduced as the strategy does;
//              each rank owns one range of the parameters (1/n, aligned) and broadcasts it
//              once updated;
//              waited for as zero1's are, but its one group is the whole model, so the next
//              forward's first range waits for all of it (nothing to overlap)
//   zero1      ZeRO stage 1: each of the strategy's ranges, re-cut so that it divides into n
//              equal aligned parts (plan_zero1_buckets), is reduce-scattered (averaged) to its
//              parts' owners when the strategy would all-reduce it; each rank owns its part of
//              every bucket, and all-gathers it in place once updated. Reduce-scatter then
//              all-gather moves what one all-reduce moves. The all-gathers overlap the rest of
//              the optimizer and the next forward: the optimizer updates, and the all-gathers
//              are issued, in forward order (ascending offsets), finish_parameters() does not
//              wait, and the next forward waits (nccl: its stream, never the host) for a bucket
//              only when it first reads parameters in it (parameters_needed). It pads the
//              flat buffers to a multiple of n x the shard alignment (kShardAlignment elements,
//              or a page under --share-weights bf16: shard_alignment; SyncPlan::flat_elements);
//              the model's views stay where they are and the padding stays zero.
//
// Under both schemes each element is updated by exactly one rank, with AdamW's unchanged
// per-element arithmetic on the same averaged gradient, and what travels is what the owner
// computed; so each rank's weights are bitwise the unsharded optimizer's wherever the
// gradients are (broadcast: always, the reduction is the strategy's own; zero1: when a
// reduce-scatter sums in the all-reduce's order, as on 2 ranks). What travels
// (--share-weights): the master weights (`master`), from which each rank casts its bf16
// copy again as the next forward reaches each range (round to nearest even, as the fused
// AdamW writes it: bitwise the owner's), letting the copy go between steps; or, under bf16
// training that keeps a copy (`bf16`), the copy itself, which the owner's AdamW wrote, plus
// the masters of what the model reads as it is (embedding, norm gains): fewer bytes and no
// cast, the copy held between steps, and the other masters of ranges other ranks own stale
// until wait_parameters() brings them (ParallelHooks::masters_needed).
//
// Every step:  model.forward() (asks the sync for each range while parameters arrive);
//              sync.begin_step(); model.backward(&sync); sync.finish();
//              optimizer.step(&sync); if (sync.finish_parameters()) model.parameters_arriving(sync);
// (run_step in src/model/train_step.h). What the caller guarantees:
//  - Every rank reports the same ranges in the same order (the model's backward does: what
//    it reports does not depend on the data), so every rank issues the same collectives in
//    the same order. A trainable tensor that backward never reports is reduced by finish()
//    with whatever its gradient holds, on every rank: no hang (PyTorch needs
//    find_unused_parameters for that), and ranks never diverge.
//  - The optimizer reports its updated ranges in the order of SyncPlan::owned (AdamW does).
//  - Nothing reads the parameters after a step before asking for them: the model's forward
//    does, range by range; a checkpoint, the end of training or a test calls
//    model.wait_parameters() (every range), and does so before the sync is destroyed.
//  - Gradient accumulation over micro-batches: only the last backward gets the sync; the
//    earlier ones would add into gradients that are being reduced.
//  - The gradient buffer is where the communicator works: host memory for mpi, this rank's
//    GPU for nccl (made with compute_stream = the model's Device::native_stream()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/core/tensor.h"
#include "src/core/allocator.h"
#include "src/dist/bucket_plan.h"
#include "src/model/parallel_hooks.h"

namespace llmhpc {

class ParameterLayout;

enum class SyncStrategy { None, Naive, Flat, Overlap, Bucketed };
// Throws UsageError naming --ddp and listing the choices.
SyncStrategy parse_sync_strategy(const std::string& text);  // none | naive | flat | overlap | bucketed
const char* sync_strategy_name(SyncStrategy s);
const std::vector<SyncStrategy>& all_sync_strategies();

// What is sharded among the ranks: nothing; the optimizer state (broadcast, zero1: above);
// with the gradients too (zero2) or with the parameters as well (zero3): src/dist/unit_shards.h.
enum class Sharding { None, Broadcast, Zero1, Zero2, Zero3 };
// Throws UsageError naming --shard-optimizer and listing the choices.
Sharding parse_sharding(const std::string& text);  // none | broadcast | zero1 | zero2 | zero3
// Whether the model keeps no flat buffers of its own under `s` (zero2, zero3: the parameters,
// gradients and optimizer state are held in shards, TransformerLM's ParameterStorage::Sharded).
bool shards_parameters(Sharding s);
const char* sharding_name(Sharding s);
const std::vector<Sharding>& all_shardings();

// What a data-parallel step communicates and who updates what: a pure function of the
// parameters' places, the same on every rank (plan_sync), so the model can be built with the
// buffer length, the optimizer with its ranges, and the sync with the plan.
struct SyncPlan {
  SyncStrategy strategy = SyncStrategy::None;
  Sharding sharding = Sharding::None;
  int ranks = 1;
  int64_t alignment = kShardAlignment;  // where shards may start (shard_part); a page when pages are given back
  int64_t parameters = 0;               // the elements backward reports: [0, parameters)
  int64_t flat_elements = 0;            // the flat buffers' length: parameters, padded under zero1
  std::vector<FlatRange> buckets;       // what one gradient collective covers, in issue order (reverse parameter order)
  bool when_ready = false;  // issued as soon as backward finished it (overlap, bucketed); else after backward
  // The fp32 gradients travel as bf16 (--grad-reduce-dtype bf16, as PyTorch DDP's
  // bf16_compress_hook): each range rounded to bf16 before its collective, averaged in bf16,
  // widened after it (src/dist/bf16_wire.h). Half the bytes; every rank still
  // gets the same average. The buckets stay those of the fp32 gradients, as PyTorch's do.
  bool reduce_in_bf16 = false;
  // Ranges whose elements the ranks' optimizers share out, part r to rank r (shard_part):
  // none: no range (every rank owns everything); broadcast: [0, parameters); zero1: the buckets.
  std::vector<FlatRange> shard_groups;

  FlatRange shard(size_t group, int rank) const { return shard_part(shard_groups[group], rank, ranks, alignment); }
  // What `rank`'s optimizer updates: its part of every shard group, in forward order (ascending
  // offsets: the groups from the last to the first), the order the parameters are shared in
  // (some parts may be empty); [0, parameters) when unsharded.
  std::vector<FlatRange> owned(int rank) const;
};

// Throws UsageError (naming --shard-optimizer) unless the strategy reduces the gradients
// when the optimizer is sharded: with none, no rank would see the others' gradients.
void require_reduced_gradients(SyncStrategy strategy, Sharding sharding);

// Throws what require_reduced_gradients and plan_buckets throw. `alignment` (elements, a
// multiple of kShardAlignment): where shards start; a page of the master weights when the
// masters of ranges other ranks own are given back (--share-weights bf16), so that whole
// pages are.
SyncPlan plan_sync(SyncStrategy strategy, Sharding sharding, const std::vector<ParamSpan>& params, size_t element_bytes,
                   double bucket_mb, int ranks, int64_t alignment = kShardAlignment);

// What one step communicated (reset by begin_step()).
struct SyncStats {
  int64_t collectives = 0;        // gradient collectives issued: all-reduces, or zero1's reduce-scatters,
                                  // and under hybrid sharding the averages over the groups too
  int64_t bytes = 0;              // their payload: the buckets' elements x element size
  int64_t issued_in_finish = 0;   // of the collectives, those issued by finish() and not during backward
  int64_t buckets = 0;            // ranges the strategy reduces per step: one per trainable tensor
                                  // (naive, overlap), one (flat), the planned buckets (bucketed), 0 (none);
                                  // under zero1 those re-cut by plan_zero1_buckets
  int64_t param_collectives = 0;  // sharded: the broadcasts or all-gathers that share updated parameters
  int64_t param_bytes = 0;        // their payload: every shared element once
  // Bytes each rank sends over the links for all of them, by nccl-tests' bus factors
  // (all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1): what the
  // reference DDP study calls communication volume, 2(n-1)/n of the buffer for DDP and for
  // ZeRO-1 alike, one buffer more for broadcast.
  int64_t bus_bytes = 0;
};

class GradientSync : public ParallelHooks {
 public:
  virtual const SyncPlan& plan() const = 0;
  SyncStrategy strategy() const { return plan().strategy; }
  // The ranges reduced each step, in reverse parameter order.
  const std::vector<FlatRange>& buckets() const { return plan().buckets; }
  // Before backward: a new step (what the last one reported is forgotten, stats restart).
  void begin_step() override = 0;
  // After backward: issues every reduction not issued yet, then makes the gradients'
  // consumer wait for all of them. nccl: the compute stream waits (the host does not
  // block), so the optimizer enqueued after it reads the averages; mpi: complete on return.
  void finish() override = 0;
  virtual const SyncStats& stats() const = 0;
};

// `flat_grads` and `flat_params` are the whole flat buffers (at least plan.flat_elements each;
// their dtype is what is communicated); the parameters are needed when the plan is sharded.
// A sharded plan given a CopySharing shares the bf16 copy instead of the masters.
struct CopySharing {
  Tensor copy;                            // the model's bf16 copy, as long as the parameters
  std::vector<FlatRange> full_precision;  // whose masters travel with it: the model's full_precision_ranges()
  // The allocator of the masters, if they are paged (Allocator::allocate_paged): the pages of
  // masters that this rank neither updates nor reads are given back while they are stale, from
  // the first step's sharing until wait_parameters() brings them (and again at the next step).
  Allocator* pages = nullptr;
  // The copy lies in shareable memory (Allocator::allocate_shareable): zero1's all-gathers of it
  // go through the copy engines where the communicator has them (Communicator::copy_engines).
  bool copy_engines = false;
};
// The gradient collectives' own buffers, as long as the largest bucket and held while the sync
// lives: the bf16 wire the gradients travel in (SyncPlan::reduce_in_bf16), and through the copy
// engines the scratch where the other ranks' parts arrive.
struct ReduceScratch {
  Allocator* allocator = nullptr;  // the gradients' allocator; needed for either
  // The gradients' collectives go through the copy engines where the communicator has them
  // (src/dist/copy_engine_reduction.h): in the gradients, which must then come from the
  // allocator's allocate_shareable, or in the bf16 wire.
  bool copy_engines = false;
};
// Hybrid zero1: `comm` is this rank's group (plan.ranks of them) and `replicas` the ranks holding
// the same parts in the other groups, over which each part is averaged after its reduce-scatter.
std::unique_ptr<GradientSync> make_gradient_sync(const SyncPlan& plan, Communicator& comm, Tensor flat_grads,
                                                 Tensor flat_params = Tensor(), CopySharing sharing = {},
                                                 ReduceScratch scratch = {}, Communicator* replicas = nullptr);

// The model's parameters as spans of its flat buffer, every one trainable.
std::vector<ParamSpan> param_spans(const ParameterLayout& layout);

// Every rank takes rank 0's values (in place), so ranks initialised each from a seed of its own
// start equal; under hybrid sharding (`replicas`: make_gradient_sync's) group 0's rank 0's, to
// every group. Collective; on return the values are there for the consumer (as finish()).
void broadcast_parameters(Communicator& comm, Tensor flat_params, Communicator* replicas = nullptr);

}  // namespace llmhpc

#include "src/dist/unit_shards.h"

#include <algorithm>

#include "kernels/reduce_passes.h"
#include "src/core/check.h"
#include "src/core/nvtx.h"
#include "src/model/checkpoint.h"

namespace llmhpc {
namespace {

constexpr llmhpc::Lane kLanes[2] = {llmhpc::Lane::Matrices, llmhpc::Lane::Others};

// Waits (nccl: the compute stream waits) for the operations in `pending`, so that the memory they
// touch can go back to the allocator, whose reuse is ordered on the compute stream only.
void settle(std::vector<CommHandle>& pending) {
  for (CommHandle& h : pending) h.wait();
  pending.clear();
}

}  // namespace

ShardLayout::ShardLayout(const ParameterLayout& layout, int ranks_, int64_t alignment) : ranks(ranks_) {
  LLMHPC_CHECK(ranks > 0 && alignment > 0, "a shard layout needs ranks and an alignment");
  for (const ParamUnit& u : layout.units()) {
    std::array<Lane, 2> lanes;
    for (llmhpc::Lane l : kLanes) {
      Lane& lane = lanes[size_t(l)];
      lane.elements = u.elements(l);
      lane.part = round_up(lane.elements, int64_t(ranks) * alignment) / ranks;
      lane.shard_offset = shard_elements;
      shard_elements += lane.part;
    }
    units.push_back(lanes);
  }
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(const ParameterLayout& layout, int rank) const {
  std::vector<Piece> out;
  for (const ParamInfo& p : layout.params()) {
    const Lane& l = lane(size_t(p.unit), p.lane());
    const int64_t first = int64_t(rank) * l.part;  // this rank's part of the lane
    const int64_t begin = std::max(first, p.lane_offset),
                  end = std::min(first + l.part, p.lane_offset + p.shape.numel());
    if (begin < end) out.push_back({p.offset + begin - p.lane_offset, l.shard_offset + begin - first, end - begin});
  }
  return out;
}

SyncPlan unit_plan(const ParameterLayout& layout, SyncStrategy strategy, Sharding sharding, int ranks,
                   int64_t alignment) {
  LLMHPC_CHECK(shards_parameters(sharding), "unit_plan is zero2's and zero3's");
  require_reduced_gradients(strategy, sharding);
  if (strategy != SyncStrategy::Bucketed)
    throw UsageError(std::string("{shard_optimizer} ") + sharding_name(sharding) +
                     " reduce-scatters each unit of the model (the embedding, a layer, the head) as soon as backward "
                     "finishes it: its buckets are the units, so it runs with {ddp} bucketed, not " +
                     sync_strategy_name(strategy));
  SyncPlan plan;
  plan.strategy = strategy;
  plan.sharding = sharding;
  plan.ranks = ranks;
  plan.alignment = alignment;
  plan.parameters = plan.flat_elements = layout.total();
  for (auto u = layout.units().rbegin(); u != layout.units().rend(); ++u) plan.buckets.push_back(u->range);
  plan.when_ready = true;
  return plan;
}

UnitShards::UnitShards(const SyncPlan& plan, Communicator& comm, TransformerLM& model, Ops& ops, Communicator* replicas)
    : stage_(plan.sharding), comm_(comm), average_(replicas, model.grad_dtype()), model_(model), ops_(ops),
      device_(model.device()), shards_(model.layout(), comm.size(), plan.alignment), plan_(plan) {
  LLMHPC_CHECK(shards_parameters(stage_), "UnitShards runs zero2 or zero3");
  LLMHPC_CHECK(plan.ranks == comm.size(), "the plan was made for another number of ranks");
  LLMHPC_CHECK(plan.buckets.size() == model.layout().units().size(), "a unit plan of another model");
  LLMHPC_CHECK(model.storage() == ParameterStorage::Sharded,
               "UnitShards holds the parameters of a model that keeps none");
  master_ = Buffer(device_.allocator(), param_dtype(model.precision()), {shards_.shard_elements}, "params.shard");
  device_.fill_zero(master_.tensor().data, master_.tensor().bytes());
  const size_t units = shards_.units.size();
  // ZeRO-3: two places, each taken for the unit gathered into it; ZeRO-2: one per unit, kept.
  places_ = std::vector<Place>(stage_ == Sharding::Zero3 ? 2 : units);
  stats_.buckets = int64_t(units);
  model.set_parallel_hooks(this);
}


UnitShards::~UnitShards() {
  for (Place& p : places_) p.pending.clear();  // completes (mpi) or releases (nccl) what is in flight
  for (Window& w : windows_) w.pending.clear();
  for (Window& w : kept_) w.pending.clear();
  average_.release();
  comm_.synchronize();  // nothing may still read or write the buffers as they go
  device_.synchronize();
  model_.set_parallel_hooks(nullptr);
}

DType UnitShards::lane_dtype(llmhpc::Lane lane) const {
  return lane == llmhpc::Lane::Matrices ? compute_dtype(model_.precision()) : param_dtype(model_.precision());
}


int UnitShards::unit_index(const ParamUnit& unit) const {
  const std::vector<ParamUnit>& units = model_.layout().units();
  const auto it = std::lower_bound(units.begin(), units.end(), unit.range.begin,
                                   [](const ParamUnit& u, int64_t begin) { return u.range.begin < begin; });
  LLMHPC_CHECK(it != units.end() && it->range == unit.range, "a range that is not one of the model's units");
  return int(it - units.begin());
}

UnitShards::Place* UnitShards::resident(int unit) {
  for (Place& p : places_)
    if (p.unit == unit && p.version == version_) return &p;
  return nullptr;
}

void UnitShards::gather(int unit, Place& place) {
  settle(place.pending);  // a gather never waited for (a prefetch no pass used)
  place.unit = unit;
  place.version = version_;
  const int n = comm_.size();
  // Each lane in the dtype the model reads it in: this rank's part of the masters gathered from
  // where it is, or first cast into its slot of the place (bf16 matrices: round to nearest even,
  // as AdamW writes a bf16 copy, so the gathered weights are bitwise the unsharded run's copy).
  // The cast runs on the communicator's stream, before the gather that reads it: the compute
  // stream, which waits for the gather anyway, does not pay for it (zero2 casts every unit
  // after the optimizer: 2.3 ms of xl's step on an H200, docs/results/scaling.md). The place
  // is taken for this unit's size: ZeRO-3 holds no more than the two units in use (the caching
  // allocator gives the blocks back without a device allocation).
  Tensor sent[2];
  for (llmhpc::Lane l : kLanes) {
    const ShardLayout::Lane& lane = shards_.lane(size_t(unit), l);
    Buffer& buffer = place.lanes[size_t(l)];
    if (buffer.empty() || buffer.tensor().numel() != lane.part * n) {
      buffer.release();
      if (lane.part > 0) buffer = Buffer(device_.allocator(), lane_dtype(l), {lane.part * n}, "params.gathered");
    }
    if (lane.part == 0) continue;
    const Tensor mine = master_.tensor().slice(lane.shard_offset, {lane.part});
    Tensor& slot = sent[size_t(l)];
    if (mine.dtype == lane_dtype(l)) {
      slot = mine;
    } else {
      LLMHPC_CHECK(mine.dtype == DType::F32 && lane_dtype(l) == DType::BF16, "masters are fp32, read as fp32 or bf16");
      slot = buffer.tensor().slice(int64_t(comm_.rank()) * lane.part, {lane.part});
      const float* from = static_cast<const float*>(mine.data);
      void* to = slot.data;
      const size_t count = size_t(lane.part);
      comm_.enqueue_async([=](void* stream) { narrow_to_bf16(from, to, count, stream); });
    }
  }
  comm_.group_start();
  for (llmhpc::Lane l : kLanes) {
    const ShardLayout::Lane& lane = shards_.lane(size_t(unit), l);
    if (lane.part == 0) continue;
    place.pending.push_back(comm_.all_gather_async(sent[size_t(l)].data, place.lanes[size_t(l)].tensor().data,
                                                   size_t(lane.part), lane_dtype(l)));
    const int64_t es = int64_t(dtype_size(lane_dtype(l)));
    counting_.param_collectives += 1;
    counting_.param_bytes += lane.part * n * es;
    counting_.bus_bytes += lane.part * (n - 1) * es;
  }
  comm_.group_end();
}

void UnitShards::gather_for_forward() {
  last_ = nullptr;
  if (stage_ == Sharding::Zero2) {
    for (size_t u = 0; u < places_.size(); ++u) gather(int(u), places_[u]);
  } else {
    // Between steps a rank holds its shard only (FSDP2 likewise gathers its root unit as the
    // next forward begins): forward gathers each unit as it asks, one ahead.
    for (Place& p : places_) {
      settle(p.pending);
      for (Buffer& b : p.lanes) b.release();
      p.unit = -1;
    }
  }
}

void UnitShards::begin_step() { take_gradients(); }

void UnitShards::take_gradients() {
  // Every element is written by a reduce-scatter each step (padding included): no zeroing.
  if (grads_.empty())
    grads_ = Buffer(device_.allocator(), model_.grad_dtype(), {shards_.shard_elements}, "grads.shard");
}

UnitView UnitShards::unit_parameters(const ParamUnit& unit, const ParamUnit* next) {
  const int u = unit_index(unit);
  Place* place = resident(u);
  if (!place) {
    LLMHPC_CHECK(stage_ == Sharding::Zero3, "zero2 keeps every unit gathered from initialize() on");
    place = &places_[last_ == &places_[0] ? 1 : 0];
    gather(u, *place);
  }
  settle(place->pending);
  last_ = place;
  if (stage_ == Sharding::Zero3 && next) {
    const int v = unit_index(*next);
    if (!resident(v)) gather(v, places_[place == &places_[0] ? 1 : 0]);
  }
  return {place->lanes[0].tensor(), place->lanes[1].tensor()};
}

UnitShards::Window& UnitShards::window_for(int unit) {
  if (accumulating_) {
    if (kept_.size() != shards_.units.size()) kept_ = std::vector<Window>(shards_.units.size());
    return kept_[size_t(unit)];
  }
  Window& w = windows_[next_window_];
  next_window_ ^= 1;
  return w;
}

UnitView UnitShards::unit_gradients(const ParamUnit& unit) {
  const int u = unit_index(unit);
  Window& w = window_for(u);
  settle(w.pending);  // its last reduce-scatter has read it
  w.unit = u;
  const int n = comm_.size();
  UnitView view;
  for (llmhpc::Lane l : kLanes) {
    const ShardLayout::Lane& lane = shards_.lane(size_t(u), l);
    Buffer& buffer = w.lanes[size_t(l)];
    if (buffer.empty() || buffer.tensor().numel() != lane.part * n) {  // taken for this unit's size
      buffer.release();
      if (lane.part > 0) buffer = Buffer(device_.allocator(), model_.grad_dtype(), {lane.part * n}, "grads.window");
    }
    if (lane.part == 0) continue;
    const Tensor t = buffer.tensor();
    // The padding past the lane travels in the reduce-scatter: zero, so the padding of the
    // gradient shards stays zero (and AdamW keeps zero weights there).
    const Tensor padding = t.slice(lane.elements, {lane.part * n - lane.elements});
    if (padding.numel() > 0) device_.fill_zero(padding.data, padding.bytes());
    (l == llmhpc::Lane::Matrices ? view.matrices : view.others) = t;
  }
  return view;
}

void UnitShards::gradients_final(int64_t begin, int64_t end) {
  const int u = unit_index(ParamUnit{{begin, end}, {0, 0}});
  Window* w = accumulating_ && size_t(u) < kept_.size() ? &kept_[size_t(u)]
              : windows_[0].unit == u                   ? &windows_[0]
              : windows_[1].unit == u                   ? &windows_[1]
                                                        : nullptr;
  LLMHPC_CHECK(w != nullptr, "gradients final for a unit whose gradients backward was not given a window for");
  NvtxRange range("reduce-scatter");
  take_gradients();
  const int n = comm_.size();
  const DType gd = grads_.tensor().dtype;
  const int64_t es = int64_t(dtype_size(gd));
  comm_.group_start();
  for (llmhpc::Lane l : kLanes) {
    const ShardLayout::Lane& lane = shards_.lane(size_t(u), l);
    if (lane.part == 0) continue;
    const Tensor mine = grads_.tensor().slice(lane.shard_offset, {lane.part});
    w->pending.push_back(comm_.reduce_scatter_async(w->lanes[size_t(l)].tensor().data, mine.data, size_t(lane.part), gd,
                                                    ReduceOp::Average));
    counting_.collectives += 1;
    counting_.bytes += lane.part * n * es;
    counting_.bus_bytes += lane.part * (n - 1) * es;
  }
  comm_.group_end();
  if (!accumulating_) w->unit = -1;
  if (!average_.active()) return;
  // Hybrid: this unit's parts, averaged over the groups once the next unit's are issued.
  std::vector<ReplicaAverage::Part> parts;
  for (llmhpc::Lane l : kLanes) {
    const ShardLayout::Lane& lane = shards_.lane(size_t(u), l);
    if (lane.part > 0) parts.push_back({grads_.tensor().slice(lane.shard_offset, {lane.part}).data, lane.part});
  }
  average_.next(
      std::move(parts), [w] { settle(w->pending); }, counting_);
}

void UnitShards::finish() {
  // The windows go back once the compute stream waits for their reductions: whatever takes
  // their blocks next is ordered after that.
  for (Window& w : windows_) {
    settle(w.pending);
    for (Buffer& b : w.lanes) b.release();
    w.unit = -1;
  }
  for (Window& w : kept_) settle(w.pending);   // kept for the next step's micro-batches
  for (Place& p : places_) settle(p.pending);  // a prefetch no pass used reads the masters AdamW writes next
  average_.finish(counting_);  // hybrid: the last unit's average over the groups, then every one waited for
}

bool UnitShards::finish_parameters() {
  stats_ = counting_;  // the step's collectives: forward's and backward's gathers, backward's reductions
  stats_.buckets = int64_t(shards_.units.size());
  counting_ = {};
  grads_.release();  // read by the optimizer, enqueued before this: as zero_grad(set_to_none=True)
  ++version_;
  gather_for_forward();
  return false;  // the model asks for every unit anyway
}

AdamW::Shard UnitShards::optimizer_shard() {
  return {master_.tensor(), [this] { return grads_.tensor(); }};
}

void UnitShards::refresh() {
  ++version_;
  gather_for_forward();
}

void UnitShards::initialize(uint64_t seed) {
  const ParameterLayout& layout = model_.layout();
  const std::vector<ShardLayout::Piece> pieces = shards_.pieces(layout, comm_.rank());
  const DType pd = master_.tensor().dtype;
  const size_t es = dtype_size(pd);
  size_t next_piece = 0;
  for (const ParamUnit& unit : layout.units()) {
    // The whole unit drawn as the model draws it, then this rank's parts kept.
    Buffer drawn(device_.allocator(), pd, {unit.range.size()}, "params.init");
    for (size_t k = 0; k < layout.params().size(); ++k) {
      const ParamInfo& p = layout.params()[k];
      if (p.offset >= unit.range.begin && p.offset < unit.range.end)
        TransformerLM::init_parameter(ops_, device_, layout, k,
                                      drawn.tensor().slice(p.offset - unit.range.begin, p.shape), seed);
    }
    for (; next_piece < pieces.size() && pieces[next_piece].flat < unit.range.end; ++next_piece) {
      const ShardLayout::Piece& piece = pieces[next_piece];
      device_.copy_on_device(static_cast<char*>(master_.tensor().data) + size_t(piece.shard) * es,
                             static_cast<char*>(drawn.tensor().data) + size_t(piece.flat - unit.range.begin) * es,
                             size_t(piece.count) * es);
    }
  }
  refresh();
}

void UnitShards::load(const std::vector<float>& params, AdamW* opt, const std::vector<float>* m,
                      const std::vector<float>* v) {
  const ParameterLayout& layout = model_.layout();
  LLMHPC_CHECK(int64_t(params.size()) == layout.total(), "load: the whole model's parameters");
  if (opt) opt->allocate_state();
  for (const ShardLayout::Piece& piece : shards_.pieces(layout, comm_.rank())) {
    from_host_floats(device_, master_.tensor().slice(piece.shard, {piece.count}), params.data() + piece.flat);
    if (opt && m) from_host_floats(device_, opt->m().slice(piece.shard, {piece.count}), m->data() + piece.flat);
    if (opt && v) from_host_floats(device_, opt->v().slice(piece.shard, {piece.count}), v->data() + piece.flat);
  }
  refresh();
}

std::vector<FlatRange> UnitShards::in_shard(const std::vector<FlatRange>& flat) const {
  std::vector<FlatRange> out;
  for (const ShardLayout::Piece& piece : shards_.pieces(model_.layout(), comm_.rank()))
    for (const FlatRange& r : flat) {
      const int64_t begin = std::max(r.begin, piece.flat), end = std::min(r.end, piece.flat + piece.count);
      if (begin < end) out.push_back({piece.shard + begin - piece.flat, piece.shard + end - piece.flat});
    }
  std::sort(out.begin(), out.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  return out;
}

std::vector<float> UnitShards::host_shard(const Tensor& shard) {
  LLMHPC_CHECK(shard.numel() == shards_.shard_elements, "host_shard: a buffer the size of one rank's shard");
  return to_host_floats(device_, shard);
}

std::vector<float> UnitShards::gathered(const Tensor& shard) {
  LLMHPC_CHECK(shard.numel() == shards_.shard_elements, "gathered: a buffer the size of one rank's shard");
  const ParameterLayout& layout = model_.layout();
  std::vector<float> out(size_t(layout.total()), 0.0f);
  // Each rank's shard in turn, so the memory taken is one shard's.
  Buffer theirs(device_.allocator(), shard.dtype, {shard.numel()}, "params.gather");
  for (int r = 0; r < comm_.size(); ++r) {
    comm_.broadcast(shard.data, theirs.tensor().data, size_t(shard.numel()), shard.dtype, r);
    comm_.synchronize();
    const std::vector<float> host = to_host_floats(device_, theirs);
    for (const ShardLayout::Piece& piece : shards_.pieces(layout, r))
      std::copy(host.begin() + piece.shard, host.begin() + piece.shard + piece.count, out.begin() + piece.flat);
  }
  return out;
}

}  // namespace llmhpc

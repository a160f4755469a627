// Data-parallel planning and bookkeeping without communication: bucket plans (sizes in MiB,
// reverse parameter order, frozen tensors left out, one bucket per oversized tensor), the
// per-tensor and flat plans, optimizer shards (balanced, aligned, each element owned once;
// ZeRO-1's buckets re-cut to divide among the ranks without waiting longer), option parsing,
// and when each strategy issues its collectives and waits for them, sharded or not (a
// recording communicator stands in for the ranks): a sharded optimizer's parameters are
// shared in forward order and waited for only where a range of them is asked for. The results of real collectives are tests/mpi/test_ddp.cpp's and
// tests/mpi/test_shard.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "comm/collectives.h"
#include "src/dist/grad_sync.h"
#include "src/dist/unit_shards.h"
#include "src/model/params.h"
#include "src/modes/data_parallel.h"

namespace llmhpc {
namespace {

using Plan = std::vector<FlatRange>;

// Toy buffer of 31 fp32 elements: a frozen tensor first, then four trainable ones.
//   frozen [0,4)  w [4,20) 64 B  q [20,26) 24 B  a [26,30) 16 B  c [30,31) 4 B
std::vector<ParamSpan> toy_spans() {
  return {{"frozen", 0, 4, false}, {"w", 4, 20}, {"q", 20, 26}, {"a", 26, 30}, {"c", 30, 31}};
}
constexpr double kMiB = 1024.0 * 1024.0;
double mib(double bytes) { return bytes / kMiB; }

TEST(BucketPlan, LargeCapIsOneBucketOfEveryTrainableTensor) {
  EXPECT_EQ(plan_buckets(toy_spans(), 4, 1000), (Plan{{4, 31}}));
}

TEST(BucketPlan, CapBelowTheSmallestTensorIsOneBucketPerTensorInReverseOrder) {
  EXPECT_EQ(plan_buckets(toy_spans(), 4, mib(3)), (Plan{{30, 31}, {26, 30}, {20, 26}, {4, 20}}));
}

TEST(BucketPlan, PacksFromTheEndUpToTheCap) {
  // c+a+q = 44 B fit in 44 B; w (64 B) is larger than the cap: a bucket of its own.
  EXPECT_EQ(plan_buckets(toy_spans(), 4, mib(44)), (Plan{{20, 31}, {4, 20}}));
  // c+a = 20 B; q would make 44 B > 20 B, and alone is larger than the cap.
  EXPECT_EQ(plan_buckets(toy_spans(), 4, mib(20)), (Plan{{26, 31}, {20, 26}, {4, 20}}));
  // One byte less and a no longer joins c.
  EXPECT_EQ(plan_buckets(toy_spans(), 4, mib(19)), (Plan{{30, 31}, {26, 30}, {20, 26}, {4, 20}}));
  // The element size counts: in fp64 the 20 elements of c+a+q need 88 B.
  EXPECT_EQ(plan_buckets(toy_spans(), 8, mib(44)), (Plan{{26, 31}, {20, 26}, {4, 20}}));
}

TEST(BucketPlan, CapIsInMebibytesAsPyTorch) {
  // Two tensors of 0.5 MiB fill a 1 MiB bucket; with 1 MB (1e6 B) they would not fit.
  const int64_t half = 131072;  // fp32 elements in 0.5 MiB
  const std::vector<ParamSpan> spans = {{"x", 0, half}, {"y", half, 2 * half}};
  EXPECT_EQ(plan_buckets(spans, 4, 1.0), (Plan{{0, 2 * half}}));
  EXPECT_EQ(plan_buckets(spans, 4, 0.999), (Plan{{half, 2 * half}, {0, half}}));
}

TEST(BucketPlan, FrozenTensorsAndGapsEndABucket) {
  // t1 frozen between t0 and t2; a gap between t2 and t3 (elements no tensor owns).
  const std::vector<ParamSpan> spans = {{"t0", 0, 5}, {"t1", 5, 8, false}, {"t2", 8, 10}, {"t3", 12, 15}};
  EXPECT_EQ(plan_buckets(spans, 4, 1000), (Plan{{12, 15}, {8, 10}, {0, 5}}));
  EXPECT_EQ(plan_per_tensor(spans), (Plan{{12, 15}, {8, 10}, {0, 5}}));
  EXPECT_EQ(plan_flat(spans), (Plan{{0, 15}}));  // flat covers the frozen tensor and the gap
}

TEST(BucketPlan, InputOrderDoesNotMatter) {
  std::vector<ParamSpan> spans = toy_spans();
  std::reverse(spans.begin(), spans.end());
  std::swap(spans[1], spans[3]);
  EXPECT_EQ(plan_buckets(spans, 4, mib(44)), plan_buckets(toy_spans(), 4, mib(44)));
  EXPECT_EQ(plan_per_tensor(spans), plan_per_tensor(toy_spans()));
}

TEST(BucketPlan, FlatAndPerTensorPlans) {
  EXPECT_EQ(plan_per_tensor(toy_spans()), (Plan{{30, 31}, {26, 30}, {20, 26}, {4, 20}}));
  EXPECT_EQ(plan_flat(toy_spans()), (Plan{{4, 31}}));  // the frozen tensor at the start is outside
  std::vector<ParamSpan> all_frozen = toy_spans();
  for (ParamSpan& p : all_frozen) p.trainable = false;
  EXPECT_TRUE(plan_flat(all_frozen).empty());
  EXPECT_TRUE(plan_buckets(all_frozen, 4, 25).empty());
}

TEST(BucketPlan, RejectsANonPositiveCap) {
  for (double mb : {0.0, -1.0}) {
    try {
      plan_buckets(toy_spans(), 4, mb);
      ADD_FAILURE() << "no error for bucket_mb " << mb;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("bucket_mb"), std::string::npos) << e.what();
    }
  }
}

// The model's layout at several caps: buckets tile the buffer from its end, start and end at
// tensor boundaries, stay within the cap unless they are one tensor, and are full (the next
// tensor would not have fit).
TEST(BucketPlan, TransformerLayoutIsTiledFromTheEnd) {
  ModelConfig c;
  c.vocab_size = 64, c.d_model = 32, c.d_ff = 64, c.num_layers = 3, c.num_heads = 4;
  const ParameterLayout layout(c);
  const std::vector<ParamSpan> spans = param_spans(layout);
  ASSERT_EQ(spans.size(), layout.params().size());
  std::vector<int64_t> boundaries;
  int64_t next = 0;
  for (const ParamSpan& s : spans) {  // contiguous, covering the buffer, all trainable
    EXPECT_EQ(s.begin, next) << s.name;
    EXPECT_TRUE(s.trainable);
    boundaries.push_back(s.begin);
    next = s.end;
  }
  EXPECT_EQ(next, layout.total());
  auto tensor_starting_at = [&](int64_t offset) {
    return std::find(boundaries.begin(), boundaries.end(), offset) - boundaries.begin();
  };
  for (double kb : {1.0, 8.0, 40.0, 100.0}) {
    const int64_t cap = int64_t(kb * 1024);
    const Plan plan = plan_buckets(spans, 4, mib(double(cap)));
    int64_t end = layout.total();
    for (size_t i = 0; i < plan.size(); ++i) {
      const FlatRange& b = plan[i];
      const size_t first = size_t(tensor_starting_at(b.begin));
      ASSERT_LT(first, spans.size()) << "bucket " << i << " starts inside a tensor";
      EXPECT_EQ(b.end, end) << "bucket " << i << " at cap " << cap;
      const bool one_tensor = spans[first].end == b.end;
      EXPECT_TRUE(b.size() * 4 <= cap || one_tensor) << "bucket " << i << " over the cap " << cap;
      if (first > 0) EXPECT_GT((b.size() + spans[first - 1].end - spans[first - 1].begin) * 4, cap) << "not full";
      end = b.begin;
    }
    EXPECT_EQ(end, 0);
  }
}

// --grad-dtype bf16: buckets hold --bucket-mb of gradient bytes, twice fp32's elements, and
// gradients made in bf16 are not cast for the wire again; only bf16 training makes them.
TEST(BucketPlan, Bf16GradientsFillBucketsWithTheirOwnBytes) {
  ModelConfig c;
  c.vocab_size = 64, c.d_model = 32, c.d_ff = 64, c.num_layers = 3, c.num_heads = 4;
  const auto plan = [&](GradientDType grads, double kib, bool reduce_in_bf16 = false) {
    return data_parallel_plan(SyncStrategy::Bucketed, Sharding::None, ParameterLayout(c), Precision::BF16, grads,
                              kib / 1024, 2, kShardAlignment, reduce_in_bf16);
  };
  for (double kib : {8.0, 20.0}) {
    const SyncPlan bf16 = plan(GradientDType::BF16, kib), fp32 = plan(GradientDType::Master, 2 * kib);
    EXPECT_GT(bf16.buckets.size(), 2u) << kib << " KiB";
    EXPECT_EQ(bf16.buckets, fp32.buckets) << kib << " KiB of bf16 against twice that of fp32";
    EXPECT_NE(bf16.buckets, plan(GradientDType::Master, kib).buckets) << kib << " KiB";
  }
  EXPECT_TRUE(plan(GradientDType::Master, 8, true).reduce_in_bf16);
  EXPECT_FALSE(plan(GradientDType::BF16, 8, true).reduce_in_bf16) << "bf16 gradients cast again";
  EXPECT_THROW(data_parallel_plan(SyncStrategy::Bucketed, Sharding::None, ParameterLayout(c), Precision::FP32,
                                  GradientDType::BF16, 1, 2),
               UsageError);
}

TEST(SyncStrategy, NamesRoundTripAndErrorsListTheChoices) {
  for (SyncStrategy s : all_sync_strategies()) EXPECT_EQ(parse_sync_strategy(sync_strategy_name(s)), s);
  try {
    parse_sync_strategy("ring");
    ADD_FAILURE() << "no error for 'ring'";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "ddp 'ring': must be one of none, naive, flat, overlap, bucketed");
  }
}

// ---- Optimizer shards ----------------------------------------------------------------------------

TEST(ShardPlan, PartsAreBalancedAlignedAndDisjoint) {
  const FlatRange group{1000, 1000 + 10007};
  for (int parts : {1, 2, 3, 4, 7}) {
    int64_t next = group.begin;
    for (int r = 0; r < parts; ++r) {
      const FlatRange p = shard_part(group, r, parts);
      EXPECT_EQ(p.begin, next) << "parts tile the group";
      EXPECT_EQ((p.begin - group.begin) % kShardAlignment, 0) << "part " << r << " of " << parts;
      EXPECT_LT(std::abs(double(p.size()) - double(group.size()) / parts), double(kShardAlignment));
      next = p.end;
    }
    EXPECT_EQ(next, group.end);
  }
  // Exactly equal when the size is a multiple of parts x alignment; empty parts when tiny.
  EXPECT_EQ(shard_part({0, 3 * 128}, 1, 3, 128), (FlatRange{128, 256}));
  EXPECT_EQ(shard_part({0, 100}, 0, 4), (FlatRange{0, 0}));
  EXPECT_EQ(shard_part({0, 100}, 3, 4), (FlatRange{64, 100}));
}

// For one plan: each element of [0, flat_elements) (or of [0, parameters) for broadcast) is
// owned by exactly one rank, and each rank owns its share within one alignment unit.
void expect_owned_once(const SyncPlan& plan) {
  const int64_t covered = plan.sharding == Sharding::Zero1 ? plan.flat_elements : plan.parameters;
  std::vector<int> owners(size_t(plan.flat_elements), 0);
  for (int r = 0; r < plan.ranks; ++r) {
    int64_t mine = 0;
    for (const FlatRange& o : plan.owned(r)) {
      for (int64_t i = o.begin; i < o.end; ++i) ++owners[size_t(i)];
      mine += o.size();
    }
    EXPECT_LT(std::abs(double(mine) - double(covered) / plan.ranks), double(kShardAlignment)) << "rank " << r;
    if (plan.sharding == Sharding::Zero1) EXPECT_EQ(mine * plan.ranks, plan.flat_elements) << "equal parts";
  }
  for (int64_t i = 0; i < plan.flat_elements; ++i)
    ASSERT_EQ(owners[size_t(i)], i < covered ? 1 : 0) << "element " << i << " of " << sharding_name(plan.sharding);
}

// ZeRO-1 on the model's layout, every strategy and rank count: the buffer is padded by less
// than one granule to a multiple of it; buckets tile it from the end, each divisible into
// aligned equal parts; and re-cutting delays next to nothing: when one of the strategy's
// ranges is complete, all but less than one granule of it is in complete buckets.
TEST(ShardPlan, Zero1BucketsDivideAmongTheRanksAndWaitNoLonger) {
  ModelConfig c;
  c.vocab_size = 64, c.d_model = 32, c.d_ff = 64, c.num_layers = 3, c.num_heads = 4;
  const std::vector<ParamSpan> spans = param_spans(ParameterLayout(c));
  const int64_t total = ParameterLayout(c).total();
  for (int ranks : {1, 2, 3, 4})
    for (SyncStrategy s : {SyncStrategy::Naive, SyncStrategy::Flat, SyncStrategy::Overlap, SyncStrategy::Bucketed})
      for (double mb : {mib(1), mib(8 * 1024), 1000.0}) {
        const SyncPlan plan = plan_sync(s, Sharding::Zero1, spans, 4, mb, ranks);
        const SyncPlan plain = plan_sync(s, Sharding::None, spans, 4, mb, ranks);
        const int64_t granule = ranks * kShardAlignment;
        EXPECT_EQ(plan.parameters, total);
        EXPECT_EQ(plan.flat_elements % granule, 0);
        EXPECT_LT(plan.flat_elements - total, granule);
        EXPECT_GE(plan.flat_elements, total);
        EXPECT_EQ(plan.buckets, plan.shard_groups);
        EXPECT_EQ(plan.when_ready, plain.when_ready);
        int64_t end = plan.flat_elements;
        for (const FlatRange& b : plan.buckets) {
          EXPECT_EQ(b.end, end);
          EXPECT_GT(b.size(), 0);
          EXPECT_EQ(b.begin % granule, 0);
          end = b.begin;
        }
        EXPECT_EQ(end, 0);
        // When element x is final: the issue position of the strategy's range holding it
        // (backward finishes them in that order); the padding is final from the start.
        auto final_at = [&](int64_t x) {
          for (size_t k = 0; k < plain.buckets.size(); ++k)
            if (plain.buckets[k].begin <= x && x < plain.buckets[k].end) return int(k);
          return -1;
        };
        std::vector<int> bucket_final(plan.buckets.size(), -1);  // a ZeRO-1 bucket: when its last element is
        for (size_t z = 0; z < plan.buckets.size(); ++z)
          for (int64_t x = plan.buckets[z].begin; x < plan.buckets[z].end; ++x)
            bucket_final[z] = std::max(bucket_final[z], final_at(x));
        for (size_t k = 0; k < plain.buckets.size(); ++k) {
          int64_t delayed = 0;  // elements of range k whose ZeRO-1 bucket completes after it
          for (size_t z = 0; z < plan.buckets.size(); ++z) {
            const int64_t overlap = std::min(plan.buckets[z].end, plain.buckets[k].end) -
                                    std::max(plan.buckets[z].begin, plain.buckets[k].begin);
            if (overlap > 0 && bucket_final[z] > int(k)) delayed += overlap;
          }
          EXPECT_LT(delayed, granule) << sync_strategy_name(s) << " on " << ranks << " ranks, range " << k;
        }
        expect_owned_once(plan);
      }
}

TEST(ShardPlan, BroadcastOwnsOneBalancedRangeOfTheParametersPerRank) {
  const std::vector<ParamSpan> spans = {{"a", 0, 300}, {"b", 300, 700}, {"c", 700, 1001}};
  for (int ranks : {1, 2, 3, 4}) {
    const SyncPlan plan = plan_sync(SyncStrategy::Bucketed, Sharding::Broadcast, spans, 4, 25, ranks);
    EXPECT_EQ(plan.flat_elements, 1001) << "no padding";
    EXPECT_EQ(plan.buckets, (Plan{{0, 1001}})) << "the strategy's own reduction";
    EXPECT_EQ(plan.shard_groups, (Plan{{0, 1001}}));
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(plan.owned(r).size(), 1u);
    expect_owned_once(plan);
  }
  const SyncPlan none = plan_sync(SyncStrategy::Flat, Sharding::None, spans, 4, 25, 3);
  EXPECT_EQ(none.owned(2), (Plan{{0, 1001}})) << "unsharded: every rank owns everything";
}

TEST(ShardPlan, NamesRoundTripAndShardingNeedsReducedGradients) {
  for (Sharding s : all_shardings()) EXPECT_EQ(parse_sharding(sharding_name(s)), s);
  try {
    parse_sharding("zero4");
    ADD_FAILURE() << "no error for 'zero4'";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "shard-optimizer 'zero4': must be one of none, broadcast, zero1, zero2, zero3");
  }
  for (Sharding s : {Sharding::Broadcast, Sharding::Zero1}) {
    try {
      plan_sync(SyncStrategy::None, s, toy_spans(), 4, 25, 2);
      ADD_FAILURE() << "no error for --ddp none with " << sharding_name(s);
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("needs the gradients reduced"), std::string::npos) << e.what();
    }
  }
}

// ZeRO-2/3's layout (src/dist/unit_shards.h): every parameter element held by exactly one rank,
// each unit's lanes cut into equal aligned parts, the shards equally long; and their plan is one
// reduction per unit, refused under a strategy other than bucketed.
TEST(ShardLayout, EveryElementHasOneOwnerAndPartsAreAligned) {
  for (const ModelConfig& config :
       {ModelConfig{"custom", 64, 8, 32, 64, 2, 4}, ModelConfig{"custom", 97, 8, 24, 40, 3, 3}})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const ParameterLayout layout(config);
      const ShardLayout shards(layout, ranks, kShardAlignment);
      std::vector<int> owners(size_t(layout.total()), 0);
      for (int r = 0; r < ranks; ++r)
        for (const ShardLayout::Piece& p : shards.pieces(layout, r)) {
          ASSERT_TRUE(p.shard >= 0 && p.shard + p.count <= shards.shard_elements) << "a piece outside the shard";
          for (int64_t i = 0; i < p.count; ++i) ++owners[size_t(p.flat + i)];
        }
      EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), layout.total()) << ranks << " ranks: one owner each";
      ASSERT_EQ(shards.units.size(), layout.units().size());
      for (size_t u = 0; u < shards.units.size(); ++u)
        for (Lane l : {Lane::Matrices, Lane::Others}) {
          const ShardLayout::Lane& lane = shards.lane(u, l);
          EXPECT_EQ(lane.part % kShardAlignment, 0);
          EXPECT_GE(lane.part * ranks, lane.elements);
          EXPECT_LT(lane.part * ranks - lane.elements, ranks * kShardAlignment) << "at most one alignment unit a rank";
        }
      const SyncPlan plan = unit_plan(layout, SyncStrategy::Bucketed, Sharding::Zero3, ranks);
      EXPECT_EQ(plan.buckets.size(), layout.units().size());
      EXPECT_EQ(plan.buckets.front(), layout.units().back().range) << "backward's order: the head first";
    }
  EXPECT_THROW(
      unit_plan(ParameterLayout(ModelConfig{"custom", 64, 8, 32, 64, 2, 4}), SyncStrategy::Overlap, Sharding::Zero2, 2),
      UsageError);
}

// ---- When each strategy communicates ----------------------------------------------------------

// One rank (`rank` of `size`) that records its collectives (kind, offsets into the gradient or
// parameter buffer, count, op, root) instead of communicating; handles record when they are
// waited for. Every call must be in place, in the layout of comm/communicator.h.
class RecordingComm final : public Communicator {
 public:
  struct Call {
    Collective kind;
    bool on_params;        // else on the gradients
    int64_t begin, count;  // the offset of the whole buffer the call covers; the per-rank count
    ReduceOp op;
    bool blocking;
    int root;
    DType dtype = DType::F32;  // BF16: a call on the bf16 copy (begin: its offset there), or in a wire
    bool in_bf16 = false;      // fp32 gradients through a bf16 wire (src/dist/bf16_wire.h)
  };
  RecordingComm(const float* grads, const float* params = nullptr, int rank = 0, int size = 1,
                const uint16_t* copy = nullptr)
      : grads_(grads), params_(params), copy_(copy), rank_(rank), size_(size) {}
  std::vector<Call> calls;
  int waits = 0, groups = 0, enqueued = 0;
  std::vector<size_t> waited;  // the index in `calls` of each call waited for, in order

  std::string backend_name() const override { return "recording"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return false; }
  bool stream_ordered() const override { return false; }
  CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    EXPECT_EQ(send, recv) << "gradients are reduced in place";
    return record({Collective::AllReduce, false, 0, int64_t(count), op, false, -1}, send, dtype);
  }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    EXPECT_EQ(send, recv) << "gradients are reduced in place";
    record({Collective::AllReduce, false, 0, int64_t(count), op, true, -1}, send, dtype);
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    EXPECT_EQ(recv, static_cast<const char*>(send) + rank_ * count * dtype_size(dtype)) << "reduce-scatter in place";
    return record({Collective::ReduceScatter, false, 0, int64_t(count), op, false, -1}, send, dtype);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    EXPECT_EQ(recv, static_cast<const char*>(send) + rank_ * count * dtype_size(dtype)) << "reduce-scatter in place";
    record({Collective::ReduceScatter, false, 0, int64_t(count), op, true, -1}, send, dtype);
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    EXPECT_EQ(send, static_cast<const char*>(recv) + rank_ * count * dtype_size(dtype)) << "all-gather in place";
    return record({Collective::AllGather, true, 0, int64_t(count), ReduceOp::Sum, false, -1}, recv, dtype);
  }
  CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) override {
    EXPECT_EQ(send, recv) << "broadcast in place";
    return record({Collective::Broadcast, true, 0, int64_t(count), ReduceOp::Sum, false, root}, recv, dtype);
  }
  CommHandle all_to_all_async(const void*, void*, size_t, DType) override {
    ADD_FAILURE() << "no all-to-all in a data-parallel sync";
    return {};
  }
  void group_start() override { ++groups; }
  void group_end() override {}
  // The work runs now (a wire's casts on the host); waiting for it waits for the call before it.
  CommHandle enqueue_async(const std::function<void(void* stream)>& work) override {
    work(nullptr);
    ++enqueued;
    return CommHandle(std::make_unique<Wait>(*this, calls.size() - 1));
  }
  void barrier() override {}
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer(int n) override { return make_host_timer(n); }

 private:
  struct Wait final : PendingOp {
    Wait(RecordingComm& c, size_t i) : comm(c), index(i) {}
    void wait() override {
      ++comm.waits;
      comm.waited.push_back(index);
    }
    RecordingComm& comm;
    size_t index;
  };
  CommHandle record(Call call, const void* buffer, DType dtype) {
    EXPECT_TRUE(dtype == DType::F32 || dtype == DType::BF16);
    call.dtype = dtype;
    call.in_bf16 = dtype == DType::BF16 && !call.on_params;
    if (call.in_bf16)  // the wire: the gradients hold their offsets, so its first value is the range's
      call.begin = int64_t(bf16_bits_to_float(*static_cast<const uint16_t*>(buffer)));
    else if (dtype == DType::BF16) {
      EXPECT_NE(copy_, nullptr) << "bf16 parameters are the copy's";
      call.begin = static_cast<const uint16_t*>(buffer) - copy_;
    } else {
      call.begin = static_cast<const float*>(buffer) - (call.on_params ? params_ : grads_);
    }
    calls.push_back(call);
    return CommHandle(std::make_unique<Wait>(*this, calls.size() - 1));
  }
  const float *grads_, *params_;
  const uint16_t* copy_;
  int rank_, size_;
};

// `in_bf16`: the gradients travel as bf16, the wire from a host allocator.
SyncPlan toy_plan(SyncStrategy s, double bucket_mb, bool in_bf16) {
  SyncPlan plan = plan_sync(s, Sharding::None, toy_spans(), 4, bucket_mb, 1);
  plan.reduce_in_bf16 = in_bf16;
  return plan;
}

// The gradients hold their offsets (exact in bf16), which is how a call in a wire is placed.
std::vector<float> offsets(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

struct SyncFixture {
  std::vector<float> grads = offsets(31);
  Tensor tensor{grads.data(), DType::F32, {31}};
  RecordingComm comm{grads.data()};
  HostAllocator host{1 << 20};
  std::unique_ptr<GradientSync> sync;
  SyncFixture(SyncStrategy s, double bucket_mb, bool in_bf16 = false)
      : sync(make_gradient_sync(toy_plan(s, bucket_mb, in_bf16), comm, tensor, Tensor(), {}, {&host, false})) {}
  std::vector<int64_t> issued_begins() const {
    std::vector<int64_t> b;
    for (const auto& c : comm.calls) b.push_back(c.begin);
    return b;
  }
};

TEST(GradientSync, BucketIsIssuedWhenItsLastElementIsReportedInAnyOrder) {
  SyncFixture f(SyncStrategy::Bucketed, mib(44));  // buckets [20,31) and [4,20)
  f.sync->begin_step();
  f.sync->gradients_final(8, 24);   // part of both buckets
  f.sync->gradients_final(28, 31);  // more of the first
  EXPECT_TRUE(f.comm.calls.empty());
  f.sync->gradients_final(4, 8);  // completes [4,20), straddling nothing else
  EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{4}));
  f.sync->gradients_final(24, 28);  // completes [20,31)
  EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{4, 20}));
  EXPECT_EQ(f.comm.calls[1].count, 11);
  f.sync->finish();
  EXPECT_EQ(f.comm.calls.size(), 2u);  // nothing left for finish()
  EXPECT_EQ(f.comm.waits, 2);
  for (const auto& c : f.comm.calls) {
    EXPECT_EQ(c.op, ReduceOp::Average);
    EXPECT_FALSE(c.blocking);
  }
  EXPECT_EQ(f.sync->stats().collectives, 2);
  EXPECT_EQ(f.sync->stats().issued_in_finish, 0);
  EXPECT_EQ(f.sync->stats().bytes, 27 * 4);
  EXPECT_EQ(f.sync->stats().buckets, 2);
}

TEST(GradientSync, FinishIssuesWhatBackwardNeverCompletedAndBeginStepStartsOver) {
  SyncFixture f(SyncStrategy::Overlap, 25);
  for (int step = 0; step < 2; ++step) {
    f.comm.calls.clear();
    f.sync->begin_step();
    f.sync->gradients_final(26, 31);  // a and c: two tensors in one range
    f.sync->gradients_final(12, 20);  // half of w
    EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{26, 30})) << "step " << step;
    f.sync->gradients_final(4, 12);  // the other half
    EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{26, 30, 4}));
    f.sync->finish();  // q [20,26) was never reported
    EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{26, 30, 4, 20}));
    EXPECT_EQ(f.sync->stats().collectives, 4);
    EXPECT_EQ(f.sync->stats().issued_in_finish, 1);
  }
}

TEST(GradientSync, NaiveAndFlatCommunicateAfterBackwardOnly) {
  for (SyncStrategy s : {SyncStrategy::Naive, SyncStrategy::Flat, SyncStrategy::None}) {
    SyncFixture f(s, 25);
    f.sync->begin_step();
    f.sync->gradients_final(4, 31);
    EXPECT_TRUE(f.comm.calls.empty()) << sync_strategy_name(s);
    f.sync->finish();
    const std::vector<int64_t> want = s == SyncStrategy::Naive  ? std::vector<int64_t>{30, 26, 20, 4}
                                      : s == SyncStrategy::Flat ? std::vector<int64_t>{4}
                                                                : std::vector<int64_t>{};
    EXPECT_EQ(f.issued_begins(), want) << sync_strategy_name(s);
    for (const auto& c : f.comm.calls) EXPECT_TRUE(c.blocking);
    EXPECT_EQ(f.sync->stats().bytes, s == SyncStrategy::None ? 0 : 27 * 4);
    EXPECT_EQ(f.sync->stats().issued_in_finish, int64_t(want.size()));
    EXPECT_EQ(f.sync->strategy(), s);
  }
}

// --grad-reduce-dtype bf16: the same collectives over the same ranges at the same moments, each
// through the wire, with half the bytes.
TEST(GradientSync, Bf16GradientsTakeTheSameRangesWithHalfTheBytes) {
  for (SyncStrategy s : {SyncStrategy::Naive, SyncStrategy::Flat, SyncStrategy::Overlap, SyncStrategy::Bucketed}) {
    SyncFixture fp32(s, mib(44)), bf16(s, mib(44), true);
    for (SyncFixture* f : {&fp32, &bf16}) {
      f->sync->begin_step();
      f->sync->gradients_final(26, 31);
      f->sync->gradients_final(4, 26);
      f->sync->finish();
    }
    EXPECT_EQ(bf16.issued_begins(), fp32.issued_begins()) << sync_strategy_name(s);
    ASSERT_EQ(bf16.comm.calls.size(), fp32.comm.calls.size());
    for (size_t k = 0; k < bf16.comm.calls.size(); ++k) {
      EXPECT_TRUE(bf16.comm.calls[k].in_bf16 && !fp32.comm.calls[k].in_bf16) << sync_strategy_name(s);
      EXPECT_EQ(bf16.comm.calls[k].count, fp32.comm.calls[k].count);
      EXPECT_EQ(bf16.comm.calls[k].op, ReduceOp::Average);
    }
    EXPECT_EQ(bf16.comm.waits, int(bf16.comm.calls.size())) << "each waited for by finish()";
    EXPECT_EQ(bf16.comm.enqueued, 2 * int(bf16.comm.calls.size())) << "cast there and back";
    EXPECT_EQ(bf16.grads, offsets(31)) << "the casts of values bf16 holds give them back";
    EXPECT_EQ(bf16.sync->stats().bytes * 2, fp32.sync->stats().bytes) << sync_strategy_name(s);
    EXPECT_EQ(bf16.sync->stats().bus_bytes * 2, fp32.sync->stats().bus_bytes) << sync_strategy_name(s);
  }
}

// ---- What a sharded optimizer communicates ------------------------------------------------------

// Rank 1 of 2 under zero1 with overlap: tensors a [0,300), b [300,700), c [700,1000) become
// buckets [768,1024), [384,768), [0,384) (cuts rounded up to 128); each is reduce-scattered
// (rank 1's part lands at its second half) once backward reported its real elements, and
// all-gathered as soon as the optimizer reports rank 1's part of it, in forward order; the
// all-gathers are waited for only when a range of parameters in their bucket is asked for.
struct ShardFixture {
  SyncPlan plan;
  std::vector<float> grads, params;
  RecordingComm comm;
  std::unique_ptr<GradientSync> sync;
  ShardFixture(SyncStrategy strategy, Sharding sharding, int rank, int size)
      : plan(plan_sync(strategy, sharding, {{"a", 0, 300}, {"b", 300, 700}, {"c", 700, 1000}}, 4, 25, size)),
        grads(size_t(plan.flat_elements)), params(grads.size()), comm(grads.data(), params.data(), rank, size),
        sync(make_gradient_sync(plan, comm, Tensor{grads.data(), DType::F32, {plan.flat_elements}},
                                Tensor{params.data(), DType::F32, {plan.flat_elements}})) {}
  // The offsets of the calls waited for since call `first`.
  std::vector<int64_t> waited_begins(size_t first) const {
    std::vector<int64_t> b;
    for (size_t i : comm.waited)
      if (i >= first) b.push_back(comm.calls[i].begin);
    return b;
  }
};

TEST(ShardedSync, Zero1ReduceScattersAsBackwardFinishesAndAllGathersAsTheOptimizerDoes) {
  ShardFixture f(SyncStrategy::Overlap, Sharding::Zero1, 1, 2);
  ASSERT_EQ(f.plan.flat_elements, 1024);
  ASSERT_EQ(f.plan.buckets, (Plan{{768, 1024}, {384, 768}, {0, 384}}));
  EXPECT_EQ(f.plan.owned(1), (Plan{{192, 384}, {576, 768}, {896, 1024}})) << "forward order";
  for (int step = 0; step < 2; ++step) {
    f.comm.calls.clear();
    f.comm.waited.clear();
    f.sync->begin_step();
    EXPECT_TRUE(f.comm.waited.empty()) << "everything arrived during the last step's forward";
    f.sync->gradients_final(700, 1000);  // c: all of [768,1024) but the padding
    ASSERT_EQ(f.comm.calls.size(), 1u);
    EXPECT_EQ(f.comm.calls[0].kind, Collective::ReduceScatter);
    EXPECT_EQ(f.comm.calls[0].begin, 768);
    EXPECT_EQ(f.comm.calls[0].count, 128);
    EXPECT_EQ(f.comm.calls[0].op, ReduceOp::Average);
    f.sync->gradients_final(0, 700);  // a and b
    f.sync->finish();
    ASSERT_EQ(f.comm.calls.size(), 3u);
    EXPECT_EQ(f.sync->stats().issued_in_finish, 0);
    // The optimizer's first two ranges: their buckets' all-gathers start at once, in forward order.
    f.sync->parameters_updated(192, 384);
    f.sync->parameters_updated(576, 768);
    ASSERT_EQ(f.comm.calls.size(), 5u);
    EXPECT_EQ(f.comm.calls[3].kind, Collective::AllGather);
    EXPECT_EQ(f.comm.calls[3].begin, 0);
    EXPECT_EQ(f.comm.calls[3].count, 192);
    EXPECT_EQ(f.comm.calls[4].begin, 384);
    EXPECT_TRUE(f.sync->finish_parameters()) << "the parameters changed: the bf16 copy needs a refresh";
    ASSERT_EQ(f.comm.calls.size(), 6u) << "the unreported last bucket is shared by finish_parameters";
    EXPECT_EQ(f.comm.calls[5].begin, 768);
    EXPECT_TRUE(f.waited_begins(3).empty()) << "finish_parameters waits for no all-gather";
    // The next forward asks range by range: only the buckets a range overlaps are waited for.
    f.sync->parameters_needed(0, 300);
    EXPECT_EQ(f.waited_begins(3), (std::vector<int64_t>{0}));
    f.sync->parameters_needed(300, 700);  // [0,384) again, and [384,768)
    EXPECT_EQ(f.waited_begins(3), (std::vector<int64_t>{0, 384}));
    if (step == 0) {
      f.sync->parameters_needed(700, 1000);
      EXPECT_EQ(f.waited_begins(3), (std::vector<int64_t>{0, 384, 768}));
    }  // step 1: the next begin_step() waits for what was never asked for
    const SyncStats st = f.sync->stats();
    EXPECT_EQ(st.collectives, 3);
    EXPECT_EQ(st.param_collectives, 3);
    EXPECT_EQ(st.bytes, 1024 * 4);
    EXPECT_EQ(st.param_bytes, 1024 * 4);
    EXPECT_EQ(st.bus_bytes, 1024 * 4) << "(n-1)/n of the buffer each way: one all-reduce's worth";
  }
  f.comm.waited.clear();
  f.sync->begin_step();
  EXPECT_EQ(f.waited_begins(0), (std::vector<int64_t>{768})) << "begin_step waits for what is left";
}

// The ranks must issue their all-gathers in the same order whatever they own: a rank that owns
// nothing of the first buckets in forward order shares them before its own.
// --share-weights bf16, rank 1 of 2 under zero1 (the buckets above), the full-precision
// ranges [100,110) and [650,800): each bucket's bf16 copy all-gathered, and in the same group
// the masters of the full-precision pieces, each broadcast by the owner of the part it lies
// in; the other masters are all-gathered (fp32, in forward order) only when asked for.
TEST(ShardedSync, SharingTheBf16CopySendsTheMastersOfFullPrecisionRangesOnly) {
  const SyncPlan plan =
      plan_sync(SyncStrategy::Overlap, Sharding::Zero1, {{"a", 0, 300}, {"b", 300, 700}, {"c", 700, 1000}}, 4, 25, 2);
  std::vector<float> grads(size_t(plan.flat_elements)), params(grads.size());
  std::vector<uint16_t> copy(grads.size());
  RecordingComm comm(grads.data(), params.data(), 1, 2, copy.data());
  const std::unique_ptr<GradientSync> sync =
      make_gradient_sync(plan, comm, Tensor{grads.data(), DType::F32, {plan.flat_elements}},
                         Tensor{params.data(), DType::F32, {plan.flat_elements}},
                         {Tensor{copy.data(), DType::BF16, {plan.flat_elements}}, {{100, 110}, {650, 800}}});
  EXPECT_TRUE(sync->shares_compute_copy());
  sync->begin_step();
  sync->gradients_final(0, 1000);
  sync->finish();
  ASSERT_EQ(comm.calls.size(), 3u) << "the reduce-scatters";
  for (const FlatRange& r : plan.owned(1)) sync->parameters_updated(r.begin, r.end);
  EXPECT_TRUE(sync->finish_parameters());
  struct Want {
    Collective kind;
    DType dtype;
    int64_t begin, count;
    int root;
  };
  const std::vector<Want> want = {
      {Collective::AllGather, DType::BF16, 0, 192, -1},   {Collective::Broadcast, DType::F32, 100, 10, 0},
      {Collective::AllGather, DType::BF16, 384, 192, -1}, {Collective::Broadcast, DType::F32, 650, 118, 1},
      {Collective::AllGather, DType::BF16, 768, 128, -1}, {Collective::Broadcast, DType::F32, 768, 32, 0}};
  ASSERT_EQ(comm.calls.size(), 3 + want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const RecordingComm::Call& got = comm.calls[3 + i];
    EXPECT_EQ(got.kind, want[i].kind) << i;
    EXPECT_EQ(got.dtype, want[i].dtype) << i;
    EXPECT_EQ(got.begin, want[i].begin) << i;
    EXPECT_EQ(got.count, want[i].count) << i;
    if (want[i].kind == Collective::Broadcast) EXPECT_EQ(got.root, want[i].root) << i;
  }
  EXPECT_EQ(sync->stats().param_bytes, 1024 * 2 + (10 + 118 + 32) * 4);
  EXPECT_EQ(sync->stats().param_collectives, 6);
  EXPECT_EQ(*std::max_element(comm.waited.begin(), comm.waited.end()), 2u) << "finish waited for the gradients only";

  sync->masters_needed();  // every master, as a checkpoint reads them
  ASSERT_EQ(comm.calls.size(), 12u);
  for (size_t i = 9; i < 12; ++i) {
    EXPECT_EQ(comm.calls[i].kind, Collective::AllGather);
    EXPECT_EQ(comm.calls[i].dtype, DType::F32);
  }
  EXPECT_EQ(comm.calls[9].begin, 0);
  EXPECT_EQ(comm.calls[10].begin, 384);
  EXPECT_EQ(comm.calls[11].begin, 768);
  std::vector<size_t> waited;
  for (size_t i : comm.waited)
    if (i >= 3) waited.push_back(i);
  std::sort(waited.begin(), waited.end());
  EXPECT_EQ(waited, (std::vector<size_t>{3, 4, 5, 6, 7, 8, 9, 10, 11})) << "what arrived, then the masters";
  EXPECT_EQ(sync->stats().param_bytes, 1024 * 2 + (10 + 118 + 32) * 4) << "not a step's traffic";
}

TEST(ShardedSync, Zero1SharesEveryEarlierBucketFirst) {
  ShardFixture f(SyncStrategy::Overlap, Sharding::Zero1, 0, 2);
  f.sync->begin_step();
  f.sync->gradients_final(0, 1000);
  f.sync->finish();
  const size_t first = f.comm.calls.size();
  f.sync->parameters_updated(f.plan.owned(0)[2].begin, f.plan.owned(0)[2].end);  // its last range only
  std::vector<int64_t> gathered;
  for (size_t i = first; i < f.comm.calls.size(); ++i) gathered.push_back(f.comm.calls[i].begin);
  EXPECT_EQ(gathered, (std::vector<int64_t>{0, 384, 768}));
  EXPECT_TRUE(f.sync->finish_parameters());
  EXPECT_EQ(f.comm.calls.size(), first + 3) << "nothing left to share";
}

// Hybrid zero1: rank 1 of a group of 2 (the buckets above), its parts averaged over 2 groups.
// A bucket's average waits for its reduce-scatter once the next bucket is issued, never at once:
// waiting for the reduce-scatter just issued would hold backward until every bucket is reduced.
TEST(ShardedSync, HybridZero1AveragesEachBucketOnceTheNextIsIssued) {
  const SyncPlan plan =
      plan_sync(SyncStrategy::Overlap, Sharding::Zero1, {{"a", 0, 300}, {"b", 300, 700}, {"c", 700, 1000}}, 4, 25, 2);
  std::vector<float> grads(size_t(plan.flat_elements)), params(grads.size());
  RecordingComm group(grads.data(), params.data(), 1, 2), replicas(grads.data(), params.data(), 0, 2);
  const std::unique_ptr<GradientSync> sync =
      make_gradient_sync(plan, group, Tensor{grads.data(), DType::F32, {plan.flat_elements}},
                         Tensor{params.data(), DType::F32, {plan.flat_elements}}, {}, {}, &replicas);
  for (int step = 0; step < 2; ++step) {
    group.calls.clear();
    group.waited.clear();
    replicas.calls.clear();
    replicas.waited.clear();
    sync->begin_step();
    sync->gradients_final(700, 1000);  // completes [768,1024)
    ASSERT_EQ(group.calls.size(), 1u);
    EXPECT_TRUE(group.waited.empty()) << "backward goes on beside the reduce-scatter";
    EXPECT_TRUE(replicas.calls.empty());
    sync->gradients_final(300, 700);  // completes [384,768)
    ASSERT_EQ(group.calls.size(), 2u);
    EXPECT_EQ(group.waited, (std::vector<size_t>{0})) << "the earlier bucket's reduce-scatter only";
    ASSERT_EQ(replicas.calls.size(), 1u);
    EXPECT_EQ(replicas.calls[0].kind, Collective::AllReduce);
    EXPECT_EQ(replicas.calls[0].begin, 896) << "rank 1's part of [768,1024)";
    EXPECT_EQ(replicas.calls[0].count, 128);
    EXPECT_EQ(replicas.calls[0].op, ReduceOp::Average);
    sync->gradients_final(0, 300);  // completes [0,384)
    EXPECT_EQ(group.waited, (std::vector<size_t>{0, 1}));
    ASSERT_EQ(replicas.calls.size(), 2u);
    EXPECT_EQ(replicas.calls[1].begin, 576);
    sync->finish();
    EXPECT_EQ(group.waited, (std::vector<size_t>{0, 1, 2}));
    ASSERT_EQ(replicas.calls.size(), 3u);
    EXPECT_EQ(replicas.calls[2].begin, 192);
    EXPECT_EQ(replicas.calls[2].count, 192);
    EXPECT_EQ(replicas.waited, (std::vector<size_t>{0, 1, 2})) << "finish waits for every average";
    EXPECT_EQ(sync->stats().collectives, 6);
    EXPECT_EQ(sync->stats().issued_in_finish, 0);
    for (const FlatRange& r : plan.owned(1)) sync->parameters_updated(r.begin, r.end);
    sync->finish_parameters();
    sync->parameters_needed(0, plan.flat_elements);
  }
}

TEST(ShardedSync, BroadcastAllReducesThenEveryOwnerBroadcastsItsRange) {
  ShardFixture f(SyncStrategy::Flat, Sharding::Broadcast, 2, 3);
  ASSERT_EQ(f.plan.flat_elements, 1000);
  f.sync->begin_step();
  f.sync->gradients_final(0, 1000);
  f.sync->finish();
  ASSERT_EQ(f.comm.calls.size(), 1u);
  EXPECT_EQ(f.comm.calls[0].kind, Collective::AllReduce);
  EXPECT_EQ(f.comm.calls[0].count, 1000);
  f.sync->parameters_updated(f.plan.owned(2)[0].begin, f.plan.owned(2)[0].end);
  EXPECT_TRUE(f.sync->finish_parameters());
  ASSERT_EQ(f.comm.calls.size(), 4u);
  EXPECT_EQ(f.comm.groups, 1) << "one group: the owners' broadcasts fused";
  for (int owner = 0; owner < 3; ++owner) {
    const RecordingComm::Call& c = f.comm.calls[size_t(1 + owner)];
    EXPECT_EQ(c.kind, Collective::Broadcast);
    EXPECT_EQ(c.root, owner);
    EXPECT_EQ(c.begin, f.plan.shard(0, owner).begin);
    EXPECT_EQ(c.count, f.plan.shard(0, owner).size());
  }
  EXPECT_EQ(f.comm.waits, 0) << "finish_parameters waits for none of them (flat's all-reduce blocks)";
  f.sync->parameters_needed(0, 1);
  EXPECT_EQ(f.comm.waits, 3) << "one group, the whole model: its first range waits for every broadcast";
  EXPECT_EQ(f.sync->stats().param_bytes, 1000 * 4);
}

TEST(ShardedSync, UnshardedSyncLeavesTheParametersAlone) {
  SyncFixture f(SyncStrategy::Bucketed, 25);
  f.sync->parameters_updated(4, 31);
  EXPECT_FALSE(f.sync->finish_parameters());
  EXPECT_TRUE(f.comm.calls.empty());
}

}  // namespace
}  // namespace llmhpc

// Data-parallel planning and bookkeeping without communication: bucket plans (sizes in MiB,
// reverse parameter order, frozen tensors left out, one bucket per oversized tensor), the
// per-tensor and flat plans, option parsing, and when each strategy issues its all-reduces
// (a recording communicator stands in for the ranks). The results of real collectives are
// tests/mpi/test_ddp.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "src/dist/grad_sync.h"
#include "src/model/params.h"

namespace llmhpc {
namespace {

using Plan = std::vector<GradRange>;

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
      EXPECT_NE(std::string(e.what()).find("--bucket-mb"), std::string::npos) << e.what();
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
      const GradRange& b = plan[i];
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

TEST(SyncStrategy, NamesRoundTripAndErrorsListTheChoices) {
  for (SyncStrategy s : all_sync_strategies()) EXPECT_EQ(parse_sync_strategy(sync_strategy_name(s)), s);
  try {
    parse_sync_strategy("ring");
    ADD_FAILURE() << "no error for 'ring'";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--ddp 'ring': must be one of none, naive, flat, overlap, bucketed");
  }
}

// ---- When each strategy communicates ----------------------------------------------------------

// One rank that records its all-reduces (offset into the buffer, count, op) instead of
// communicating; handles record when they are waited for.
class RecordingComm final : public Communicator {
 public:
  struct Call {
    int64_t begin, count;
    ReduceOp op;
    bool blocking;
  };
  explicit RecordingComm(const float* base) : base_(base) {}
  std::vector<Call> calls;
  int waits = 0;

  std::string backend_name() const override { return "recording"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool device_buffers() const override { return false; }
  bool stream_ordered() const override { return false; }
  CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    record(send, recv, count, dtype, op, false);
    return CommHandle(std::make_unique<Wait>(waits));
  }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    record(send, recv, count, dtype, op, true);
  }
  CommHandle reduce_scatter_async(const void*, void*, size_t, DType, ReduceOp) override { return unused(); }
  CommHandle all_gather_async(const void*, void*, size_t, DType) override { return unused(); }
  CommHandle broadcast_async(const void*, void*, size_t, DType, int) override { return unused(); }
  void group_start() override {}
  void group_end() override {}
  void barrier() override {}
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer(int n) override { return make_host_timer(n); }

 private:
  struct Wait final : PendingOp {
    explicit Wait(int& n) : waits(n) {}
    void wait() override { ++waits; }
    int& waits;
  };
  void record(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool blocking) {
    EXPECT_EQ(send, recv) << "gradients are reduced in place";
    EXPECT_EQ(dtype, DType::F32);
    calls.push_back({static_cast<const float*>(send) - base_, int64_t(count), op, blocking});
  }
  CommHandle unused() {
    ADD_FAILURE() << "gradient sync uses all-reduce only";
    return {};
  }
  const float* base_;
};

struct SyncFixture {
  std::vector<float> grads = std::vector<float>(31);
  Tensor tensor{grads.data(), DType::F32, {31}};
  RecordingComm comm{grads.data()};
  std::unique_ptr<GradientSync> sync;
  SyncFixture(SyncStrategy s, double bucket_mb) : sync(make_gradient_sync(s, comm, tensor, toy_spans(), bucket_mb)) {}
  std::vector<int64_t> issued_begins() const {
    std::vector<int64_t> b;
    for (const auto& c : comm.calls) b.push_back(c.begin);
    return b;
  }
};

TEST(GradientSync, BucketIsIssuedWhenItsLastElementIsReportedInAnyOrder) {
  SyncFixture f(SyncStrategy::Bucketed, mib(44));  // buckets [20,31) and [4,20)
  f.sync->begin_step();
  f.sync->on_gradients_ready(8, 24);   // part of both buckets
  f.sync->on_gradients_ready(28, 31);  // more of the first
  EXPECT_TRUE(f.comm.calls.empty());
  f.sync->on_gradients_ready(4, 8);  // completes [4,20), straddling nothing else
  EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{4}));
  f.sync->on_gradients_ready(24, 28);  // completes [20,31)
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
    f.sync->on_gradients_ready(26, 31);  // a and c: two tensors in one range
    f.sync->on_gradients_ready(12, 20);  // half of w
    EXPECT_EQ(f.issued_begins(), (std::vector<int64_t>{26, 30})) << "step " << step;
    f.sync->on_gradients_ready(4, 12);  // the other half
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
    f.sync->on_gradients_ready(4, 31);
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

}  // namespace
}  // namespace llmhpc

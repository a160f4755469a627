// Optimizer state sharding under mpirun with 1-4 ranks (the contract: after 10 steps, bitwise
// the same weights as the unsharded AdamW), for the reference DDP study's
// broadcast scheme and ZeRO-1 under every strategy that reduces gradients, on the tiny
// TransformerLM trained through run_step (tests/mpi/dp_test_util.h):
//  - weights and losses after 10 steps against the unsharded optimizer with the same --ddp:
//    broadcast bitwise on any number of ranks (its gradients are the strategy's own
//    all-reduces); zero1 bitwise on 1 and 2 ranks, where a sum of two is the same in any
//    order, and within 1e-6 relative on 3 and 4, where a reduce-scatter may add the ranks'
//    gradients in another order than an all-reduce (each case says which it found);
//  - every rank holds only its share of m and v, read off the allocator's tags: optimizer
//    bytes = 2 x 4 x owned elements, owned within one alignment unit of 1/n;
//  - a checkpoint saved from a sharded run holds what an unsharded run's holds, loads into an
//    unsharded run, and one saved unsharded loads into a sharded run, training going on as if
//    uninterrupted;
//  - the parameters other ranks updated arrive during the next forward (it asks the sync for
//    each range before reading it), bitwise as if every one had been waited for after the
//    step, for fp32 and bf16 with and without --low-memory and with the bf16 copy shared; a
//    checkpoint and an evaluation between steps see every parameter;
//  - under bf16 either the fp32 masters travel (each rank casts its copy again, holding none
//    between steps) or the bf16 copy does (--share-weights bf16: with the masters of the
//    embedding and norm gains only, the copy held): bitwise the unsharded weights both ways;
//  - with the gradients through the copy engines (nccl): the unsharded weights too;
//  - with the gradients averaged in bf16 (--grad-reduce-dtype bf16): the unsharded weights on the
//    same bf16 averages, through NCCL's kernels and the copy engines.
// mpi runs on the CPU backend; nccl on GPUs when every rank has one (skipped otherwise).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

#include "src/io/h5.h"
#include "src/model/checkpoint.h"
#include "src/modes/data_parallel.h"
#include "tests/mpi/dp_test_util.h"

namespace llmhpc::test {
namespace {

constexpr int kSteps = 10;
constexpr double kReorderTolerance = 1e-6;  // relative: sums of the same gradients in another order
// The same under bf16: a reordered sum's last bit can tip the rounding of one weight's bf16
// copy (2^-8 of it), which the later steps propagate (4.5e-5 in the weights, 4e-4 in the losses
// at 4 ranks); a shard that missed its updates would be off by about 10 steps x lr = 3e-2.
constexpr double kBf16ReorderTolerance = 2e-3;
// Gradients averaged in bf16 (--grad-reduce-dtype bf16): a sum of three or four in another order
// can differ in its last bit (2^-8), and Adam's steps on averages that cancel by up to the rate
// (1.0e-3 in the weights after 10 steps on 3 and 4 ranks).
constexpr double kBf16WireReorderTolerance = 1e-2;

struct Case {
  CommBackend backend;
  SyncStrategy strategy;
  Sharding sharding;
  DataParallel setup(Sharding s) const { return {strategy, 16.0 / 1024, s}; }  // 16 KiB: a few buckets
  // Whether the sharded run must equal the unsharded one bit for bit (see the file comment).
  bool bitwise() const { return sharding == Sharding::Broadcast || world_size() <= 2; }
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(comm_backend_name(info.param.backend)) + "_" + sync_strategy_name(info.param.strategy) + "_" +
         sharding_name(info.param.sharding);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (CommBackend b : {CommBackend::Mpi, CommBackend::Nccl})
    for (SyncStrategy s : all_sync_strategies())
      if (s != SyncStrategy::None)
        for (Sharding sh : {Sharding::Broadcast, Sharding::Zero1}) cases.push_back({b, s, sh});
  return cases;
}

// A path every rank agrees on (rank 0's process id), removed at the end of the test.
struct SharedPath {
  std::string path;
  explicit SharedPath(const std::string& name) {
    int pid = int(getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path = ::testing::TempDir() + "/llmhpc_shard_" + std::to_string(pid) + "_" + name + ".h5";
  }
  ~SharedPath() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::remove(path.c_str());
  }
};

std::string fmt_error(double e) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", e);
  return text;
}

// The optimizer state a checkpoint holds, read back on every rank (m then v, every tensor).
std::vector<float> saved_state(const std::string& path) {
  std::vector<float> out;
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  const ParameterLayout layout(tiny_transformer());
  for (const ParamInfo& p : layout.params())
    for (const char* group : {"optimizer/m/", "optimizer/v/"}) {
      const std::vector<float> t = h5::read_floats(f.id(), group + p.name);
      out.insert(out.end(), t.begin(), t.end());
    }
  return out;
}

// The parameters a checkpoint holds, read back on every rank, in the flat buffer's order.
std::vector<float> saved_params(const std::string& path) {
  std::vector<float> out;
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  const ParameterLayout layout(tiny_transformer());
  for (const ParamInfo& p : layout.params()) {
    const std::vector<float> t = h5::read_floats(f.id(), "params/" + p.name);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

// Stands between the step and the sync: passes everything on and notes the parameter ranges
// asked for.
struct AskLog : ParallelHooks {
  GradientSync& sync;
  std::vector<FlatRange> asked;
  explicit AskLog(GradientSync& s) : sync(s) {}
  void begin_step() override { sync.begin_step(); }
  void gradients_final(int64_t begin, int64_t end) override { sync.gradients_final(begin, end); }
  void finish() override { sync.finish(); }
  void parameters_updated(int64_t begin, int64_t end) override { sync.parameters_updated(begin, end); }
  bool finish_parameters() override { return sync.finish_parameters(); }
  void parameters_needed(int64_t begin, int64_t end) override {
    asked.push_back({begin, end});
    sync.parameters_needed(begin, end);
  }
};

// `got` against `want` (every rank's own): bitwise where `exact`, else within `tolerance`.
// Collective; says which held.
void expect_same_weights(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                         bool exact, double tolerance) {
  const bool bitwise = bitwise_on_every_rank(got, want);
  const double err = max_over_ranks(rel_error(got, want));
  if (exact) EXPECT_TRUE(bitwise) << what << ": relative error " << err;
  else EXPECT_LE(err, tolerance) << what;
  if (world_rank() == 0)
    std::printf("    %s on %d rank(s): %s\n", what.c_str(), world_size(),
                bitwise ? "bitwise" : ("relative error " + fmt_error(err)).c_str());
}

class ShardTest : public BackendTest<Case> {
 protected:
  // Bitwise where the case says so, else within the reordering tolerance.
  void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                   double tolerance = kReorderTolerance) {
    expect_same_weights(got, want, what, GetParam().bitwise(), tolerance);
  }
};

TEST_P(ShardTest, TenStepsGiveTheUnshardedWeights) {
  const Case& c = GetParam();
  const DataParallel plain = c.setup(Sharding::None), sharded = c.setup(c.sharding);
  const Training want = train_transformer(*env_, &plain, kSteps), got = train_transformer(*env_, &sharded, kSteps);
  expect_same(got.params, want.params, "weights after 10 steps");
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  expect_same(std::vector<float>(got.losses.begin(), got.losses.end()),
              std::vector<float>(want.losses.begin(), want.losses.end()), "losses");
  // What the step communicated: the gradients once, and every parameter once more.
  EXPECT_EQ(got.stats.param_bytes, (c.sharding == Sharding::Zero1 ? got.stats.bytes : want.stats.bytes));
  EXPECT_GE(got.stats.param_collectives, 1);
}

// --clip-grad-norm with a sharded optimizer: each rank's squares of its own ranges, added in rank
// order, give every rank the same norm as the unsharded optimizer's (within the reordering of
// the sum), so the weights follow the clipped unsharded ones; every step clips.
TEST_P(ShardTest, ClippedStepsGiveTheClippedUnshardedWeights) {
  const Case& c = GetParam();
  const DataParallel plain = c.setup(Sharding::None), sharded = c.setup(c.sharding);
  constexpr double kMaxNorm = 0.05;
  const Training want = train_transformer(*env_, &plain, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  const Training got = train_transformer(*env_, &sharded, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  EXPECT_LE(max_over_ranks(rel_error(got.params, want.params)), kReorderTolerance) << "weights after 10 steps";
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  for (int step = 0; step < kSteps; ++step) {
    const double norm = got.grad_norms[size_t(step)], norm_unsharded = want.grad_norms[size_t(step)];
    EXPECT_GT(norm_unsharded, 2 * kMaxNorm) << "step " << step << " should clip";
    EXPECT_TRUE(same_on_every_rank(norm)) << "norm of step " << step;
    // Where the averaged gradients are bitwise the unsharded ones, the norms differ only in the
    // order of the sum of squares.
    EXPECT_LE(max_over_ranks(std::fabs(norm - norm_unsharded) / norm_unsharded),
              c.bitwise() ? 1e-12 : kReorderTolerance)
        << "norm of step " << step;
  }
}

TEST_P(ShardTest, EachRankHoldsOnlyItsShareOfTheOptimizerState) {
  const Case& c = GetParam();
  const DataParallel setup = c.setup(c.sharding);
  TransformerRun run(*env_, &setup);
  run.step(0);
  run.step(1);
  const std::vector<float> padding = run.padding();
  EXPECT_EQ(max_over_ranks(double(std::count(padding.begin(), padding.end(), 0.0f) != int64_t(padding.size()))), 0)
      << "the padding stays zero";
  if (c.sharding == Sharding::Zero1 && world_size() > 1) EXPECT_GT(padding.size(), 0u) << "this model needs padding";
  const MemoryBreakdown memory = model_memory(env_->device().allocator());
  const int64_t owned = run.optimizer().owned_elements(), n = world_size();
  EXPECT_EQ(max_over_ranks(double(memory.of("optimizer") != 2 * 4 * owned)), 0)
      << "optimizer bytes = m and v of what it owns";
  const int64_t spread = c.sharding == Sharding::Zero1 ? run.plan().flat_elements : run.model().layout().total();
  EXPECT_LE(max_over_ranks(std::fabs(double(owned) - double(spread) / double(n))), double(kShardAlignment));
  const double share = mean_over_ranks(double(owned)) * double(n);
  EXPECT_EQ(share, double(spread)) << "the shares add up to the whole, each element once";
  EXPECT_EQ(memory.of("grads"), 4 * run.plan().flat_elements) << "ZeRO-1 keeps every gradient";
}

TEST_P(ShardTest, CheckpointsMoveBetweenShardedAndUnsharded) {
  const Case& c = GetParam();
  const DataParallel plain = c.setup(Sharding::None), sharded = c.setup(c.sharding);
  const int half = kSteps / 2;
  const Runtime rt = world();
  const SharedPath from_sharded("sharded"), from_plain("plain");
  std::vector<float> plain_after_all, sharded_after_all;
  {  // uninterrupted runs, saving halfway
    TransformerRun p(*env_, &plain), s(*env_, &sharded);
    for (int step = 0; step < kSteps; ++step) {
      p.step(step);
      s.step(step);
      if (step + 1 == half) {
        save_checkpoint_from_ranks(rt, from_plain.path, p.model(), p.optimizer(), p.plan());
        save_checkpoint_from_ranks(rt, from_sharded.path, s.model(), s.optimizer(), s.plan());
      }
    }
    plain_after_all = p.params();
    sharded_after_all = s.params();
  }
  expect_same(saved_state(from_sharded.path), saved_state(from_plain.path), "saved m and v");
  {  // sharded -> unsharded
    TransformerRun p(*env_, &plain);
    load_checkpoint(from_sharded.path, p.model(), &p.optimizer());
    EXPECT_EQ(p.optimizer().steps_taken(), half);
    for (int step = half; step < kSteps; ++step) p.step(step);
    expect_same(p.params(), plain_after_all, "unsharded run from a sharded checkpoint");
  }
  {  // unsharded -> sharded: the same state, so exactly where the sharded run got
    TransformerRun s(*env_, &sharded);
    load_checkpoint(from_plain.path, s.model(), &s.optimizer());
    for (int step = half; step < kSteps; ++step) s.step(step);
    expect_same(s.params(), sharded_after_all, "sharded run from an unsharded checkpoint");
  }
}

// The all-gathers (broadcasts) of a step are waited for by the next forward, range by range:
// the same weights and losses, bit for bit on any number of ranks (the same collectives), as
// when every parameter is waited for right after the step.
TEST_P(ShardTest, ParametersArrivingDuringForwardGiveTheWaitedWeights) {
  const Case& c = GetParam();
  const DataParallel sharded = c.setup(c.sharding);
  DataParallel sharing_copy = sharded;
  sharing_copy.share_copy = true;
  // bf16: each range's copy refreshed as it arrives, or the copy itself arriving
  const std::tuple<Precision, MemoryPlan, const DataParallel*> variants[] = {
      {Precision::FP32, MemoryPlan::Fast, &sharded},
      {Precision::BF16, MemoryPlan::Fast, &sharded},
      {Precision::BF16, MemoryPlan::LowMemory, &sharded},
      {Precision::BF16, MemoryPlan::Fast, &sharing_copy}};
  for (const auto& [precision, memory, setup] : variants) {
    const std::string what = std::string(precision_name(precision)) + (memory == MemoryPlan::LowMemory ? " low"
                                                                       : setup->share_copy             ? " copy shared"
                                                                                                       : "");
    const Training want = train_transformer(*env_, setup, kSteps, precision, memory, /*wait_every_step=*/true),
                   got = train_transformer(*env_, setup, kSteps, precision, memory);
    EXPECT_TRUE(bitwise_on_every_rank(got.params, want.params)) << what << ": weights";
    EXPECT_TRUE(bitwise_on_every_rank(std::vector<float>(got.losses.begin(), got.losses.end()),
                                      std::vector<float>(want.losses.begin(), want.losses.end())))
        << what << ": losses";
  }
}

TEST_P(ShardTest, ForwardAsksTheSyncForEveryRangeAfterAStep) {
  const Case& c = GetParam();
  const DataParallel sharded = c.setup(c.sharding);
  TransformerRun run(*env_, &sharded);
  AskLog log(*run.sync());
  const int64_t total = run.model().layout().total();
  for (int step = 0; step < 3; ++step) {
    log.asked.clear();
    run.step(step, &log);
    if (step == 0) {
      EXPECT_TRUE(log.asked.empty()) << "nothing arrives before the first step";
      continue;
    }
    // The embedding, each layer, the final norm with the head: in forward order, all of them.
    EXPECT_EQ(log.asked.size(), size_t(tiny_transformer().num_layers + 2)) << "step " << step;
    int64_t expected_begin = 0;
    for (const FlatRange& r : log.asked) {
      EXPECT_EQ(r.begin, expected_begin) << "step " << step;
      expected_begin = r.end;
    }
    EXPECT_EQ(expected_begin, total) << "step " << step;
  }
  log.asked.clear();
  run.model().wait_parameters();  // the last step's, every one (the padding too)
  EXPECT_EQ(log.asked, (std::vector<FlatRange>{{0, run.model().params().numel()}}));
}

TEST_P(ShardTest, CheckpointAndEvaluationBetweenStepsSeeEveryParameter) {
  const Case& c = GetParam();
  const DataParallel sharded = c.setup(c.sharding);
  const Runtime rt = world();
  const SharedPath path("between");
  DataParallel sharing_copy = sharded;
  sharing_copy.share_copy = true;
  const std::pair<Precision, const DataParallel*> variants[] = {
      {Precision::FP32, &sharded}, {Precision::BF16, &sharded}, {Precision::BF16, &sharing_copy}};
  for (const auto& [precision, setup] : variants) {
    const std::string what = precision_name(precision) + std::string(setup->share_copy ? " copy shared" : "");
    TransformerRun deferred(*env_, setup, precision), waited(*env_, setup, precision);
    for (int step = 0; step < kSteps; ++step) {
      deferred.step(step);
      waited.step(step);
      waited.model().wait_parameters();
      if (step == 3) {  // an evaluation forward right after a step
        const std::vector<float> got = {float(deferred.evaluate(100))}, want = {float(waited.evaluate(100))};
        EXPECT_TRUE(bitwise_on_every_rank(got, want))
            << what << " evaluation loss " << got[0] << " against " << want[0];
      }
      if (step == 6) {  // a checkpoint right after a step
        save_checkpoint_from_ranks(rt, path.path, deferred.model(), deferred.optimizer(), deferred.plan());
        EXPECT_TRUE(bitwise_on_every_rank(saved_params(path.path), waited.params())) << what << " saved parameters";
      }
    }
    EXPECT_TRUE(bitwise_on_every_rank(deferred.params(), waited.params())) << what << " training went on unchanged";
  }
}

// Under bf16, forward casts every range of the weights again as it asks for it while a sharded
// optimizer's parameters arrive: between the steps nobody reads the bf16 copy, so it is not held
// (2 bytes per parameter less after the step); forward, or a wait for every parameter, takes it
// back.
TEST_P(ShardTest, Bf16CopyIsLetGoWhileParametersArrive) {
  const Case& c = GetParam();
  const DataParallel sharded = c.setup(c.sharding);
  TransformerRun run(*env_, &sharded, Precision::BF16);
  auto copy_bytes = [&] {
    int64_t bytes = 0;
    for (const LiveAllocation& a : env_->device().allocator().live_allocations())
      if (a.tag == "params.bf16") bytes += a.bytes;
    return bytes;
  };
  const int64_t whole = 2 * run.plan().flat_elements;
  EXPECT_EQ(copy_bytes(), whole) << "after init";
  run.step(0);
  EXPECT_EQ(copy_bytes(), 0) << "after a step";
  run.evaluate(1);
  EXPECT_EQ(copy_bytes(), whole) << "after the next forward";
  run.step(1);
  run.model().wait_parameters();
  EXPECT_EQ(copy_bytes(), whole) << "after waiting for every parameter";
}

// Sharing the bf16 copy (--share-weights bf16): the copy is held between the steps, and the
// next forward casts nothing.
TEST_P(ShardTest, SharedBf16CopyIsHeldBetweenSteps) {
  const Case& c = GetParam();
  DataParallel sharded = c.setup(c.sharding);
  sharded.share_copy = true;
  TransformerRun run(*env_, &sharded, Precision::BF16);
  int64_t bytes = 0;
  run.step(0);
  for (const LiveAllocation& a : env_->device().allocator().live_allocations())
    if (a.tag == "params.bf16") bytes += a.bytes;
  EXPECT_EQ(bytes, 2 * run.plan().flat_elements) << "after a step";
}

// Sharing the bf16 copy with paged masters: from the first step on, a rank holds the masters
// of what it updates or reads as they are (its parts, the embedding, the norm gains), within a
// page at each end of each; a wait for every parameter takes the rest back and brings them.
TEST_P(ShardTest, SharedBf16CopyGivesBackTheStaleMasters) {
  const Case& c = GetParam();
  DataParallel sharded = c.setup(c.sharding);
  sharded.share_copy = true;
  TransformerRun run(*env_, &sharded, Precision::BF16);
  auto master_bytes = [&] {
    return model_memory(env_->device().allocator()).of("params") - 2 * run.plan().flat_elements;
  };
  const int64_t whole = 4 * run.model().params().numel();
  ASSERT_EQ(master_bytes(), whole) << "after init: the bf16 copy and every master";
  run.step(0);
  const std::vector<FlatRange> owned = run.plan().owned(world_rank()),
                               full_precision = run.model().full_precision_ranges();
  int64_t kept = 0;
  for (const std::vector<FlatRange>* list : {&owned, &full_precision})
    for (const FlatRange& r : *list) kept += r.size();
  const int64_t page = int64_t(env_->device().allocator().page_bytes());
  const int64_t held = master_bytes(), most = 4 * kept + 2 * page * int64_t(owned.size() + full_precision.size());
  EXPECT_LE(held, std::max(most, page)) << "after a step: what it updates or reads, and the pages they touch";
  // A page has masters to give back only where nothing this rank keeps touches it (the tiny
  // model on a GPU: 99 KB of masters in one 2 MiB page under broadcast; under zero1, a page per
  // rank, but rank 1 also keeps the embedding's and the norm gains' masters in rank 0's page).
  std::set<int64_t> kept_pages;
  const int64_t per_page = page / 4;
  for (const std::vector<FlatRange>* list : {&owned, &full_precision})
    for (const FlatRange& r : *list)
      for (int64_t p = r.begin / std::max<int64_t>(per_page, 1);
           per_page > 0 && r.size() > 0 && p <= (r.end - 1) / per_page; ++p)
        kept_pages.insert(p);
  const int64_t pages = per_page > 0 ? (run.model().params().numel() + per_page - 1) / per_page : 1;
  if (world_size() > 1 && int64_t(kept_pages.size()) < pages) EXPECT_LT(held, whole) << "pages given back";
  run.step(1);  // forward and backward read no given-back master
  const std::vector<float> weights = run.params();
  EXPECT_EQ(master_bytes(), whole) << "after waiting for every parameter";
  run.step(2);  // given back again
  EXPECT_EQ(master_bytes(), held) << "after the next step";
}

// Mixed precision: the fp32 weights travel, each rank refreshes its bf16 copy; or the bf16
// copy travels with the masters of the embedding and the norm gains, and the other masters
// come when the weights are read (train_transformer's params() waits for every parameter).
TEST_P(ShardTest, Bf16TenStepsGiveTheUnshardedWeights) {
  const Case& c = GetParam();
  const DataParallel plain = c.setup(Sharding::None);
  const Training want = train_transformer(*env_, &plain, kSteps, Precision::BF16);
  for (bool share_copy : {false, true}) {
    DataParallel sharded = c.setup(c.sharding);
    sharded.share_copy = share_copy;
    const std::string what = share_copy ? " (bf16 copy shared)" : " (masters shared)";
    const Training got = train_transformer(*env_, &sharded, kSteps, Precision::BF16);
    expect_same(got.params, want.params, "bf16 weights after 10 steps" + what, kBf16ReorderTolerance);
    expect_same(std::vector<float>(got.losses.begin(), got.losses.end()),
                std::vector<float>(want.losses.begin(), want.losses.end()), "bf16 losses" + what,
                kBf16ReorderTolerance);
    EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ" << what;
    // What travels after the step: every element's master (4 bytes: what the gradients
    // covered), or its bf16 copy (2) and the masters of the full-precision ranges once more.
    const int64_t gradient_bytes = c.sharding == Sharding::Zero1 ? got.stats.bytes : want.stats.bytes;
    int64_t full_precision = 0;
    for (const ParamInfo& p : ParameterLayout(tiny_transformer()).params())
      if (!p.is_matrix) full_precision += p.shape.numel();
    EXPECT_EQ(got.stats.param_bytes, share_copy ? gradient_bytes / 2 + 4 * full_precision : gradient_bytes) << what;
  }
}

// Through the copy engines (nccl; Communicator::copy_engines): the unsharded run's weights,
// bitwise on 2 ranks (a sum of two is the same in any order) and within the reordering
// tolerance on more (each part's owner adds the ranks' gradients in rank order); and under
// bf16 with the copy shared, the same run's weights through NCCL's kernels.
TEST_P(ShardTest, CopyEnginesGiveTheUnshardedWeights) {
  const Case& c = GetParam();
  if (c.backend != CommBackend::Nccl) GTEST_SKIP() << "the copy engines move nccl's buffers";
  const DataParallel plain = c.setup(Sharding::None);
  DataParallel sharded = c.setup(c.sharding);
  sharded.copy_engines = true;
  const Training want = train_transformer(*env_, &plain, kSteps), got = train_transformer(*env_, &sharded, kSteps);
  const double err = max_over_ranks(rel_error(got.params, want.params));
  if (world_size() <= 2) EXPECT_TRUE(bitwise_on_every_rank(got.params, want.params)) << "relative error " << err;
  else EXPECT_LE(err, kReorderTolerance);
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";

  // bf16 with the copy shared: zero1's all-gathers of the copy go through the copy engines
  // too. Bitwise the run through NCCL's kernels on 2 ranks; on more, bf16's rounding can
  // propagate a reordered sum's last bit further, and the ranks must still agree.
  DataParallel shared = c.setup(c.sharding);
  shared.share_copy = true;
  const Training kernels = train_transformer(*env_, &shared, kSteps, Precision::BF16);
  shared.copy_engines = true;
  const Training engines = train_transformer(*env_, &shared, kSteps, Precision::BF16);
  if (world_size() <= 2)
    EXPECT_TRUE(bitwise_on_every_rank(engines.params, kernels.params))
        << "bf16 copy shared: relative error " << max_over_ranks(rel_error(engines.params, kernels.params));
  EXPECT_TRUE(same_on_every_rank(engines.params)) << "bf16 copy shared: ranks differ";
}

// Gradients averaged in bf16: the sharded optimizer on the rounded averages (zero1: bf16
// reduce-scatters) takes the unsharded optimizer's steps on the same averages, as with fp32
// gradients (bitwise where expect_same says so); through the copy engines (nccl, in the wire)
// bitwise the same run through NCCL's kernels on 2 ranks.
TEST_P(ShardTest, Bf16GradientsGiveTheUnshardedWeights) {
  const Case& c = GetParam();
  DataParallel plain = c.setup(Sharding::None), sharded = c.setup(c.sharding);
  plain.reduce_in_bf16 = sharded.reduce_in_bf16 = true;
  const Training want = train_transformer(*env_, &plain, kSteps), got = train_transformer(*env_, &sharded, kSteps);
  expect_same(got.params, want.params, "weights after 10 steps, gradients in bf16", kBf16WireReorderTolerance);
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  const SyncPlan plan = data_parallel_plan(c.strategy, c.sharding, ParameterLayout(tiny_transformer()), Precision::FP32,
                                           GradientDType::Master, 16.0 / 1024, world_size(), kShardAlignment, true);
  EXPECT_EQ(got.stats.bytes, 2 * (c.sharding == Sharding::Zero1 ? plan.flat_elements : plan.parameters))
      << "every gradient once, as bf16";
  if (c.backend != CommBackend::Nccl) return;
  sharded.copy_engines = true;
  const Training engines = train_transformer(*env_, &sharded, kSteps);
  if (world_size() <= 2)
    EXPECT_TRUE(bitwise_on_every_rank(engines.params, got.params))
        << "copy engines: relative error " << max_over_ranks(rel_error(engines.params, got.params));
  EXPECT_TRUE(same_on_every_rank(engines.params)) << "copy engines: ranks differ";
}

// Gradients made in bf16 (--grad-dtype bf16, mixed precision): the sharded optimizer reads its
// shards of the bf16 averages and takes the unsharded optimizer's steps; zero1 reduce-scatters
// the bf16 gradients as they are (2 bytes each); through the copy engines bitwise the same run
// through NCCL's kernels on 2 ranks.
TEST_P(ShardTest, GradientsMadeInBf16GiveTheUnshardedWeights) {
  const Case& c = GetParam();
  DataParallel plain = c.setup(Sharding::None), sharded = c.setup(c.sharding);
  auto train = [&](const DataParallel& setup) {
    return train_transformer(*env_, &setup, kSteps, Precision::BF16, MemoryPlan::Fast, false, 0, 1,
                             GradientDType::BF16);
  };
  const Training want = train(plain), got = train(sharded);
  expect_same(got.params, want.params, "weights after 10 steps, bf16 gradients", kBf16WireReorderTolerance);
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  const SyncPlan plan = data_parallel_plan(c.strategy, c.sharding, ParameterLayout(tiny_transformer()), Precision::BF16,
                                           GradientDType::BF16, 16.0 / 1024, world_size(), kShardAlignment);
  EXPECT_EQ(got.stats.bytes, 2 * (c.sharding == Sharding::Zero1 ? plan.flat_elements : plan.parameters))
      << "every gradient once, as bf16";
  if (c.backend != CommBackend::Nccl) return;
  sharded.copy_engines = true;
  const Training engines = train(sharded);
  if (world_size() <= 2)
    EXPECT_TRUE(bitwise_on_every_rank(engines.params, got.params))
        << "copy engines: relative error " << max_over_ranks(rel_error(engines.params, got.params));
  EXPECT_TRUE(same_on_every_rank(engines.params)) << "copy engines: ranks differ";
}

INSTANTIATE_TEST_SUITE_P(Schemes, ShardTest, ::testing::ValuesIn(all_cases()), case_name);

// ---- ZeRO-2 and ZeRO-3 (src/dist/unit_shards.h) ---------------------------------------------
// Against unsharded bucketed DDP: the same weights and losses after 10 steps, bitwise on 1 and 2
// ranks and within the reordering tolerance on more; clipped; in bf16 (the bf16 weights gathered
// are the owner's masters rounded as AdamW rounds the unsharded copy); each rank holding 1/n of
// the masters and optimizer state between steps, and under ZeRO-3 no gathered weights.

struct UnitCase {
  CommBackend backend;
  Sharding sharding;
};

std::string unit_case_name(const ::testing::TestParamInfo<UnitCase>& info) {
  return std::string(comm_backend_name(info.param.backend)) + "_" + sharding_name(info.param.sharding);
}

class UnitShardTest : public BackendTest<UnitCase> {
 protected:
  DataParallel plain() const { return {SyncStrategy::Bucketed, 16.0 / 1024, Sharding::None}; }
  DataParallel sharded() const { return {SyncStrategy::Bucketed, 25, GetParam().sharding}; }
  // Bitwise on 1 and 2 ranks, within the reordering tolerance on more.
  void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                   double tolerance = kReorderTolerance) {
    expect_same_weights(got, want, what, world_size() <= 2, tolerance);
  }
  // Bytes of one lane gathered or reduced whole: every rank's part, padding included.
  static int64_t whole(const ShardLayout& s, size_t unit, Lane lane, int64_t element_bytes) {
    return s.lane(unit, lane).part * s.ranks * element_bytes;
  }
};

TEST_P(UnitShardTest, TenStepsGiveTheUnshardedWeights) {
  const DataParallel p = plain(), z = sharded();
  const Training want = train_transformer(*env_, &p, kSteps), got = train_transformer(*env_, &z, kSteps);
  expect_same(got.params, want.params, "weights after 10 steps");
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  expect_same(std::vector<float>(got.losses.begin(), got.losses.end()),
              std::vector<float>(want.losses.begin(), want.losses.end()), "losses");
  // What a step moved: every unit's gradients reduce-scattered once; its weights gathered once
  // (ZeRO-2) or once for forward and again for the layers backward re-gathers (ZeRO-3).
  const ShardLayout layout(ParameterLayout(tiny_transformer()), world_size(), kShardAlignment);
  int64_t reduced = 0;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (Lane l : {Lane::Matrices, Lane::Others}) reduced += whole(layout, u, l, 4);
  EXPECT_EQ(got.stats.bytes, reduced);
  EXPECT_EQ(got.stats.collectives, 2 * int64_t(layout.units.size()) - 1) << "two lanes a unit, the embedding's one";
  const int64_t layers = tiny_transformer().num_layers;
  const int64_t gathers = GetParam().sharding == Sharding::Zero2 ? layers + 2 : (layers + 2) + (layers - 1);
  int64_t gathered = 0, one_layer = 0;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (Lane l : {Lane::Matrices, Lane::Others}) gathered += whole(layout, u, l, 4);
  for (Lane l : {Lane::Matrices, Lane::Others}) one_layer += whole(layout, 1, l, 4);
  EXPECT_EQ(got.stats.param_bytes, gathered + (gathers - (layers + 2)) * one_layer);
}

TEST_P(UnitShardTest, ClippedStepsGiveTheClippedUnshardedWeights) {
  const DataParallel p = plain(), z = sharded();
  constexpr double kMaxNorm = 0.05;
  const Training want = train_transformer(*env_, &p, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  const Training got = train_transformer(*env_, &z, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  EXPECT_LE(max_over_ranks(rel_error(got.params, want.params)), kReorderTolerance) << "weights after 10 steps";
  EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_GT(want.grad_norms[size_t(step)], 2 * kMaxNorm) << "step " << step << " should clip";
    EXPECT_TRUE(same_on_every_rank(got.grad_norms[size_t(step)])) << "norm of step " << step;
    EXPECT_LE(max_over_ranks(std::fabs(got.grad_norms[size_t(step)] - want.grad_norms[size_t(step)]) /
                             want.grad_norms[size_t(step)]),
              world_size() <= 2 ? 1e-12 : kReorderTolerance)
        << "norm of step " << step;
  }
}

// --grad-accum: each unit's gradients added up over the micro-batches in a window of its own,
// reduce-scattered in the last one: the unsharded run's sum, so its weights.
TEST_P(UnitShardTest, MicroBatchesGiveTheUnshardedWeights) {
  const DataParallel p = plain(), z = sharded();
  const int micro = (kGlobalBatch / world_size()) % 2 == 0 ? 2 : 3;  // each rank's share divides
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    const Training want = train_transformer(*env_, &p, kSteps, precision, MemoryPlan::Fast, false, 0.05, micro);
    const Training got = train_transformer(*env_, &z, kSteps, precision, MemoryPlan::Fast, false, 0.05, micro);
    expect_same(got.params, want.params,
                std::string(precision_name(precision)) + " weights after 10 clipped steps of " + std::to_string(micro) +
                    " micro-batches",
                precision == Precision::BF16 ? kBf16ReorderTolerance : kReorderTolerance);
    EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ";
  }
}

TEST_P(UnitShardTest, Bf16TenStepsGiveTheUnshardedWeights) {
  const DataParallel p = plain(), z = sharded();
  for (MemoryPlan memory : {MemoryPlan::Fast, MemoryPlan::LowMemory}) {
    const std::string what = memory == MemoryPlan::Fast ? "" : " (low memory)";
    const Training want = train_transformer(*env_, &p, kSteps, Precision::BF16, memory);
    const Training got = train_transformer(*env_, &z, kSteps, Precision::BF16, memory);
    expect_same(got.params, want.params, "bf16 weights after 10 steps" + what, kBf16ReorderTolerance);
    expect_same(std::vector<float>(got.losses.begin(), got.losses.end()),
                std::vector<float>(want.losses.begin(), want.losses.end()), "bf16 losses" + what,
                kBf16ReorderTolerance);
    EXPECT_TRUE(same_on_every_rank(got.params)) << "ranks differ" << what;
  }
  // Gradients made in bf16 travel as they are: the same weights as unsharded with bf16 gradients.
  const Training want =
      train_transformer(*env_, &p, kSteps, Precision::BF16, MemoryPlan::Fast, false, 0, 1, GradientDType::BF16);
  const Training got =
      train_transformer(*env_, &z, kSteps, Precision::BF16, MemoryPlan::Fast, false, 0, 1, GradientDType::BF16);
  expect_same(got.params, want.params, "weights after 10 steps of bf16 gradients", kBf16WireReorderTolerance);
}

TEST_P(UnitShardTest, EachRankHoldsItsShareOfTheModelState) {
  const Sharding stage = GetParam().sharding;
  const DataParallel z = sharded();
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    TransformerRun run(*env_, &z, precision);
    run.step(0);
    run.step(1);
    const ShardLayout& layout = run.shards()->layout();
    const int64_t S = layout.shard_elements, n = world_size();
    const ParameterLayout params(tiny_transformer());
    // Each element once, 1/n each, padding at most one alignment unit per lane and rank.
    EXPECT_GE(S * n, params.total());
    EXPECT_LE(S * n - params.total(), int64_t(layout.units.size()) * 2 * n * kShardAlignment);
    int64_t held = 0;
    for (int r = 0; r < n; ++r)
      for (const ShardLayout::Piece& piece : layout.pieces(params, r)) held += piece.count;
    EXPECT_EQ(held, params.total()) << "every parameter held by one rank";
    // Bytes by category between steps: the shard's masters, m and v; ZeRO-2 every unit's weights
    // gathered too, ZeRO-3 nothing more (its places and windows, and the gradient shard, go back
    // after use).
    const int64_t cd = precision == Precision::BF16 ? 2 : 4;
    int64_t places = 0;
    for (size_t u = 0; u < layout.units.size() && stage == Sharding::Zero2; ++u)
      places += whole(layout, u, Lane::Matrices, cd) + whole(layout, u, Lane::Others, 4);
    const MemoryBreakdown memory = model_memory(env_->device().allocator());
    const std::string what = precision == Precision::BF16 ? " (bf16)" : " (fp32)";
    EXPECT_EQ(memory.of("optimizer"), 2 * 4 * S) << "m and v of the shard" << what;
    EXPECT_EQ(memory.of("params"), 4 * S + places) << "masters and places" << what;
    EXPECT_EQ(memory.of("grads"), 0) << "no gradients between steps" << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, UnitShardTest,
                         ::testing::Values(UnitCase{CommBackend::Mpi, Sharding::Zero2},
                                           UnitCase{CommBackend::Mpi, Sharding::Zero3},
                                           UnitCase{CommBackend::Nccl, Sharding::Zero2},
                                           UnitCase{CommBackend::Nccl, Sharding::Zero3}),
                         unit_case_name);

}  // namespace
}  // namespace llmhpc::test

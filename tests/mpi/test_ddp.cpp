// Data-parallel training under mpirun with 1-4 ranks, for every strategy and for bucket sizes
// that give one bucket, one per tensor, and something between: ranks seeded differently start
// equal after broadcast_parameters; n ranks on disjoint shards of a global batch end with the
// same weights as one rank on the whole batch (fp32: relative error <= 1e-5; the one-rank run
// is computed on every rank, without communication) and with each other bitwise; the average
// of the local mean losses is the global mean loss; each strategy communicates what it plans
// (collectives, bytes, buckets).
//
// Two models. A toy written here in plain C++ has what the transformer lacks: a frozen
// parameter (never communicated, never changed), a weight used twice (its gradient, checked
// against finite differences, has both contributions) and a trainable parameter the forward
// never reaches (reduced by finish() with no hang, never changed); its backward reports
// gradients in reverse order, one tensor in two pieces. The real TransformerLM trains on the
// backend's device through run_step, the sync its ParallelHooks (tests/mpi/dp_test_util.h).
//
// mpi runs on the CPU backend always; nccl on GPUs (gradients on the device, the
// communicator ordered after the model's stream) when every rank has one, skipped otherwise
// (decided collectively, so no rank is left in a collective). On both, bf16 ranks also agree
// bitwise.
//
// Gradients that travel as bf16 (--grad-reduce-dtype bf16) are checked where their average is
// known exactly: the toy's, which every rank computes for every rank's shard on the host, must
// be the bf16 average of the rounded local gradients (bitwise on 1 and 2 ranks, where the bf16
// sum has one order; within the roundings of a sum on more); the weights then stay within
// kBf16Wire*Tolerance of one rank's fp32 training.
#include "tests/mpi/dp_test_util.h"

namespace llmhpc::test {
namespace {

constexpr int kSteps = 4;
constexpr double kFp32Tolerance = 1e-5;  // fp32: relative error of n ranks' weights against one rank's
// Gradients averaged in bf16: each local gradient and each sum rounded to 8 significant bits
// (2^-9 relative), against the largest average (rel_error), where local gradients larger than
// their average cancel: 4.4e-3 observed at most, 2^-6 allowed. Adam's normalised steps then move
// by as much, and by up to the rate where an average of cancelling gradients changes sign: the
// weights after kSteps steps were 2.0e-3 from fp32 training, 1e-2 is allowed (a missing average
// shows in the gradients, a wrong scale in the toy's exact check).
constexpr double kBf16WireGradTolerance = 1.0 / 64;
constexpr double kBf16WireWeightTolerance = 1e-2;

// ---- Cases: backend x strategy x bucket size ------------------------------------------------

enum class Buckets { One, PerTensor, Between };  // what the bucket size is chosen to give

struct Case {
  CommBackend backend;
  SyncStrategy strategy;
  Buckets buckets = Buckets::One;
  bool copy_engines = false;    // nccl: the gradients move through the copy engines (Communicator::copy_engines)
  bool reduce_in_bf16 = false;  // the gradients travel as bf16 (--grad-reduce-dtype bf16)
  double tolerance() const { return reduce_in_bf16 ? kBf16WireWeightTolerance : kFp32Tolerance; }
  double grad_tolerance() const { return reduce_in_bf16 ? kBf16WireGradTolerance : kFp32Tolerance; }
  bool synced() const { return strategy != SyncStrategy::None || world_size() == 1; }
  bool after_backward() const {
    return strategy == SyncStrategy::None || strategy == SyncStrategy::Naive || strategy == SyncStrategy::Flat;
  }
  // Ranges reduced per step for a model of `tensors` trainable tensors, where the bucket size
  // for Between gives `between` buckets.
  int64_t expected_buckets(int64_t tensors, int64_t between) const {
    switch (strategy) {
      case SyncStrategy::None: return 0;
      case SyncStrategy::Flat: return 1;
      case SyncStrategy::Naive:
      case SyncStrategy::Overlap: return tensors;
      case SyncStrategy::Bucketed:
        return buckets == Buckets::One ? 1 : buckets == Buckets::PerTensor ? tensors : between;
    }
    return -1;
  }
  // bucket_mb for a model; `between_bytes` gives it buckets of several tensors but not all.
  double bucket_mb(double between_bytes) const {
    const double mib = 1024.0 * 1024.0;
    return buckets == Buckets::One ? 1000 : buckets == Buckets::PerTensor ? 1 / mib : between_bytes / mib;
  }
  // The transformer's setup: 16 KiB gives it buckets of several tensors but not all.
  DataParallel transformer() const {
    return {strategy, bucket_mb(16 * 1024), Sharding::None, false, copy_engines, reduce_in_bf16};
  }
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = std::string(comm_backend_name(c.backend)) + "_" + sync_strategy_name(c.strategy);
  if (c.strategy == SyncStrategy::Bucketed)
    name += c.buckets == Buckets::One ? "_one" : c.buckets == Buckets::PerTensor ? "_per_tensor" : "_between";
  return name + (c.reduce_in_bf16 ? "_bf16grads" : "") + (c.copy_engines ? "_copy" : "");
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (CommBackend b : {CommBackend::Mpi, CommBackend::Nccl}) {
    for (SyncStrategy s : all_sync_strategies())
      if (s != SyncStrategy::Bucketed) cases.push_back({b, s});
    for (Buckets k : {Buckets::One, Buckets::PerTensor, Buckets::Between})
      cases.push_back({b, SyncStrategy::Bucketed, k});
  }
  // The same average through the copy engines: every strategy (the toy's odd-sized tensors
  // leave elements that divide among no ranks, which NCCL's kernels reduce).
  for (SyncStrategy s : all_sync_strategies())
    if (s != SyncStrategy::None && s != SyncStrategy::Bucketed)
      cases.push_back({CommBackend::Nccl, s, Buckets::One, true});
  for (Buckets k : {Buckets::One, Buckets::PerTensor, Buckets::Between})
    cases.push_back({CommBackend::Nccl, SyncStrategy::Bucketed, k, true});
  // Gradients as bf16: after backward (naive), per tensor as they become final (overlap), and
  // in buckets, through NCCL's kernels and the copy engines (in the wire).
  for (CommBackend b : {CommBackend::Mpi, CommBackend::Nccl}) {
    cases.push_back({b, SyncStrategy::Naive, Buckets::One, false, true});
    cases.push_back({b, SyncStrategy::Overlap, Buckets::One, false, true});
    cases.push_back({b, SyncStrategy::Bucketed, Buckets::Between, false, true});
  }
  cases.push_back({CommBackend::Nccl, SyncStrategy::Overlap, Buckets::One, true, true});
  cases.push_back({CommBackend::Nccl, SyncStrategy::Bucketed, Buckets::Between, true, true});
  return cases;
}

// ---- The toy model ----------------------------------------------------------------------------

// u = s * x (s frozen), h = tanh(W u), y = W h (W used twice), z = a . y + c,
// loss = mean over samples of (z - t)^2 / 2. q trains but the forward never reaches it.
// Arithmetic in double on the host; parameters and gradients stored as fp32 on the device.
namespace toy {

constexpr int D = 4;
// Flat layout (elements): s [0,4) frozen | W [4,20) | q [20,26) | a [26,30) | c [30,31)
constexpr int64_t S = 0, W = 4, Q = 20, A = 26, C = 30, kTotal = 31;

std::vector<ParamSpan> spans() { return {{"s", S, W, false}, {"W", W, Q}, {"q", Q, A}, {"a", A, C}, {"c", C, kTotal}}; }

std::vector<float> init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.5);
  std::vector<float> p(kTotal);
  for (int64_t i = 0; i < kTotal; ++i) p[size_t(i)] = float(i < W ? 1.0 + normal(rng) * 0.5 : normal(rng));
  return p;
}

void sample(int64_t i, double x[D], double& target) {
  for (int k = 0; k < D; ++k) x[k] = std::sin(1.3 * double(i) + 0.7 * k + 0.2);
  target = std::cos(0.9 * double(i));
}

struct Forward {
  double u[D], h[D], y[D], z, target;
};

template <class P>
Forward forward(const std::vector<P>& p, int64_t i) {
  Forward f;
  double x[D];
  sample(i, x, f.target);
  for (int k = 0; k < D; ++k) f.u[k] = double(p[S + k]) * x[k];
  for (int j = 0; j < D; ++j) {
    double pre = 0;
    for (int k = 0; k < D; ++k) pre += double(p[W + j * D + k]) * f.u[k];
    f.h[j] = std::tanh(pre);
  }
  f.z = double(p[C]);
  for (int j = 0; j < D; ++j) {
    f.y[j] = 0;
    for (int k = 0; k < D; ++k) f.y[j] += double(p[W + j * D + k]) * f.h[k];
    f.z += double(p[A + j]) * f.y[j];
  }
  return f;
}

template <class P>
double mean_loss(const std::vector<P>& p, Shard shard) {
  double sum = 0;
  for (int64_t i = shard.begin; i < shard.end; ++i) {
    const Forward f = forward(p, i);
    sum += 0.5 * (f.z - f.target) * (f.z - f.target);
  }
  return sum / double(shard.size());
}

// Gradients of mean_loss over `shard` into `grads` (on the device): the head (a, c) first,
// then W in two pieces, each reported to `listener` once written, as a backward would. The
// gradients of s (frozen) and q (unreached) are not written.
void backward(const std::vector<float>& p, Shard shard, Device& dev, const Tensor& grads, ParallelHooks* listener) {
  std::vector<double> g(kTotal, 0.0);
  for (int64_t i = shard.begin; i < shard.end; ++i) {
    const Forward f = forward(p, i);
    const double dz = (f.z - f.target) / double(shard.size());
    double dy[D], dpre[D];
    g[C] += dz;
    for (int j = 0; j < D; ++j) g[A + j] += dz * f.y[j], dy[j] = dz * double(p[A + j]);
    for (int k = 0; k < D; ++k) {  // dh = W^T dy, through tanh
      double dh = 0;
      for (int j = 0; j < D; ++j) dh += double(p[W + j * D + k]) * dy[j];
      dpre[k] = dh * (1 - f.h[k] * f.h[k]);
    }
    for (int j = 0; j < D; ++j)
      for (int k = 0; k < D; ++k) g[W + j * D + k] += dy[j] * f.h[k] + dpre[j] * f.u[k];  // second use + first use
  }
  auto report = [&](int64_t begin, int64_t end) {
    std::vector<float> part(g.begin() + begin, g.begin() + end);
    dev.copy_to_device(grads.slice(begin, {end - begin}).data, part.data(), part.size() * sizeof(float));
    if (listener) listener->gradients_final(begin, end);
  };
  report(A, kTotal);
  report(W + 8, Q);
  report(W, W + 8);
}

// Markers in the gradients that backward does not write, different on every rank: the frozen
// one must keep this rank's, the unreached one must hold the ranks' average after finish().
float frozen_marker(int rank) { return -1.0f - float(rank); }
float unreached_marker(int rank) { return 100.0f + float(rank); }

}  // namespace toy

// One rank on the whole batch without communication (dist == nullptr, parameters from rank
// 0's seed), or this rank's shard under the case's strategy (parameters from this rank's
// seed, then broadcast from rank 0).
Training train_toy(Env& env, const Case* dist) {
  Device& dev = env.device();
  Allocator& alloc = dev.allocator();
  Buffer params(alloc, DType::F32, {toy::kTotal}, "toy.params"),
      grads(alloc, DType::F32, {toy::kTotal}, "toy.grads", MemoryKind::Shareable),
      m(alloc, DType::F32, {toy::kTotal}, "toy.m"), v(alloc, DType::F32, {toy::kTotal}, "toy.v");
  dev.fill_zero(m.tensor().data, m.tensor().bytes());
  dev.fill_zero(v.tensor().data, v.tensor().bytes());
  const std::vector<float> init = toy::init(dist ? kRankZeroSeed + uint64_t(world_rank()) : kRankZeroSeed);
  dev.copy_to_device(params.tensor().data, init.data(), init.size() * sizeof(float));
  std::unique_ptr<GradientSync> sync;
  if (dist) {
    broadcast_parameters(*env.comm, params);
    SyncPlan plan =
        plan_sync(dist->strategy, Sharding::None, toy::spans(), sizeof(float), dist->bucket_mb(44), world_size());
    plan.reduce_in_bf16 = dist->reduce_in_bf16;
    sync = make_gradient_sync(plan, *env.comm, grads, Tensor(), {}, {&alloc, dist->copy_engines});
  }
  const Shard shard = dist ? shard_of_this_rank(kGlobalBatch) : Shard{0, kGlobalBatch};
  const AdamWHyper hyper{1e-2, 0.9, 0.999, 1e-8, 0.01};
  Training run;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> markers(toy::kTotal, 0.0f);
    for (int64_t i = toy::S; i < toy::W; ++i) markers[size_t(i)] = toy::frozen_marker(world_rank());
    for (int64_t i = toy::Q; i < toy::A; ++i) markers[size_t(i)] = toy::unreached_marker(world_rank());
    dev.copy_to_device(grads.tensor().data, markers.data(), markers.size() * sizeof(float));
    const std::vector<float> p = download(dev, params);
    run.losses.push_back(toy::mean_loss(p, shard));
    if (sync) sync->begin_step();
    toy::backward(p, shard, dev, grads, sync.get());
    if (sync) sync->finish();
    if (step == 0) run.grads = download(dev, grads);
    // AdamW on what the forward reaches and trains: W, and a with c.
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{toy::W, toy::Q}, {toy::A, toy::kTotal}}) {
      auto part = [&](const Buffer& b) { return b.tensor().slice(begin, {end - begin}); };
      env.ops().adamw_step(part(params), part(grads), part(m), part(v), Tensor(), hyper, step + 1);
    }
    if (sync) run.stats = sync->stats();
  }
  run.params = download(dev, params);
  return run;
}

// ---- Fixtures ---------------------------------------------------------------------------------

class DdpTest : public BackendTest<Case> {
 protected:
  // What every model's run must show against the one-rank run. Collective.
  void expect_trains_like_one_rank(const Training& dist, const Training& one_rank) {
    const Case& c = GetParam();
    const double err = max_over_ranks(rel_error(dist.params, one_rank.params));
    if (c.synced())
      EXPECT_LE(err, c.tolerance()) << "weights after " << kSteps << " steps against one rank on the whole batch";
    else  // the control: with no communication, ranks on different shards drift apart
      EXPECT_GT(err, 100 * kFp32Tolerance) << "'none' on several ranks should not match one rank";
    if (c.strategy != SyncStrategy::None) EXPECT_TRUE(same_on_every_rank(dist.params)) << "ranks differ";
    // The average of the local mean losses is the global mean loss (every step when the
    // ranks stay in step; the first step always, as every rank starts from rank 0's weights).
    for (int step = 0; step < (c.synced() ? kSteps : 1); ++step) {
      const double global = mean_over_ranks(dist.losses[size_t(step)]), want = one_rank.losses[size_t(step)];
      EXPECT_LE(max_over_ranks(std::fabs(global - want) / std::fabs(want)), c.tolerance()) << "loss of step " << step;
    }
  }

  // Collectives as planned: one per bucket, issued during backward where backward reports
  // the whole bucket, by finish() otherwise.
  void expect_stats(const SyncStats& s, int64_t buckets, int64_t bytes, int64_t issued_in_finish) {
    EXPECT_EQ(s.buckets, buckets);
    EXPECT_EQ(s.collectives, buckets);
    EXPECT_EQ(s.bytes, buckets ? bytes : 0);
    EXPECT_EQ(s.issued_in_finish, issued_in_finish);
  }
};

TEST_P(DdpTest, ToyTrainsLikeOneRankOnTheWholeBatch) {
  const Case& c = GetParam();
  const Training one_rank = train_toy(*env_, nullptr), dist = train_toy(*env_, &c);
  expect_trains_like_one_rank(dist, one_rank);

  // Frozen s and unreached q: untouched (rank 0's initial values) on every rank.
  const std::vector<float> init = toy::init(kRankZeroSeed);
  int changed = 0;
  for (int64_t i = toy::S; i < toy::A; ++i)
    if ((i < toy::W || i >= toy::Q) && std::memcmp(&dist.params[size_t(i)], &init[size_t(i)], sizeof(float)) != 0)
      ++changed;
  EXPECT_EQ(max_over_ranks(changed), 0) << "frozen or unreached parameters changed";

  // After the first finish(): the frozen gradient was never communicated (this rank's marker
  // is still there); the unreached one was averaged over ranks (finish() reduced it).
  const int n = world_size();
  double frozen_wrong = 0, unreached_err = 0;
  const double unreached_mean = 100.0 + (n - 1) / 2.0;
  for (int64_t i = toy::S; i < toy::W; ++i) frozen_wrong += dist.grads[size_t(i)] != toy::frozen_marker(world_rank());
  for (int64_t i = toy::Q; i < toy::A; ++i)
    unreached_err = std::max(unreached_err, std::fabs(dist.grads[size_t(i)] - unreached_mean) / unreached_mean);
  EXPECT_EQ(max_over_ranks(frozen_wrong), 0) << "the frozen parameter's gradient was communicated";
  if (c.strategy != SyncStrategy::None)
    EXPECT_LE(max_over_ranks(unreached_err), c.reduce_in_bf16 ? std::ldexp(1.0, -7) : 1e-6)
        << "the unreached parameter's gradient was not averaged";

  // The averaged gradient of everything trained, W (used twice) included, is the gradient of
  // the global mean loss: central differences in double at the initial weights.
  if (c.synced()) {
    std::vector<double> p(init.begin(), init.end()), fd, got;
    const Shard all{0, kGlobalBatch};
    for (int64_t i = toy::W; i < toy::kTotal; ++i) {
      if (i >= toy::Q && i < toy::A) continue;  // q: not reached
      const double orig = p[size_t(i)], eps = 1e-6;
      p[size_t(i)] = orig + eps;
      const double up = toy::mean_loss(p, all);
      p[size_t(i)] = orig - eps;
      const double down = toy::mean_loss(p, all);
      p[size_t(i)] = orig;
      fd.push_back((up - down) / (2 * eps));
      got.push_back(dist.grads[size_t(i)]);
    }
    EXPECT_LE(max_over_ranks(rel_error(got, fd)), c.grad_tolerance()) << "gradients against finite differences";
  }

  // In bf16: what every rank holds after the first finish() is the bf16 average of the rounded
  // local gradients, each of which every rank computes here for every rank's shard.
  if (c.reduce_in_bf16) {
    const int n = world_size();
    std::vector<float> params(init.begin(), init.end());
    std::vector<std::vector<float>> local;  // each rank's rounded gradients, as its wire held them
    for (int r = 0; r < n; ++r) {
      Buffer g(env_->device().allocator(), DType::F32, {toy::kTotal}, "toy.local");
      env_->device().fill_zero(g.tensor().data, g.tensor().bytes());
      const int64_t share = kGlobalBatch / n;
      toy::backward(params, Shard{r * share, (r + 1) * share}, env_->device(), g, nullptr);
      local.push_back(download(env_->device(), g));
      for (float& x : local.back()) x = round_to_bf16(x);
    }
    double wrong = 0, worst = 0;
    for (int64_t i = toy::W; i < toy::kTotal; ++i) {
      if (i >= toy::Q && i < toy::A) continue;  // q: markers, checked above
      const float got = dist.grads[size_t(i)];
      wrong += round_to_bf16(got) != got;  // it came through the wire
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r)
        exact += local[size_t(r)][size_t(i)] / n, magnitude += std::fabs(local[size_t(r)][size_t(i)]) / n;
      if (n <= 2) {  // one bf16 sum, then the division: the same bits whichever backend
        const float sum = n == 1 ? local[0][size_t(i)] : round_to_bf16(local[0][size_t(i)] + local[1][size_t(i)]);
        wrong += got != round_to_bf16(sum / float(n));
      } else {  // n - 1 sums and a division, each rounded to bf16 (8 significant bits)
        worst = std::max(worst, std::fabs(got - exact) / (n * std::ldexp(magnitude, -8) + 1e-30));
      }
    }
    EXPECT_EQ(max_over_ranks(wrong), 0) << "bf16 averages of the rounded local gradients";
    EXPECT_LE(max_over_ranks(worst), 1.0) << "bf16 average beyond the roundings of its sums";
  }

  // 4 trainable tensors, 27 elements; q (in the bucket [20,31) or its own) is never reported.
  const int64_t buckets = c.expected_buckets(4, 2);
  expect_stats(dist.stats, buckets, 27 * (c.reduce_in_bf16 ? 2 : 4), c.after_backward() ? buckets : 1);
}

TEST_P(DdpTest, TransformerTrainsLikeOneRankOnTheWholeBatch) {
  const Case& c = GetParam();
  const DataParallel setup = c.transformer();
  const Training one_rank = train_transformer(*env_, nullptr, kSteps), dist = train_transformer(*env_, &setup, kSteps);
  expect_trains_like_one_rank(dist, one_rank);
  // The first step's averaged gradients are the whole batch's (Adam's steps hardly change
  // when gradients are scaled, so the weights alone would not show a sum in place of a mean).
  if (c.synced())
    EXPECT_LE(max_over_ranks(rel_error(dist.grads, one_rank.grads)), c.grad_tolerance()) << "first step's gradients";
  const ParameterLayout layout(tiny_transformer());
  const int64_t tensors = int64_t(layout.params().size());
  // 16 KiB buckets: more than one, fewer than the tensors (the exact count is the unit tests').
  const int64_t buckets = c.expected_buckets(tensors, dist.stats.buckets);
  if (c.strategy == SyncStrategy::Bucketed && c.buckets == Buckets::Between) {
    EXPECT_GT(buckets, 1);
    EXPECT_LT(buckets, tensors);
  }
  // Backward reports every tensor, so overlap and bucketed issue everything during backward.
  expect_stats(dist.stats, buckets, layout.total() * (c.reduce_in_bf16 ? 2 : 4), c.after_backward() ? buckets : 0);
}

// --clip-grad-norm under every strategy: the norm of the averaged gradients, the same bits on
// every rank, so the ranks clip alike and train as one rank on the whole batch does. The
// limit is below the norms, so every step clips.
TEST_P(DdpTest, ClippedTransformerTrainsLikeOneRankOnTheWholeBatch) {
  const Case& c = GetParam();
  const DataParallel setup = c.transformer();
  constexpr double kMaxNorm = 0.05;
  const Training one_rank =
      train_transformer(*env_, nullptr, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  const Training dist = train_transformer(*env_, &setup, kSteps, Precision::FP32, MemoryPlan::Fast, false, kMaxNorm);
  expect_trains_like_one_rank(dist, one_rank);
  ASSERT_EQ(dist.grad_norms.size(), size_t(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    const double got = dist.grad_norms[size_t(step)], want = one_rank.grad_norms[size_t(step)];
    EXPECT_GT(want, 2 * kMaxNorm) << "step " << step << " should clip";
    if (c.strategy != SyncStrategy::None) {
      EXPECT_TRUE(same_on_every_rank(got)) << "norm of step " << step;
      if (c.synced())
        EXPECT_LE(max_over_ranks(std::fabs(got - want) / want), c.grad_tolerance()) << "norm of step " << step;
    }
  }
}

// --grad-accum under every strategy: each rank's share in micro-batches (2, or 3 where the share
// is odd), the sync in the last backward only, trains as one rank on the whole batch in one pass.
TEST_P(DdpTest, AccumulatedTransformerTrainsLikeOneRankOnTheWholeBatch) {
  const Case& c = GetParam();
  const DataParallel setup = c.transformer();
  const int micro = (kGlobalBatch / world_size()) % 2 == 0 ? 2 : 3;
  const Training one_rank = train_transformer(*env_, nullptr, kSteps);
  const Training dist = train_transformer(*env_, &setup, kSteps, Precision::FP32, MemoryPlan::Fast, false, 0, micro);
  expect_trains_like_one_rank(dist, one_rank);
  if (c.synced())  // the accumulated first gradients are the whole batch's mean
    EXPECT_LE(max_over_ranks(rel_error(dist.grads, one_rank.grads)), c.grad_tolerance()) << "first step's gradients";
  // One collective per bucket per step, as without micro-batches: none in the earlier backwards.
  if (c.strategy != SyncStrategy::None) EXPECT_EQ(dist.stats.collectives, dist.stats.buckets);
}

// --grad-dtype bf16 under every strategy: gradients made in bf16 travel as they are (half the
// bytes, no casts) and are averaged in bf16, so the weights stay within bf16's rounding of one
// rank training on the whole batch with bf16 gradients, and the ranks agree bitwise.
TEST_P(DdpTest, Bf16GradientsTrainLikeOneRankWithThem) {
  const Case& c = GetParam();
  if (c.reduce_in_bf16) GTEST_SKIP() << "bf16 gradients travel as bf16 whatever --grad-reduce-dtype says";
  const DataParallel setup = c.transformer();
  auto train = [&](const DataParallel* dist) {
    return train_transformer(*env_, dist, kSteps, Precision::BF16, MemoryPlan::Fast, false, 0, 1, GradientDType::BF16);
  };
  const Training one_rank = train(nullptr), dist = train(&setup);
  const double err = max_over_ranks(rel_error(dist.params, one_rank.params));
  if (c.synced()) {
    EXPECT_LE(err, kBf16WireWeightTolerance) << "weights after " << kSteps << " steps against one rank";
    EXPECT_LE(max_over_ranks(rel_error(dist.grads, one_rank.grads)), kBf16WireGradTolerance) << "first gradients";
  } else {
    EXPECT_GT(err, 100 * kFp32Tolerance) << "'none' on several ranks should not match one rank";
  }
  if (c.strategy == SyncStrategy::None) return;
  EXPECT_TRUE(same_on_every_rank(dist.params)) << "ranks differ";
  const ParameterLayout layout(tiny_transformer());
  const int64_t buckets = c.expected_buckets(int64_t(layout.params().size()), dist.stats.buckets);
  expect_stats(dist.stats, buckets, layout.total() * 2, c.after_backward() ? buckets : 0);
}

INSTANTIATE_TEST_SUITE_P(Strategies, DdpTest, ::testing::ValuesIn(all_cases()), case_name);

class DdpBackendTest : public ::testing::TestWithParam<CommBackend> {
 protected:
  static void TearDownTestSuite() { envs().clear(); }
  void SetUp() override {
    env_ = env_for(GetParam());
    if (!env_) GTEST_SKIP() << "nccl: not compiled in, no GPU visible, or more ranks than GPUs on a node";
  }
  Env* env_ = nullptr;
};

// Ranks seeded differently differ until the broadcast, then hold rank 0's values bitwise.
TEST_P(DdpBackendTest, BroadcastMakesDifferentlySeededRanksEqual) {
  Device& dev = env_->device();
  const std::vector<float> mine = toy::init(kRankZeroSeed + uint64_t(world_rank()));
  Buffer params(dev.allocator(), DType::F32, {toy::kTotal}, "toy.params");
  dev.copy_to_device(params.tensor().data, mine.data(), mine.size() * sizeof(float));
  if (world_size() > 1)
    EXPECT_FALSE(same_on_every_rank(download(dev, params))) << "each rank's seed should give other weights";
  broadcast_parameters(*env_->comm, params);
  const std::vector<float> got = download(dev, params), want = toy::init(kRankZeroSeed);
  EXPECT_TRUE(same_on_every_rank(got));
  EXPECT_EQ(max_over_ranks(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0), 0);

  TransformerLM model({tiny_transformer(), Precision::FP32, AttentionKind::Naive}, dev, env_->ops());
  model.init_parameters(kRankZeroSeed + uint64_t(world_rank()));
  if (world_size() > 1) EXPECT_FALSE(same_on_every_rank(download(dev, model.params())));
  broadcast_parameters(*env_->comm, model.params());
  EXPECT_TRUE(same_on_every_rank(download(dev, model.params())));
}

// Mixed precision: every strategy keeps the ranks bitwise equal.
TEST_P(DdpBackendTest, Bf16RanksAgreeBitwise) {
  for (const Case& c : all_cases()) {
    if (c.backend != GetParam() || c.strategy == SyncStrategy::None) continue;
    const DataParallel setup = c.transformer();
    const Training dist = train_transformer(*env_, &setup, kSteps, Precision::BF16);
    EXPECT_TRUE(same_on_every_rank(dist.params)) << sync_strategy_name(c.strategy);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpBackendTest, ::testing::Values(CommBackend::Mpi, CommBackend::Nccl),
                         [](const ::testing::TestParamInfo<CommBackend>& info) {
                           return std::string(comm_backend_name(info.param));
                         });

}  // namespace
}  // namespace llmhpc::test

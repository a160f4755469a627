// What the data-parallel tests under mpirun share (test_ddp.cpp, test_shard.cpp): a backend
// and a communicator per backend (nccl when every rank has a GPU), comparisons over ranks,
// this rank's share of a global batch, and the tiny TransformerLM trained through run_step
// (the real step protocol: backward with the sync as listener, the optimizer telling it what
// it updated) on one rank's whole batch or on this rank's share under a data-parallel plan.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "src/dist/data_parallel_training.h"
#include "src/dist/grad_sync.h"
#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/model/transformer.h"
#include "src/modes/data_parallel.h"
#include "tests/mpi/mpi_test_util.h"

namespace llmhpc::test {

// ---- Where parameters and gradients live: a backend and a communicator --------------------

struct Env {
  Backend backend;                     // declared first: destroyed after the communicator
  std::unique_ptr<Communicator> comm;  // nccl: ordered after backend.device's stream
  Device& device() { return *backend.device; }
  Ops& ops() { return *backend.ops; }
};

// One per backend for the whole program (NCCL start-up is slow); each suite frees them in its
// TearDownTestSuite, before MPI_Finalize.
inline std::map<CommBackend, Env>& envs() {
  static std::map<CommBackend, Env> e;
  return e;
}

// nullptr when the backend cannot run on every rank (a collective decision).
inline Env* env_for(CommBackend b) {
  if (b == CommBackend::Nccl && !nccl_runnable()) return nullptr;
  Env& e = envs()[b];
  if (!e.comm) {
    BackendOptions device;
    CommOptions comm;
    comm.backend = b;
    if (b == CommBackend::Nccl) {
      device.kind = DeviceKind::Cuda;
      device.ordinal = comm.gpu = local_gpu();
    }
    e.backend = make_backend(device);
    comm.compute_stream = e.device().native_stream();
    e.comm = make_communicator(comm);
  }
  return &e;
}

// The fixture of the data-parallel suites: the communicator of the case's backend
// (Param::backend), the case skipped where that backend cannot run on every rank.
template <class Param>
class BackendTest : public ::testing::TestWithParam<Param> {
 protected:
  static void TearDownTestSuite() { envs().clear(); }
  void SetUp() override {
    env_ = env_for(this->GetParam().backend);
    if (!env_) GTEST_SKIP() << "nccl: not compiled in, no GPU visible, or more ranks than GPUs on a node";
  }
  Env* env_ = nullptr;
};

// fp32, or bf16 widened (exact).
inline std::vector<float> download(Device& d, const Tensor& t) {
  EXPECT_TRUE(t.dtype == DType::F32 || t.dtype == DType::BF16);
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    d.copy_to_host(v.data(), t.data, t.bytes());
  } else {
    std::vector<uint16_t> bits(v.size());
    d.copy_to_host(bits.data(), t.data, t.bytes());
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits_to_float(bits[i]);
  }
  return v;
}

// A Runtime over every rank, as main() makes one.
inline Runtime world() {
  Runtime rt;
  rt.rank = world_rank();
  rt.world_size = world_size();
  return rt;
}

// ---- Comparisons over ranks (every rank calls them; rank 0 prints) ------------------------

inline double max_over_ranks(double x) {
  double worst = 0;
  MPI_Allreduce(&x, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

inline double mean_over_ranks(double x) {
  double sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / world_size();
}

// Whether every rank holds rank 0's values, bit for bit.
inline bool same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> root = v;
  MPI_Bcast(root.data(), int(root.size() * sizeof(float)), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

inline bool same_on_every_rank(double x) {
  double root = x;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(&root, &x, sizeof x) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Whether a equals b bit for bit on every rank.
inline bool bitwise_on_every_rank(const std::vector<float>& a, const std::vector<float>& b) {
  const double differ = a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0;
  return max_over_ranks(differ) == 0;
}

// max |a - b| / max |b| (NaN when a holds a non-finite value, so that EXPECT_LE fails).
template <class A, class B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(double(a[i]))) return NAN;
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

// Rank r's samples of a global batch: [r*global/n, (r+1)*global/n).
struct Shard {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};
inline Shard shard_of_this_rank(int64_t global) {
  const int64_t r = world_rank(), n = world_size();
  return {r * global / n, (r + 1) * global / n};
}
constexpr int64_t kGlobalBatch = 12;  // divides by 1, 2, 3 and 4 ranks

// ---- The transformer ----------------------------------------------------------------------------

// vocab 64, context 8, d_model 32, d_ff 64, 2 layers, 4 heads.
inline ModelConfig tiny_transformer() { return ModelConfig{"custom", 64, 8, 32, 64, 2, 4}; }

struct TokenBatch {
  std::vector<int32_t> tokens, targets;  // (kGlobalBatch, T)
};

inline TokenBatch global_batch(const ModelConfig& c, int step) {
  std::mt19937_64 rng(uint64_t(77 + step));
  const size_t n = size_t(kGlobalBatch * c.context_length);
  TokenBatch b{std::vector<int32_t>(n), std::vector<int32_t>(n)};
  for (int32_t& t : b.tokens) t = int32_t(rng() % uint64_t(c.vocab_size));
  for (int32_t& t : b.targets) t = int32_t(rng() % uint64_t(c.vocab_size));
  return b;
}

constexpr uint64_t kRankZeroSeed = 1000;

// How the ranks train together.
struct DataParallel {
  SyncStrategy strategy = SyncStrategy::None;
  double bucket_mb = 25;
  Sharding sharding = Sharding::None;
  bool share_copy = false;      // sharded under bf16: the bf16 copy travels (--share-weights bf16)
  bool copy_engines = false;    // --collective-engine copy (nccl; the mpi backend moves them as before)
  bool reduce_in_bf16 = false;  // --grad-reduce-dtype bf16
};

// The tiny transformer with its optimizer: one rank on the whole batch (dist == nullptr:
// parameters from rank 0's seed, no communication), or this rank's share under `dist`
// (parameters from this rank's seed, then broadcast from rank 0; flat buffers and optimizer
// ranges as the plan says). step(s) trains on global batch s, so runs can stop and go on.
class TransformerRun {
 public:
  // `max_grad_norm` > 0: the optimizer clips, as train's does. `micro_batches` > 1: each step's
  // share in that many parts, gradients added up (train's --grad-accum).
  // `grads`: what backward writes the gradients in (--grad-dtype).
  TransformerRun(Env& env, const DataParallel* dist, Precision precision = Precision::FP32,
                 MemoryPlan memory = MemoryPlan::Fast, double max_grad_norm = 0, int micro_batches = 1,
                 GradientDType grads = GradientDType::Master)
      : env_(env),
        plan_(data_parallel_plan(
            dist ? dist->strategy : SyncStrategy::None, dist ? dist->sharding : Sharding::None,
            ParameterLayout(tiny_transformer()), precision, grads, dist ? dist->bucket_mb : 25, dist ? world_size() : 1,
            shard_alignment(env.device(), precision, dist && dist->share_copy), dist && dist->reduce_in_bf16)),
        model_({tiny_transformer(), precision, AttentionKind::Naive, memory, model_storage(plan_).flat_elements,
                GradientStorage::Whole, grads, model_storage(plan_).parameters},
               env.device(), env.ops()),
        shard_(dist ? shard_of_this_rank(kGlobalBatch) : Shard{0, kGlobalBatch}), micro_batches_(micro_batches),
        timer_(env.device().make_timer(step_marks(micro_batches))) {
    EXPECT_EQ(shard_.size() % micro_batches, 0) << "the test's shares must split into the micro-batches";
    if (micro_batches > 1) model_.set_loss_weight(1.0 / micro_batches);
    const AdamWHyper hyper{3e-3, 0.9, 0.999, 1e-8, 0.01};
    training_ = std::make_unique<DataParallelTraining>(plan_, dist ? env.comm.get() : nullptr, nullptr, model_,
                                                       env.ops(), hyper, micro_batches > 1);
    // Sharded: every rank its parts of rank 0's weights. Else each rank its own, until start()
    // gives every rank rank 0's.
    const bool sharded = shards_parameters(plan_.sharding);
    training_->initialize(dist && !sharded ? kRankZeroSeed + uint64_t(world_rank()) : kRankZeroSeed);
    if (max_grad_norm > 0) training_->clip_gradients(max_grad_norm, world(), 1);  // as train sets it up
    training_->start(dist && dist->share_copy,
                     dist && dist->copy_engines ? CollectiveEngine::Copy : CollectiveEngine::Sm);
  }

  // One step on global batch `s`; returns this rank's mean loss before the update. A sharded
  // optimizer's parameters may still be arriving on return (the next forward waits for them);
  // `listener`, if given, stands between the step and the sync.
  double step(int s, ParallelHooks* listener = nullptr) {
    if (micro_batches_ == 1) {
      set_batch(s);
      run_step(model_, &optimizer(), Phase::TrainStep, *timer_, listener ? listener : sync());
      return model_.mean_loss();
    }
    double loss = 0;
    const int64_t part = shard_.size() / micro_batches_;
    const MicroBatches micro{micro_batches_, [&](int i) { set_batch(s, shard_.begin + i * part, part); },
                             [&](int) { loss += model_.mean_loss() / micro_batches_; }};
    run_step(model_, &optimizer(), Phase::TrainStep, *timer_, listener ? listener : sync(), nullptr, &micro);
    return loss;
  }
  // This rank's mean loss on global batch `s` without training (a forward only).
  double evaluate(int s) {
    set_batch(s);
    model_.forward();
    return model_.mean_loss();
  }

  // The parameters (not the padding) on the host, once every one has arrived.
  std::vector<float> params() {
    if (shards()) return shards()->gathered_parameters();
    model_.wait_parameters();
    return download(env_.device(), model_.params().slice(0, {model_.layout().total()}));
  }
  // The averaged gradients the last optimizer read (none under zero2 and zero3, which let them go
  // after the optimizer).
  std::vector<float> grads() {
    if (shards()) return {};
    return download(env_.device(), model_.grads().slice(0, {model_.layout().total()}));
  }
  // The parameters' padding (ZeRO-1's), which must stay zero.
  std::vector<float> padding() {
    model_.wait_parameters();
    const int64_t total = model_.layout().total();
    return download(env_.device(), model_.params().slice(total, {model_.params().numel() - total}));
  }

  TransformerLM& model() { return model_; }
  AdamW& optimizer() { return training_->optimizer(); }
  UnitShards* shards() { return training_->shards(); }  // zero2, zero3: what holds the parameters
  const SyncPlan& plan() const { return plan_; }
  GradientSync* sync() { return training_->sync(); }

 private:
  // Sequences [first, first + count) of global batch `s` (default: this rank's share).
  void set_batch(int s, int64_t first = -1, int64_t count = -1) {
    const ModelConfig c = tiny_transformer();
    const int64_t T = c.context_length;
    const TokenBatch b = global_batch(c, s);
    if (first < 0) first = shard_.begin, count = shard_.size();
    model_.set_batch(b.tokens.data() + first * T, b.targets.data() + first * T, count, T);
  }

  Env& env_;
  SyncPlan plan_;
  TransformerLM model_;
  Shard shard_;
  int micro_batches_;
  std::unique_ptr<Timer> timer_;
  std::unique_ptr<DataParallelTraining> training_;  // gone before the model
};

// What a training run leaves behind.
struct Training {
  std::vector<float> params;
  std::vector<double> losses;      // this rank's mean loss of each step, before its update
  std::vector<float> grads;        // the gradients the first step's optimizer saw
  SyncStats stats;                 // of the last step
  std::vector<double> grad_norms;  // each step's, where the optimizer clipped
};

// `wait_every_step`: every parameter arrives right after each step (model.wait_parameters()),
// as before the next forward waited for them range by range.
inline Training train_transformer(Env& env, const DataParallel* dist, int steps, Precision precision = Precision::FP32,
                                  MemoryPlan memory = MemoryPlan::Fast, bool wait_every_step = false,
                                  double max_grad_norm = 0, int micro_batches = 1,
                                  GradientDType grads = GradientDType::Master) {
  TransformerRun run(env, dist, precision, memory, max_grad_norm, micro_batches, grads);
  Training out;
  for (int s = 0; s < steps; ++s) {
    out.losses.push_back(run.step(s));
    if (max_grad_norm > 0) out.grad_norms.push_back(run.optimizer().last_grad_norm());
    if (wait_every_step) run.model().wait_parameters();
    if (s == 0) out.grads = run.grads();
    if (run.sync()) out.stats = run.sync()->stats();
  }
  out.params = run.params();
  return out;
}

}  // namespace llmhpc::test

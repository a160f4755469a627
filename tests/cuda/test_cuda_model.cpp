// The whole model on the GPU against the CPU backend in fp64: loss and every parameter's
// gradient in fp32; loss and gradients within bf16 bounds under mixed precision; a few
// AdamW training steps with matching losses; parameters arriving range by range (a sharded
// optimizer's all-gathers) with the bf16 weights refreshed per range, bitwise; an
// out-of-memory model that leaves the device usable for the next one (what a bench sweep
// relies on).
#include <cmath>
#include <random>

#include "kernels/cuda/cuda_device.h"
#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/model/transformer.h"
#include "tests/cuda/cuda_test_util.h"

namespace llmhpc::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible"

constexpr int64_t kBatch = 2, kSeq = 16;

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 64;
  c.context_length = kSeq;
  c.d_model = 64;
  c.d_ff = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(std::mt19937_64& rng, int64_t vocab) {
  std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab - 1));
  Batch b;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    b.tokens.push_back(pick(rng));
    b.targets.push_back(pick(rng));
  }
  return b;
}

// One model on the CPU in fp64 (the reference) and one on the GPU, same weights and data;
// the backends and the seed come from CudaVsCpu.
class CudaModel : public CudaVsCpu {
 protected:
  void TearDown() override {
    gpu_model_.reset();
    cpu_model_.reset();
    CudaVsCpu::TearDown();
  }

  void build(Precision gpu_precision) {
    const ModelConfig c = small_config();
    cpu_model_ = std::make_unique<TransformerLM>(TransformerLM::Config{c, Precision::FP64, AttentionKind::Naive},
                                                 *cpu_.device, *cpu_.ops);
    gpu_model_ = std::make_unique<TransformerLM>(TransformerLM::Config{c, gpu_precision, AttentionKind::Naive},
                                                 *gpu_.device, *gpu_.ops);
    cpu_model_->init_parameters(seed_);
    gpu_model_->init_parameters(seed_);
  }

  // Forward and backward on both; returns {gpu loss, cpu loss}.
  std::pair<double, double> forward_backward() {
    const Batch b = random_batch(rng_, small_config().vocab_size);
    std::pair<double, double> loss;
    for (TransformerLM* m : {gpu_model_.get(), cpu_model_.get()}) {
      m->set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
      m->forward();
      (m == gpu_model_.get() ? loss.first : loss.second) = m->mean_loss();
      m->backward();
    }
    return loss;
  }

  std::vector<double> grad(TransformerLM& m, Backend& b, const std::string& name) {
    return read_tensor(*b.device, m.grad(name));
  }

  std::unique_ptr<TransformerLM> cpu_model_, gpu_model_;
};

TEST_F(CudaModel, Fp32LossAndGradientsMatchCpu) {
  build(Precision::FP32);
  const auto [gpu_loss, cpu_loss] = forward_backward();
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * cpu_loss) << seed_note();
  double worst = 0;
  for (const ParamInfo& p : cpu_model_->layout().params()) {
    const double e = max_rel_error(grad(*gpu_model_, gpu_, p.name), grad(*cpu_model_, cpu_, p.name));
    EXPECT_LE(e, 1e-4) << p.name << ", " << seed_note();
    if (!(e <= worst)) worst = e;
  }
  std::printf("fp32 model: loss %.8f vs %.8f, worst per-tensor gradient error %.2e\n", gpu_loss, cpu_loss, worst);
}

// Mixed precision rounds every matrix-product result to bf16 (one unit each, a few per
// layer, partly cancelling): the loss within 8 units, each gradient within 25 units in
// the L2 sense.
TEST_F(CudaModel, Bf16LossAndGradientsWithinBounds) {
  build(Precision::BF16);
  const auto [gpu_loss, cpu_loss] = forward_backward();
  EXPECT_NEAR(gpu_loss, cpu_loss, 8 * kBf16Unit * cpu_loss) << seed_note();
  double worst = 0;
  for (const ParamInfo& p : cpu_model_->layout().params()) {
    const double e = l2_rel_error(grad(*gpu_model_, gpu_, p.name), grad(*cpu_model_, cpu_, p.name));
    EXPECT_LE(e, 25 * kBf16Unit) << p.name << ", " << seed_note();
    if (!(e <= worst)) worst = e;
  }
  std::printf("bf16 model: loss %.6f vs %.6f, worst per-tensor gradient L2 error %.2e\n", gpu_loss, cpu_loss, worst);
}

TEST_F(CudaModel, Fp32TrainingStepsMatchCpuLosses) {
  build(Precision::FP32);
  const AdamWHyper h{3e-3, 0.9, 0.95, 1e-8, 0.1};
  AdamW gpu_opt(*gpu_model_, *gpu_.ops, h), cpu_opt(*cpu_model_, *cpu_.ops, h);
  for (int step = 1; step <= 4; ++step) {
    const auto [gpu_loss, cpu_loss] = forward_backward();
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * cpu_loss) << "step " << step << ", " << seed_note();
    gpu_opt.step();
    cpu_opt.step();
  }
  // Per tensor, as a whole (L2): AdamW divides by sqrt(v) + eps, so an element whose gradient
  // is near zero turns last-bit differences of fp32 sums into visible ones; single elements
  // are not a fair measure (tests/scripts/test_reference_torch.py explains it too).
  for (const ParamInfo& p : cpu_model_->layout().params()) {
    const double e = l2_rel_error(read_tensor(*gpu_.device, gpu_model_->param(p.name)),
                                  read_tensor(*cpu_.device, cpu_model_->param(p.name)));
    EXPECT_LE(e, 1e-4) << p.name << " after 4 steps, " << seed_note();
  }
}

// --grad-dtype bf16 on the GPU: the same forward (bitwise the loss), each gradient within one
// bf16 rounding of the fp32 gradient (the products may sum in another order when they store
// bf16), micro-batches added up in bf16 (GEMM beta 1 on bf16, the norm gains' and embedding's
// sums) within two, and AdamW with clipping reading them trains as it does on fp32 gradients.
TEST(CudaModelGradients, Bf16GradientsStayWithinTheirRoundingOfFp32Gradients) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  const ModelConfig c = small_config();
  auto timer = gpu.device->make_timer(kStepMarks);
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash}) {
    TransformerLM m32({c, Precision::BF16, attention}, *gpu.device, *gpu.ops),
        m16({c, Precision::BF16, attention, MemoryPlan::Fast, 0, GradientStorage::Whole, GradientDType::BF16},
            *gpu.device, *gpu.ops);
    ASSERT_EQ(m16.grads().dtype, DType::BF16);
    for (TransformerLM* m : {&m32, &m16}) m->init_parameters(21);
    std::mt19937_64 rng(4);
    const Batch b1 = random_batch(rng, c.vocab_size), b2 = random_batch(rng, c.vocab_size);
    double losses[2];
    for (int k = 0; k < 2; ++k) {
      TransformerLM& m = k ? m16 : m32;
      m.set_batch(b1.tokens.data(), b1.targets.data(), kBatch, kSeq);
      m.forward();
      losses[k] = m.mean_loss();
      m.backward();
    }
    const std::string what = attention_name(attention);
    EXPECT_EQ(losses[1], losses[0]) << what;
    for (const ParamInfo& p : m32.layout().params())
      EXPECT_LE(l2_rel_error(read_tensor(*gpu.device, m16.grad(p.name)), read_tensor(*gpu.device, m32.grad(p.name))),
                kBf16Unit)
          << p.name << ", " << what;
    for (TransformerLM* m : {&m32, &m16}) {
      m->set_batch(b2.tokens.data(), b2.targets.data(), kBatch, kSeq);
      m->forward();
      m->backward(nullptr, /*accumulate=*/true);
    }
    for (const ParamInfo& p : m32.layout().params())
      EXPECT_LE(l2_rel_error(read_tensor(*gpu.device, m16.grad(p.name)), read_tensor(*gpu.device, m32.grad(p.name))),
                2 * kBf16Unit)
          << p.name << " added up over two micro-batches, " << what;
    std::vector<double> trained[2];
    for (int k = 0; k < 2; ++k) {
      TransformerLM& m = k ? m16 : m32;
      AdamW opt(m, *gpu.ops, AdamWHyper{3e-3, 0.9, 0.95, 1e-8, 0.1});
      opt.set_clipping({0.5, {}});
      std::mt19937_64 steps_rng(8);  // the same batches for both
      for (int step = 0; step < 4; ++step) {
        const Batch b = random_batch(steps_rng, c.vocab_size);
        m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
        run_step(m, &opt, Phase::TrainStep, *timer);
        EXPECT_TRUE(std::isfinite(opt.last_grad_norm())) << what;
      }
      trained[k] = read_tensor(*gpu.device, m.params().slice(0, {m.layout().total()}));
    }
    EXPECT_LE(l2_rel_error(trained[1], trained[0]), 25 * kBf16Unit) << "weights after 4 clipped steps, " << what;
    EXPECT_NE(trained[1], trained[0]) << "the bf16 gradients changed nothing";
  }
}

// --low-memory on the GPU: bf16 weights cast one layer at a time give bitwise the losses,
// gradients and weights of the default plan (a bf16 copy of all weights, which AdamW keeps
// current) over AdamW steps (which change the weights the casts read), with flash and naive
// attention; and the peak is lower by at least the copy it leaves out.
// --cuda-graph: forward and backward replayed from a graph recorded after one eager step, AdamW
// after each replay, train bitwise like eager steps on new batches each step (the graph reads
// the batch buffers set_batch fills); forward-backward and forward replays give the same losses.
TEST(CudaModelGraphs, StepsReplayedFromAGraphTrainBitwiseLikeEagerSteps) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  const ModelConfig c = small_config();
  auto timer = gpu.device->make_timer(kStepMarks);
  for (Precision precision : {Precision::FP32, Precision::BF16})
    for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash})
      for (Phase phase : {Phase::TrainStep, Phase::ForwardBackward, Phase::Forward}) {
        std::vector<double> losses[2];
        std::vector<char> params[2];
        for (int graphed = 0; graphed < 2; ++graphed) {
          TransformerLM m({c, precision, attention}, *gpu.device, *gpu.ops);
          m.init_parameters(13);
          AdamW opt(m, *gpu.ops, AdamWHyper{3e-3, 0.9, 0.95, 1e-8, 0.1});
          std::unique_ptr<GraphedStep> graph;
          std::mt19937_64 rng(9);
          for (int step = 0; step < 4; ++step) {
            const Batch b = random_batch(rng, c.vocab_size);
            m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
            if (graphed && step == 1) graph = std::make_unique<GraphedStep>(m, &opt, phase);
            const StepTimes t = graph ? graph->run(*timer) : run_step(m, &opt, phase, *timer);
            EXPECT_GT(t.step_ms, 0.0);
            losses[graphed].push_back(m.mean_loss());
          }
          params[graphed] = read_bytes(*gpu.device, m.params());
        }
        const std::string what =
            std::string(precision_name(precision)) + " " + attention_name(attention) + " " + phase_name(phase);
        EXPECT_EQ(losses[0], losses[1]) << what;
        EXPECT_TRUE(params[0] == params[1]) << what;
        if (phase == Phase::TrainStep) EXPECT_NE(losses[0][0], losses[0][3]) << what << ": the weights moved";
      }
}

// The blocks a graph's work used stay out of the cache while it lives (its replays write them),
// and go back when it is destroyed.
TEST(CudaModelGraphs, AGraphHoldsItsBlocksUntilDestroyed) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  auto& cache = static_cast<CudaDevice&>(*gpu.device).caching_allocator();
  const ModelConfig c = small_config();
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *gpu.device, *gpu.ops);
  m.init_parameters(1);
  std::mt19937_64 rng(2);
  const Batch b = random_batch(rng, c.vocab_size);
  m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
  auto timer = gpu.device->make_timer(kStepMarks);
  run_step(m, nullptr, Phase::ForwardBackward, *timer);  // activations freed after backward: cached
  const size_t cached = cache.cached_bytes();
  ASSERT_GT(cached, 0u);
  {
    GraphedStep graph(m, nullptr, Phase::ForwardBackward);
    EXPECT_LT(cache.cached_bytes(), cached) << "the activations the graph writes are not in the cache";
    graph.run(*timer);
  }
  EXPECT_EQ(cache.cached_bytes(), cached);
}

// A graph recorded before any eager step finds nothing in the cache: what it allocates comes from
// cudaMalloc while capturing, and the replays train like eager steps.
TEST(CudaModelGraphs, RecordedWithoutAWarmUpItTrainsLikeEagerSteps) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  static_cast<CudaDevice&>(*gpu.device).caching_allocator().release_cache();
  const ModelConfig c = small_config();
  auto timer = gpu.device->make_timer(kStepMarks);
  std::vector<double> losses[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *gpu.device, *gpu.ops);
    m.init_parameters(17);
    std::mt19937_64 rng(4);
    std::unique_ptr<GraphedStep> graph;
    if (graphed) {
      const Batch b = random_batch(rng, c.vocab_size);
      m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
      rng.seed(4);
      graph = std::make_unique<GraphedStep>(m, nullptr, Phase::ForwardBackward);
    }
    for (int step = 0; step < 3; ++step) {
      const Batch b = random_batch(rng, c.vocab_size);
      m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
      if (graph) graph->run(*timer);
      else run_step(m, nullptr, Phase::ForwardBackward, *timer);
      losses[graphed].push_back(m.mean_loss());
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(CudaModelMemory, LowMemoryPlanGivesBitwiseTheSameTrainingInLessMemory) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  const ModelConfig c = small_config();
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash}) {
    std::vector<double> losses[2];
    std::vector<std::vector<char>> grads[2], params[2];
    int64_t peak[2] = {0, 0};
    for (int plan = 0; plan < 2; ++plan) {
      TracingAllocator& a = gpu.device->allocator();
      const int64_t before = a.live_bytes();
      a.reset_peak();
      TransformerLM m({c, Precision::BF16, attention, plan == 0 ? MemoryPlan::Fast : MemoryPlan::LowMemory},
                      *gpu.device, *gpu.ops);
      m.init_parameters(11);
      AdamW opt(m, *gpu.ops, AdamWHyper{3e-3, 0.9, 0.95, 1e-8, 0.1});
      std::mt19937_64 rng(5);
      for (int step = 0; step < 3; ++step) {
        const Batch b = random_batch(rng, c.vocab_size);
        m.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
        m.forward();
        losses[plan].push_back(m.mean_loss());
        m.backward();
        grads[plan].push_back(read_bytes(*gpu.device, m.grads()));
        opt.step();
      }
      params[plan].push_back(read_bytes(*gpu.device, m.params()));
      gpu.device->synchronize();
      peak[plan] = a.peak_bytes() - before;
    }
    const char* name = attention_name(attention);
    EXPECT_EQ(losses[0], losses[1]) << name;
    for (size_t k = 0; k < grads[0].size(); ++k) EXPECT_TRUE(grads[0][k] == grads[1][k]) << name << " step " << k;
    EXPECT_TRUE(params[0] == params[1]) << name;
    // Left out: the bf16 copy of all weights but one layer and the LM head.
    const ParameterLayout layout(c);
    const auto layer = layout.layer_range(0);
    const int64_t left_out =
        2 * (layout.total() - (layer.second - layer.first) - layout.find("lm_head.weight").shape.numel());
    EXPECT_LE(peak[1], peak[0] - left_out) << name << ": peak " << peak[1] << " vs " << peak[0];
    std::printf("%s: peak %lld B (default) vs %lld B (--low-memory)\n", name, (long long)peak[0], (long long)peak[1]);
  }
}

// Stands in for a sharded optimizer's all-gathers on the device: the fp32 weights (and so the
// bf16 copy refreshed from them) are NaN until forward asks for a range, and then the real
// values arrive; a range read before it was asked for, or whose bf16 copy was not refreshed
// after it arrived, poisons the loss.
struct LateArrival : ParallelHooks {
  TransformerLM& model;
  std::vector<float> real;
  explicit LateArrival(TransformerLM& m) : model(m) {
    const Tensor p = m.params();
    real.resize(size_t(p.numel()));
    m.device().copy_to_host(real.data(), p.data, p.bytes());
    const std::vector<float> nan(real.size(), NAN);
    m.device().copy_to_device(p.data, nan.data(), p.bytes());
    m.parameters_changed();  // the bf16 copy NaN too
  }
  void gradients_final(int64_t, int64_t) override {}
  void parameters_needed(int64_t begin, int64_t end) override {
    model.device().copy_to_device(static_cast<float*>(model.params().data) + begin, real.data() + begin,
                                  size_t(end - begin) * sizeof(float));
  }
};

TEST(CudaModelMemory, ArrivingParametersRefreshTheBf16WeightsRangeByRange) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend();
  const ModelConfig c = small_config();
  std::mt19937_64 rng(3);
  const Batch b = random_batch(rng, c.vocab_size);
  for (MemoryPlan plan : {MemoryPlan::Fast, MemoryPlan::LowMemory}) {
    const char* name = plan == MemoryPlan::Fast ? "bf16 copy" : "--low-memory";
    TransformerLM want({c, Precision::BF16, AttentionKind::Flash, plan}, *gpu.device, *gpu.ops),
        got({c, Precision::BF16, AttentionKind::Flash, plan}, *gpu.device, *gpu.ops);
    want.init_parameters(21);
    got.init_parameters(21);
    LateArrival arrival(got);
    got.parameters_arriving(arrival);
    for (TransformerLM* m : {&want, &got}) {
      m->set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
      m->forward();
      m->backward();
    }
    EXPECT_EQ(got.mean_loss(), want.mean_loss()) << name;
    EXPECT_TRUE(read_bytes(*gpu.device, got.grads()) == read_bytes(*gpu.device, want.grads())) << name;
    if (plan == MemoryPlan::Fast)
      EXPECT_TRUE(read_bytes(*gpu.device, got.params_lowp()) == read_bytes(*gpu.device, want.params_lowp()))
          << "the bf16 copy refreshed range by range is the one converted at once";
  }
}

// A model too large for the memory limit throws OutOfMemory; the device then runs the
// next, smaller model normally.
TEST(CudaModelMemory, OutOfMemoryModelLeavesTheDeviceUsable) {
  SKIP_WITHOUT_GPU();
  Backend gpu = make_gpu_backend(size_t(96) << 20);  // 96 MiB, of which 32 MiB cuBLAS workspace
  ModelConfig big = small_config();
  big.d_model = 512;
  big.num_heads = 8;
  big.vocab_size = 20000;  // 2 x 20000 x 512 fp32 = 78 MiB of weights, and as much for gradients
  EXPECT_THROW(TransformerLM({big, Precision::FP32, AttentionKind::Naive}, *gpu.device, *gpu.ops), OutOfMemory);
  EXPECT_EQ(gpu.device->allocator().live_bytes(), int64_t(32) << 20) << "the failed model left allocations behind";
  TransformerLM small({small_config(), Precision::BF16, AttentionKind::Naive}, *gpu.device, *gpu.ops);
  small.init_parameters(7);
  std::mt19937_64 rng(7);
  const Batch b = random_batch(rng, small_config().vocab_size);
  small.set_batch(b.tokens.data(), b.targets.data(), kBatch, kSeq);
  small.forward();
  const double loss = small.mean_loss();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(double(small_config().vocab_size)), 2.0);
}

}  // namespace
}  // namespace llmhpc::test

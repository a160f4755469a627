// The whole model: gradients against finite differences in fp64, fp32 against fp64, the
// gradient-ready ranges backward reports, the parameter ranges forward asks for while
// parameters arrive (a sharded optimizer's all-gathers), and the initialisation of
// transformer.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/model/transformer.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.context_length = 6;
  c.d_model = 8;
  c.d_ff = 12;
  c.num_layers = 2;
  c.num_heads = 2;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int64_t B, T;
};

Batch random_batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T), B, T};
  for (auto& t : b.tokens) t = int32_t(rng() % uint64_t(c.vocab_size));
  for (auto& t : b.targets) t = int32_t(rng() % uint64_t(c.vocab_size));
  return b;
}

double loss_of(TransformerLM& m, const Batch& b) {
  m.set_batch(b.tokens.data(), b.targets.data(), b.B, b.T);
  m.forward();
  return m.mean_loss();
}

TEST(Model, GradientsMatchFiniteDifferencesInFp64) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m({c, Precision::FP64, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(7);
  const Batch b = random_batch(c, 2, 5, 99);
  loss_of(m, b);
  m.backward();
  double* p = m.params().ptr<double>();
  const double* g = m.grads().ptr<double>();
  // Every parameter, each by central differences.
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < m.layout().total(); ++i) {
    const double orig = p[i], eps = 1e-6;
    p[i] = orig + eps;
    const double up = loss_of(m, b);
    p[i] = orig - eps;
    const double down = loss_of(m, b);
    p[i] = orig;
    worst = std::max(worst, std::fabs((up - down) / (2 * eps) - g[i]));
    scale = std::max(scale, std::fabs(g[i]));
  }
  EXPECT_GT(scale, 1e-3);  // the gradient is not trivially zero
  EXPECT_LT(worst / scale, 1e-7) << "worst abs error " << worst;
}

TEST(Model, Fp32AgreesWithFp64) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m64({c, Precision::FP64, AttentionKind::Naive}, *be.device, *be.ops);
  TransformerLM m32({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  m32.init_parameters(3);
  // Same weights in both: copy fp32 values into the fp64 model.
  for (int64_t i = 0; i < m32.layout().total(); ++i) m64.params().ptr<double>()[i] = m32.params().ptr<float>()[i];
  const Batch b = random_batch(c, 3, 6, 5);
  const double l32 = loss_of(m32, b), l64 = loss_of(m64, b);
  EXPECT_NEAR(l32, l64, 1e-6 * std::fabs(l64));
  m32.backward();
  m64.backward();
  std::vector<double> g32(m32.layout().total()), g64(g32.size());
  for (size_t i = 0; i < g32.size(); ++i) {
    g32[i] = m32.grads().ptr<float>()[i];
    g64[i] = m64.grads().ptr<double>()[i];
  }
  EXPECT_LT(rel_error(g32, g64), 1e-5);
}

std::vector<double> grads_of(TransformerLM& m) {
  std::vector<double> g(size_t(m.layout().total()));
  to_doubles(m.grads().data, m.grads().dtype, g.size(), g.data());
  return g;
}

// Mixed precision on the CPU: the fp32 weights' bf16 copy feeds every matrix product, so the
// loss and gradients move off fp32's by bf16's rounding (2^-9 relative per value, compounding
// through two layers) but no further; the low-memory plan, which casts one
// layer's weights at a time instead, gives bitwise the same. Naive and flash attention alike.
TEST(Model, Bf16StaysWithinItsRoundingOfFp32AndLowMemoryIsBitwiseTheSame) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  const Batch b = random_batch(c, 3, 6, 5);
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash}) {
    TransformerLM m32({c, Precision::FP32, attention}, *be.device, *be.ops),
        fast({c, Precision::BF16, attention}, *be.device, *be.ops),
        low({c, Precision::BF16, attention, MemoryPlan::LowMemory}, *be.device, *be.ops);
    for (TransformerLM* m : {&m32, &fast, &low}) m->init_parameters(3);
    ASSERT_EQ(fast.params_lowp().dtype, DType::BF16) << "the Fast plan keeps a bf16 copy of every weight";
    EXPECT_TRUE(low.params_lowp().empty());
    const double l32 = loss_of(m32, b), lfast = loss_of(fast, b), llow = loss_of(low, b);
    EXPECT_NE(lfast, l32) << "nothing was rounded to bf16";
    EXPECT_NEAR(lfast, l32, std::ldexp(l32, -8)) << "more than one bf16 step apart (measured: 4.6e-4 relative)";
    EXPECT_EQ(llow, lfast);
    for (TransformerLM* m : {&m32, &fast, &low}) m->backward();
    const std::vector<double> g32 = grads_of(m32), gfast = grads_of(fast);
    EXPECT_LT(rel_error(gfast, g32), 3e-2) << "measured: 8.5e-3";
    EXPECT_GT(rel_error(gfast, g32), 0.0);
    EXPECT_EQ(grads_of(low), gfast);
  }
}

// --grad-dtype bf16 on the CPU: each gradient is computed in fp32 and rounded once where it is
// stored, so it is bitwise the fp32 gradient rounded to bf16 (forward is untouched), in one
// flat buffer or range by range; AdamW, clipping included, reads bf16 gradients as it would
// read fp32 ones holding the same values; micro-batches add up within bf16's rounding.
TEST(Model, Bf16GradientsAreTheFp32GradientsRoundedOnce) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  const Batch b = random_batch(c, 3, 6, 5), b2 = random_batch(c, 3, 6, 6);
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash}) {
    TransformerLM m32({c, Precision::BF16, attention}, *be.device, *be.ops),
        m16({c, Precision::BF16, attention, MemoryPlan::Fast, 0, GradientStorage::Whole, GradientDType::BF16},
            *be.device, *be.ops);
    for (TransformerLM* m : {&m32, &m16}) m->init_parameters(3);
    ASSERT_EQ(m16.grads().dtype, DType::BF16);
    ASSERT_EQ(m32.grads().dtype, DType::F32);
    EXPECT_EQ(loss_of(m16, b), loss_of(m32, b));
    for (TransformerLM* m : {&m32, &m16}) m->backward();
    const std::vector<double> g32 = grads_of(m32), g16 = grads_of(m16);
    int64_t rounded = 0;
    for (size_t i = 0; i < g32.size(); ++i) {
      ASSERT_EQ(g16[i], double(round_to_bf16(float(g32[i])))) << "element " << i;
      rounded += g16[i] != g32[i];
    }
    EXPECT_GT(rounded, int64_t(g32.size()) / 2) << "the fp32 gradients were mostly not bf16 values already";

    // AdamW with clipping: the bf16 gradients against the fp32 ones rounded in place.
    for (int64_t i = 0; i < m32.layout().total(); ++i) m32.grads().ptr<float>()[i] = float(g16[size_t(i)]);
    AdamW opt32(m32, *be.ops, AdamWHyper{}), opt16(m16, *be.ops, AdamWHyper{});
    for (AdamW* o : {&opt32, &opt16}) o->set_clipping({0.1, {}});
    opt32.step();
    opt16.step();
    EXPECT_EQ(opt16.last_grad_norm(), opt32.last_grad_norm());
    const Tensor p32 = m32.params(), p16 = m16.params();
    for (int64_t i = 0; i < m32.layout().total(); ++i)
      ASSERT_EQ(p16.ptr<float>()[i], p32.ptr<float>()[i]) << "parameter " << i << " after AdamW";

    // Two micro-batches: bf16 sums, each within its rounding of the fp32 sum.
    for (TransformerLM* m : {&m32, &m16}) {
      loss_of(*m, b);
      m->backward();
      loss_of(*m, b2);
      m->backward(nullptr, true);
    }
    EXPECT_LT(rel_error(grads_of(m16), grads_of(m32)), std::ldexp(1.0, -7));
  }
  // Range by range (GradientStorage::PerRange, AdamW inside backward on bf16 windows): bitwise
  // the weights of AdamW after backward on the whole bf16 buffer.
  TransformerLM whole(
      {c, Precision::BF16, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::Whole, GradientDType::BF16},
      *be.device, *be.ops),
      ranged({c, Precision::BF16, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::PerRange,
              GradientDType::BF16},
             *be.device, *be.ops);
  AdamW opt_whole(whole, *be.ops, AdamWHyper{}), opt_ranged(ranged, *be.ops, AdamWHyper{});
  auto timer = be.device->make_timer(kStepMarks);
  for (TransformerLM* m : {&whole, &ranged}) m->init_parameters(3);
  for (const Batch* batch : {&b, &b2})
    for (auto [m, o] : {std::pair{&whole, &opt_whole}, std::pair{&ranged, &opt_ranged}}) {
      m->set_batch(batch->tokens.data(), batch->targets.data(), batch->B, batch->T);
      run_step(*m, o, Phase::TrainStep, *timer);
    }
  EXPECT_EQ(ranged.gradients(0, 4).dtype, DType::BF16);
  for (int64_t i = 0; i < whole.layout().total(); ++i)
    ASSERT_EQ(ranged.params().ptr<float>()[i], whole.params().ptr<float>()[i]) << "parameter " << i;
  EXPECT_THROW(TransformerLM({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::Whole,
                              GradientDType::BF16},
                             *be.device, *be.ops),
               UsageError);
}

TEST(Model, BackwardOverwritesGradientsOrAccumulatesThemOnRequest) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m({c, Precision::FP64, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(4);
  const Batch b = random_batch(c, 2, 4, 8);
  loss_of(m, b);
  m.backward();
  const std::vector<double> once(m.grads().ptr<double>(), m.grads().ptr<double>() + m.layout().total());
  std::fill(m.grads().ptr<double>(), m.grads().ptr<double>() + m.layout().total(), 123.0);  // stale values
  loss_of(m, b);
  m.backward();
  for (int64_t i = 0; i < m.layout().total(); ++i) ASSERT_EQ(m.grads().ptr<double>()[i], once[i]) << i;
  loss_of(m, b);
  m.backward(nullptr, true);
  for (int64_t i = 0; i < m.layout().total(); ++i) ASSERT_NEAR(m.grads().ptr<double>()[i], 2 * once[i], 1e-12) << i;
}

TEST(Model, LossAtInitialisationIsNearLogVocab) {
  Backend be = cpu_backend();
  ModelConfig c = tiny_config();
  c.vocab_size = 500;
  c.d_model = 32;
  c.num_heads = 4;
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(1);
  const double loss = loss_of(m, random_batch(c, 2, 6, 1));
  // Random weights give a spread of logits, so the loss is above log(V) but of its order.
  EXPECT_GT(loss, std::log(500.0) * 0.8);
  EXPECT_LT(loss, std::log(500.0) * 4.0);
}

struct RangeLog : ParallelHooks {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  void gradients_final(int64_t begin, int64_t end) override { ranges.emplace_back(begin, end); }
};

TEST(Model, BackwardReportsEveryParameterOnceFromTheEnd) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(1);
  loss_of(m, random_batch(c, 1, 4, 2));
  RangeLog log;
  m.backward(&log);
  ASSERT_EQ(log.ranges.size(), size_t(c.num_layers + 2));
  int64_t expected_end = m.layout().total();
  for (auto [begin, end] : log.ranges) {  // contiguous, descending, covering everything
    EXPECT_EQ(end, expected_end);
    EXPECT_LT(begin, end);
    expected_end = begin;
  }
  EXPECT_EQ(expected_end, 0);
}

// Stands in for a sharded optimizer's all-gathers: after finish_parameters() the parameters
// are NaN until someone asks for them, and then the real values arrive; so a range that
// forward read before asking for it poisons the loss.
struct LateArrival : ParallelHooks {
  TransformerLM& model;
  std::vector<float> real;
  std::vector<std::pair<int64_t, int64_t>> asked;
  explicit LateArrival(TransformerLM& m) : model(m) {}
  void gradients_final(int64_t, int64_t) override {}
  bool finish_parameters() override {
    float* p = model.params().ptr<float>();
    real.assign(p, p + model.params().numel());
    std::fill(p, p + model.params().numel(), NAN);
    return true;
  }
  void parameters_needed(int64_t begin, int64_t end) override {
    asked.emplace_back(begin, end);
    std::copy(real.begin() + begin, real.begin() + end, model.params().ptr<float>() + begin);
  }
};

TEST(Model, ForwardAsksForEachParameterRangeBeforeReadingIt) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(5);
  const Batch b = random_batch(c, 2, 6, 3);
  const double want = loss_of(m, b);
  m.backward();
  const std::vector<float> want_grads(m.grads().ptr<float>(), m.grads().ptr<float>() + m.layout().total());

  LateArrival arrival(m);
  ASSERT_TRUE(arrival.finish_parameters());
  m.parameters_arriving(arrival);
  EXPECT_EQ(loss_of(m, b), want) << "forward read a range before asking for it";
  m.backward();
  for (int64_t i = 0; i < m.layout().total(); ++i) ASSERT_EQ(m.grads().ptr<float>()[i], want_grads[i]) << i;
  // In forward order: the embedding, each layer, the final norm with the head; all of them once.
  ASSERT_EQ(arrival.asked.size(), size_t(c.num_layers + 2));
  int64_t expected_begin = 0;
  for (auto [begin, end] : arrival.asked) {
    EXPECT_EQ(begin, expected_begin);
    EXPECT_LT(begin, end);
    expected_begin = end;
  }
  EXPECT_EQ(expected_begin, m.layout().total());
  loss_of(m, b);
  EXPECT_EQ(arrival.asked.size(), size_t(c.num_layers + 2)) << "arrived: the next forward asks for nothing";
}

TEST(Model, WaitParametersAsksForAllOfThemAtOnce) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, ParameterLayout(c).total() + 64},
                  *be.device, *be.ops);  // padded, as under zero1
  m.init_parameters(5);
  m.wait_parameters();  // nothing arriving: nothing to do
  LateArrival arrival(m);
  arrival.finish_parameters();
  m.parameters_arriving(arrival);
  m.wait_parameters();
  EXPECT_EQ(arrival.asked, (std::vector<std::pair<int64_t, int64_t>>{{0, m.params().numel()}})) << "padding too";
  for (int64_t i = 0; i < m.params().numel(); ++i) ASSERT_EQ(m.params().ptr<float>()[i], arrival.real[i]) << i;
  loss_of(m, random_batch(c, 1, 4, 2));
  EXPECT_EQ(arrival.asked.size(), 1u);
}

// run_step hands arriving parameters to the next step's forward: training with a listener
// whose parameters arrive only when asked for is bitwise training without one.
TEST(Model, RunStepLetsTheNextForwardWaitForArrivingParameters) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM plain({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops),
      late({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  plain.init_parameters(9);
  late.init_parameters(9);
  AdamW opt_plain(plain, *be.ops, AdamWHyper{}), opt_late(late, *be.ops, AdamWHyper{});
  LateArrival arrival(late);
  auto timer = be.device->make_timer(kStepMarks);
  for (int step = 0; step < 3; ++step) {
    const Batch b = random_batch(c, 2, 6, 10 + uint64_t(step));
    plain.set_batch(b.tokens.data(), b.targets.data(), b.B, b.T);
    late.set_batch(b.tokens.data(), b.targets.data(), b.B, b.T);
    run_step(plain, &opt_plain, Phase::TrainStep, *timer);
    run_step(late, &opt_late, Phase::TrainStep, *timer, &arrival);
    EXPECT_EQ(late.mean_loss(), plain.mean_loss()) << "step " << step;
  }
  EXPECT_EQ(arrival.asked.size(), size_t(2 * (c.num_layers + 2))) << "steps 2 and 3 asked for every range";
  late.wait_parameters();
  for (int64_t i = 0; i < c.num_params(); ++i) ASSERT_EQ(late.params().ptr<float>()[i], plain.params().ptr<float>()[i]);
}

TEST(Model, InitialisationFollowsTheSpec) {
  Backend be = cpu_backend();
  ModelConfig c = tiny_config();
  c.vocab_size = 1000;
  c.d_model = 64;
  c.d_ff = 96;
  c.num_heads = 4;
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  m.init_parameters(42);
  for (const ParamInfo& p : m.layout().params()) {
    const Tensor t = m.param(p.name);
    const float* v = t.ptr<float>();
    const int64_t n = t.numel();
    if (p.shape.ndim == 1) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 1.0f) << p.name;
      continue;
    }
    const double sigma = p.is_matrix ? std::sqrt(2.0 / double(p.shape[0] + p.shape[1])) : 1.0;
    double sum = 0, sq = 0, mx = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += v[i];
      sq += double(v[i]) * v[i];
      mx = std::max(mx, std::fabs(double(v[i])));
    }
    const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    EXPECT_LE(mx, 3 * sigma * (1 + 1e-6)) << p.name << " exceeds the 3-sigma truncation";
    // A normal truncated at 3 sigma has std 0.9866 sigma.
    EXPECT_NEAR(std, 0.9866 * sigma, 0.05 * sigma) << p.name;
    EXPECT_NEAR(mean, 0.0, 5 * sigma / std::sqrt(double(n))) << p.name;
  }
}

TEST(Model, InitialisationIsDeterministicPerSeed) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM a({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops),
      b({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops),
      d({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  a.init_parameters(5);
  b.init_parameters(5);
  d.init_parameters(6);
  EXPECT_EQ(0, std::memcmp(a.params().data, b.params().data, a.params().bytes()));
  EXPECT_NE(0, std::memcmp(a.params().data, d.params().data, a.params().bytes()));
}

TEST(Model, OutOfMemoryIsAnExceptionNotACrash) {
  BackendOptions opt;
  opt.memory_limit = 64 * 1024;  // far too small for the parameters
  Backend be = make_cpu_backend(opt);
  ModelConfig c = tiny_config();
  c.vocab_size = 10000;
  EXPECT_THROW(TransformerLM({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops), OutOfMemory);
  EXPECT_EQ(be.device->allocator().live_bytes(), 0);  // nothing leaked
}

TEST(ModelConfig, ValidationNamesTheProblem) {
  ModelConfig c = tiny_config();
  c.num_heads = 3;
  try {
    c.validate();
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos);
  }
  c = tiny_config();
  c.d_model = 0;
  EXPECT_THROW(c.validate(), UsageError);
  EXPECT_THROW(preset_config("huge"), UsageError);
  EXPECT_EQ(preset_config("2.7B").d_model, 2560);
}

TEST(ModelConfig, ParameterCountsMatchTheLayout) {
  for (const ModelPreset& p : model_presets()) {
    ModelConfig c = preset_config(p.name);
    ParameterLayout layout(c);
    EXPECT_EQ(layout.total(), c.num_params()) << p.name;
  }
  // small: 2 * 10000 * 768 embeddings/head + 12 layers of (4 d^2 + 3 d d_ff + 2 d) + d.
  EXPECT_EQ(preset_config("small").num_params(),
            2 * 10000 * 768 + 12 * (4 * 768 * 768 + 3 * 768 * 3072 + 2 * 768) + 768);
}

// The CPU device's root attributes: its model and threads.
TEST(CpuDevice, EnvironmentNamesTheCpu) {
  Backend b = make_backend(BackendOptions{});
  bool model = false, threads = false;
  for (const auto& [name, value] : b.device->environment()) {
    if (name == "cpu_model") model = !std::get<std::string>(value).empty();
    if (name == "cpu_threads") threads = std::get<int64_t>(value) >= 1;
  }
  EXPECT_TRUE(model);
  EXPECT_TRUE(threads);
}

}  // namespace
}  // namespace llmhpc::test

// AdamW against steps computed by hand from torch.optim.AdamW's documented algorithm.
#include <gtest/gtest.h>

#include "src/model/adamw.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

// The documented algorithm, one scalar at a time, in double.
struct HandAdamW {
  double p, m = 0, v = 0;
  void step(double g, const AdamWHyper& h, int t) {
    p -= h.lr * h.weight_decay * p;
    m = h.beta1 * m + (1 - h.beta1) * g;
    v = h.beta2 * v + (1 - h.beta2) * g * g;
    const double m_hat = m / (1 - std::pow(h.beta1, t)), v_hat = v / (1 - std::pow(h.beta2, t));
    p -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
  }
};

class AdamWSteps : public ::testing::TestWithParam<DType> {};

TEST_P(AdamWSteps, MatchHandComputedSteps) {
  const DType dt = GetParam();
  Backend be = cpu_backend();
  AdamWHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.1;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  h.eps = 1e-6;
  const int64_t n = 5;
  HostTensor p(*be.device, dt, {n}), g(*be.device, dt, {n}), m(*be.device, dt, {n}), v(*be.device, dt, {n});
  std::vector<HandAdamW> ref;
  const double init[n] = {0.5, -1.25, 2.0, 0.0, 1e-3};
  for (int64_t i = 0; i < n; ++i) {
    p.set(i, init[i]);
    ref.push_back({p.get(i)});
  }
  for (int t = 1; t <= 4; ++t) {
    for (int64_t i = 0; i < n; ++i) g.set(i, std::sin(1.7 * double(i + 1) * t));  // varying gradients
    be.ops->adamw_step(p, g, m, v, Tensor(), h, t);
    for (int64_t i = 0; i < n; ++i) ref[i].step(g.get(i), h, t);
    for (int64_t i = 0; i < n; ++i) {
      const double tol = dt == DType::F64 ? 1e-13 : 2e-6;
      EXPECT_NEAR(p.get(i), ref[i].p, tol * std::max(1.0, std::fabs(ref[i].p))) << "step " << t << " elem " << i;
      EXPECT_NEAR(m.get(i), ref[i].m, tol) << "step " << t;
      EXPECT_NEAR(v.get(i), ref[i].v, tol) << "step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp32AndFp64, AdamWSteps, ::testing::Values(DType::F32, DType::F64));

TEST(AdamW, ShardedRangesGiveTheSameResultAsTheWhole) {
  Backend be = cpu_backend();
  ModelConfig c;
  c.vocab_size = 13;
  c.d_model = 8;
  c.d_ff = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.context_length = 4;
  TransformerLM whole(c, Precision::FP32, AttentionKind::Naive, *be.device, *be.ops);
  TransformerLM split(c, Precision::FP32, AttentionKind::Naive, *be.device, *be.ops);
  whole.init_parameters(1);
  split.init_parameters(1);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < whole.layout().total(); ++i) whole.grads().ptr<float>()[i] = split.grads().ptr<float>()[i] = nd(rng);
  AdamW a(whole, *be.ops, AdamWHyper{});
  const int64_t total = whole.layout().total(), cut = total / 3;
  AdamW s1(split, *be.ops, AdamWHyper{}, 0, cut), s2(split, *be.ops, AdamWHyper{}, cut, total);
  for (int k = 0; k < 3; ++k) {
    a.step();
    s1.step();
    s2.step();
  }
  EXPECT_EQ(0, std::memcmp(whole.params().data, split.params().data, whole.params().bytes()));
}

}  // namespace
}  // namespace llmhpc::test

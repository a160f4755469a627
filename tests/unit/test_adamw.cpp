// AdamW against steps computed by hand from torch.optim.AdamW's documented algorithm.
#include <gtest/gtest.h>

#include "src/model/adamw.h"
#include "src/model/train_step.h"
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

// Hears which ranges the optimizer reports updated, in order.
struct UpdateLog final : GradientListener {
  std::vector<FlatRange> updated;
  void on_gradients_ready(int64_t, int64_t) override {}
  void on_parameters_updated(int64_t begin, int64_t end) override { updated.push_back({begin, end}); }
};

// What makes a sharded optimizer bitwise the unsharded one: owners of disjoint ranges (in any
// order, several per owner, some empty) together update the parameters exactly as one
// optimizer of the whole model does, and each keeps exactly its ranges' m and v, packed.
TEST(AdamW, OwnersOfDisjointRangesTogetherGiveTheWholeBitwise) {
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
  const int64_t total = whole.layout().total(), cut1 = total / 3, cut2 = 2 * total / 3;
  AdamW a(whole, *be.ops, AdamWHyper{});
  const std::vector<FlatRange> owned1 = {{cut2, total}, {0, 5}}, owned2 = {{5, cut1}, {cut1, cut1}},
                               owned3 = {{cut1, cut2}};
  AdamW s1(split, *be.ops, AdamWHyper{}, owned1), s2(split, *be.ops, AdamWHyper{}, owned2),
      s3(split, *be.ops, AdamWHyper{}, owned3);
  EXPECT_EQ(a.owned(), (std::vector<FlatRange>{{0, total}})) << "no ranges: the whole model";
  EXPECT_EQ(s1.owned_elements() + s2.owned_elements() + s3.owned_elements(), total);
  EXPECT_FALSE(s1.has_state()) << "state appears with the first step";
  EXPECT_EQ(model_memory(be.device->allocator()).of("optimizer"), 0);
  UpdateLog log;
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < total; ++i) whole.grads().ptr<float>()[i] = split.grads().ptr<float>()[i] = nd(rng);
    a.step();
    s1.step(&log);
    s2.step();
    s3.step();
  }
  EXPECT_EQ(0, std::memcmp(whole.params().data, split.params().data, whole.params().bytes()));
  EXPECT_EQ(log.updated.size(), 3 * owned1.size());
  EXPECT_EQ(log.updated.front(), owned1.front());
  EXPECT_EQ(log.updated.back(), owned1.back());
  // s1's state: the whole optimizer's [cut2, total) and then [0, 5).
  const int64_t tail = total - cut2;
  EXPECT_EQ(0, std::memcmp(s1.m().ptr<float>(), a.m().ptr<float>() + cut2, size_t(tail) * 4));
  EXPECT_EQ(0, std::memcmp(s1.v().ptr<float>() + tail, a.v().ptr<float>(), 5 * 4));
  EXPECT_EQ(model_memory(be.device->allocator()).of("optimizer"), 2 * 4 * (total + total))
      << "m and v of the whole model, once for `a` and once among the owners";
}

TEST(AdamWDeathTest, OverlappingOrOutsideRangesAreFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: MPI is initialised anew
  Backend be = cpu_backend();
  ModelConfig c{"custom", 13, 4, 8, 8, 1, 2};
  TransformerLM m(c, Precision::FP32, AttentionKind::Naive, *be.device, *be.ops);
  const int64_t total = m.layout().total();
  EXPECT_DEATH(AdamW(m, *be.ops, AdamWHyper{}, {{0, 10}, {5, 20}}), "overlap");
  EXPECT_DEATH(AdamW(m, *be.ops, AdamWHyper{}, {{0, total + 1}}), "outside");
}

}  // namespace
}  // namespace llmhpc::test

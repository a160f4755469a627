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

// Clipping's factor is applied to the gradient first, in its dtype: bitwise the step on the
// gradient scaled beforehand (what torch's clip_grad_norm_ leaves for the optimizer).
TEST_P(AdamWSteps, GradScaleIsTheStepOnTheScaledGradientBitwise) {
  const DType dt = GetParam();
  Backend be = cpu_backend();
  const int64_t n = 37;
  std::mt19937_64 rng(5);
  HostTensor p1(*be.device, dt, {n}), p2(*be.device, dt, {n}), g(*be.device, dt, {n}), g_scaled(*be.device, dt, {n});
  HostTensor m1(*be.device, dt, {n}), v1(*be.device, dt, {n}), m2(*be.device, dt, {n}), v2(*be.device, dt, {n});
  p1.fill_normal(rng);
  p2.copy_from(p1);
  AdamWHyper scaled, plain;
  for (int t = 1; t <= 3; ++t) {
    g.fill_normal(rng);
    scaled.grad_scale = 0.3 / t;
    const double factor = dt == DType::F32 ? double(float(scaled.grad_scale)) : scaled.grad_scale;
    for (int64_t i = 0; i < n; ++i) g_scaled.set(i, g.get(i) * factor);  // one rounding, as the dtype's product
    be.ops->adamw_step(p1, g, m1, v1, Tensor(), scaled, t);
    be.ops->adamw_step(p2, g_scaled, m2, v2, Tensor(), plain, t);
  }
  EXPECT_EQ(p1.values(), p2.values());
  EXPECT_EQ(m1.values(), m2.values());
  EXPECT_EQ(v1.values(), v2.values());
}

INSTANTIATE_TEST_SUITE_P(Fp32AndFp64, AdamWSteps, ::testing::Values(DType::F32, DType::F64));

// vocab 13, context 4, d_model 8, d_ff 8, one layer of two heads.
ModelConfig tiny_config() { return ModelConfig{"custom", 13, 4, 8, 8, 1, 2}; }

double squares_of(const TransformerLM& model, FlatRange r) {
  double sum = 0;
  for (int64_t i = r.begin; i < r.end; ++i)
    sum += double(model.grads().ptr<float>()[i]) * model.grads().ptr<float>()[i];
  return sum;
}

// clip_grad_norm_'s rule: the norm of every gradient, and above max_norm the gradients scaled by
// max_norm / (norm + 1e-6) before the update; at or below it (and with max_norm inf) the step
// is the unclipped one, bitwise.
TEST(AdamW, ClippingScalesByTorchsFactorAndKeepsTheNorm) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  for (double fraction : {0.25, 2.0, double(INFINITY)}) {
    TransformerLM clipped({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
    TransformerLM by_hand({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
    clipped.init_parameters(1);
    by_hand.init_parameters(1);
    const int64_t total = clipped.layout().total();
    AdamW a(clipped, *be.ops, AdamWHyper{}), b(by_hand, *be.ops, AdamWHyper{});
    EXPECT_TRUE(std::isnan(a.last_grad_norm())) << "no norm before a clipped step";
    for (int k = 0; k < 3; ++k) {
      for (int64_t i = 0; i < total; ++i) clipped.grads().ptr<float>()[i] = by_hand.grads().ptr<float>()[i] = nd(rng);
      const double norm = std::sqrt(squares_of(clipped, {0, total}));
      a.set_clipping({fraction * norm, nullptr});
      a.step();
      EXPECT_NEAR(a.last_grad_norm(), norm, 1e-12 * norm) << "max_norm " << fraction << " x the norm";
      if (fraction < 1) {  // torch's factor, from the norm the optimizer found, as an fp32 product
        const float factor = float(fraction * norm / (a.last_grad_norm() + 1e-6));
        for (int64_t i = 0; i < total; ++i) by_hand.grads().ptr<float>()[i] *= factor;
      }
      b.step();
    }
    EXPECT_EQ(0, std::memcmp(clipped.params().data, by_hand.params().data, clipped.params().bytes()))
        << "max_norm " << fraction << " x the norm";
  }
}

// A sharded optimizer's owners each add the squares of their own ranges (never the padding),
// and clip by the norm their sums make together.
TEST(AdamW, ShardedOwnersClipByTheNormOfAllTheirRanges) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM whole({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  TransformerLM split({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, ParameterLayout(c).total() + 8},
                      *be.device, *be.ops);
  whole.init_parameters(2);
  split.init_parameters(2);
  const int64_t total = whole.layout().total(), padded = split.params().numel(), cut = total / 2;
  ASSERT_GT(padded, total) << "the padding is part of the test";
  const std::vector<FlatRange> owned1 = {{cut, padded}}, owned2 = {{0, cut}};
  AdamW a(whole, *be.ops, AdamWHyper{}), s1(split, *be.ops, AdamWHyper{}, owned1),
      s2(split, *be.ops, AdamWHyper{}, owned2);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < padded; ++i) {
    split.grads().ptr<float>()[i] = i < total ? nd(rng) : 1e3f;  // padding the norm must not see
    if (i < total) whole.grads().ptr<float>()[i] = split.grads().ptr<float>()[i];
  }
  HostTensor sum(*be.device, DType::F64, {1});
  be.ops->sum_of_squares(sum, whole.grads(), {{0, total}});  // what the unsharded optimizer adds up
  const double all = sum.get(0);
  std::vector<double> heard;
  // Each owner's sum goes in; the sum over both comes back (what Runtime::sum_in_rank_order gives).
  auto over_ranks = [&](double mine) {
    heard.push_back(mine);
    return all;
  };
  a.set_clipping({0.5, nullptr});
  s1.set_clipping({0.5, over_ranks});
  s2.set_clipping({0.5, over_ranks});
  a.step();
  s1.step();
  s2.step();
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_NEAR(heard[0], squares_of(whole, {cut, total}), 1e-12 * all);
  EXPECT_NEAR(heard[1], squares_of(whole, {0, cut}), 1e-12 * all);
  EXPECT_EQ(s1.last_grad_norm(), a.last_grad_norm());
  EXPECT_EQ(0, std::memcmp(whole.params().data, split.params().data, whole.params().bytes()))
      << "owners together update as one clipped optimizer";
}

// Hears which ranges the optimizer reports updated, in order.
struct UpdateLog final : ParallelHooks {
  std::vector<FlatRange> updated;
  void gradients_final(int64_t, int64_t) override {}
  void parameters_updated(int64_t begin, int64_t end) override { updated.push_back({begin, end}); }
};

// What makes a sharded optimizer bitwise the unsharded one: owners of disjoint ranges (in any
// order, several per owner, some empty) together update the parameters exactly as one
// optimizer of the whole model does, and each keeps exactly its ranges' m and v, packed.
TEST(AdamW, OwnersOfDisjointRangesTogetherGiveTheWholeBitwise) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  TransformerLM whole({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  TransformerLM split({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
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
  TransformerLM m({c, Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  const int64_t total = m.layout().total();
  EXPECT_DEATH(AdamW(m, *be.ops, AdamWHyper{}, {{0, 10}, {5, 20}}), "overlap");
  EXPECT_DEATH(AdamW(m, *be.ops, AdamWHyper{}, {{0, total + 1}}), "outside");
}

}  // namespace
}  // namespace llmhpc::test

// The CUPTI profiler on a GPU (skips without one): a tiny model's kernels counted per phase
// exactly as kernels/cuda/cuda_ops.cu and src/model/transformer.cpp launch them, no record
// dropped or unattributed over 10 train steps of 2.7B, every step tracing the same
// kernels, device spans that nest, CUPTI released between windows, and the event fallback.
#include <gtest/gtest.h>

#include <map>

#include "kernels/backend.h"
#include "src/core/nvtx.h"
#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/model/transformer.h"
#include "tests/cuda/cuda_test_util.h"

namespace llmhpc::test {
namespace {

class Keep final : public ActivitySink {
 public:
  void on_activity(const Activity& a) override { all.push_back(a); }
  std::vector<Activity> all;
};

// A model of vocabulary 128.
ModelConfig shape(int64_t d, int64_t ff, int64_t layers, int64_t heads, int64_t T) {
  return ModelConfig{"custom", 128, T, d, ff, layers, heads};
}

// A model on the GPU profiled by make_profiler's choice, its train steps as mode profile runs them.
class Profiled : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
    be_ = make_gpu_backend();
  }
  void build(const ModelConfig& c, int64_t batch, Precision precision, AttentionKind attention,
             bool activities = true) {
    p_ = make_profiler(be_, activities);
    model_ = std::make_unique<TransformerLM>(TransformerLM::Config{c, precision, attention}, *be_.device, p_->ops());
    model_->init_parameters(3);
    opt_ = std::make_unique<AdamW>(*model_, p_->ops(), AdamWHyper{});
    std::vector<int32_t> tokens(batch * c.context_length), targets(tokens.size());
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = int32_t(k % 128), targets[k] = int32_t((7 * k) % 128);
    model_->set_batch(tokens.data(), targets.data(), batch, c.context_length);
    step();  // warm-up outside the window: cuBLAS's first calls, the allocator's first blocks
    be_.device->synchronize();
  }
  void step() {
    NvtxRange range("step");
    model_->forward();
    model_->backward();
    opt_->step();
  }
  void window(int steps) {
    kept_.all.clear();
    p_->start(kept_);
    for (int s = 0; s < steps; ++s) {
      p_->set_step(s);
      step();
    }
    p_->stop();
  }
  std::string path(const Activity& a) const { return a.phase >= 0 ? p_->phases()[a.phase].path : ""; }
  std::string category(const Activity& a) const { return activity_category(p_->names()[a.name], a.kind); }
  // A matrix product's own kernel: cuBLAS's split-K reduction or a separate epilogue, when it
  // picks one, is a second kernel of the same product and is not counted.
  bool gemm(const Activity& a) const {
    const std::string& name = p_->names()[a.name];
    return category(a) == "matmul" && name.find("educe") == std::string::npos &&
           name.find("epilogue") == std::string::npos;
  }

  Backend be_;
  std::unique_ptr<Profiler> p_;
  std::unique_ptr<TransformerLM> model_;
  std::unique_ptr<AdamW> opt_;
  Keep kept_;
};

TEST_F(Profiled, TinyModelKernelsPerPhaseAreExactlyTheLaunches) {
  const int64_t B = 2, L = 2;
  build(shape(64, 128, L, 4, 16), B, Precision::FP32, AttentionKind::Naive);
  ASSERT_EQ(p_->method(), "cupti") << "GPU hosts have libcupti; " << p_->note();
  window(1);
  EXPECT_EQ(p_->dropped(), 0);
  EXPECT_EQ(p_->unattributed(), 0);
  std::map<std::string, int> gemms, softmax, memsets, optimizer, all;
  for (const Activity& a : kept_.all) {
    const std::string where = path(a);
    ++all[where];
    if (gemm(a)) ++gemms[where];
    if (p_->names()[a.name].find("softmax") != std::string::npos) ++softmax[where];
    if (a.kind == ActivityKind::Memset) ++memsets[where];
    if (category(a) == "optimizer") ++optimizer[where];
  }
  // Forward: the LM head; per layer qkv, output projection, w1|w3, w2; naive attention one
  // strided-batched GEMM per batch element for the scores and one for P V, one softmax kernel.
  EXPECT_EQ(gemms["step/forward"], 1);
  // Backward: the LM head's two; per layer w2 (dx, dw), w1|w3, output projection and qkv (2
  // each): 8; attention per batch element dP and dV (value_matmul), dQ and dK (scores), one
  // softmax backward kernel.
  EXPECT_EQ(gemms["step/backward"], 2);
  for (int64_t l = 0; l < L; ++l) {
    const std::string f = "step/forward/layer " + std::to_string(l), b = "step/backward/layer " + std::to_string(l);
    EXPECT_EQ(gemms[f], 4) << f;
    EXPECT_EQ(gemms[f + "/scores"], B) << f;
    EXPECT_EQ(gemms[f + "/value_matmul"], B) << f;
    EXPECT_EQ(softmax[f + "/softmax"], 1) << f;
    EXPECT_EQ(all[f + "/softmax"], 1) << f;
    EXPECT_EQ(gemms[b], 8) << b;
    EXPECT_EQ(gemms[b + "/value_matmul"], 2 * B) << b;
    EXPECT_EQ(gemms[b + "/scores"], 2 * B) << b;
    EXPECT_EQ(softmax[b + "/softmax"], B) << b;
    EXPECT_EQ(all[b + "/softmax"], B) << b;
  }
  // Backward zeroes the residual gradient and the embedding gradient with memsets (CUB's sort
  // in embedding_backward may add its own); AdamW is one kernel.
  EXPECT_GE(memsets["step/backward"], 2);
  EXPECT_EQ(optimizer["step/optimizer"], 1);
  EXPECT_EQ(all["step/optimizer"], 1);
  EXPECT_EQ(all["step"], 0) << "every kernel of the step is inside forward, backward or the optimizer";

  // Device spans: every range that launched something, inside its parent's span.
  for (const PhaseRange& r : p_->ranges()) {
    ASSERT_GE(r.device_start_ns, 0) << p_->phases()[r.phase].path << " launched nothing?";
    EXPECT_LE(r.device_start_ns, r.device_end_ns);
    if (r.parent < 0) continue;
    EXPECT_LE(p_->ranges()[r.parent].device_start_ns, r.device_start_ns);
    EXPECT_GE(p_->ranges()[r.parent].device_end_ns, r.device_end_ns);
  }
  for (const Activity& a : kept_.all) {
    EXPECT_GT(a.end_ns, a.start_ns);
    if (a.kind == ActivityKind::Kernel) EXPECT_GT(a.grid[0] * a.block[0], 0) << p_->names()[a.name];
  }
}

// --cuda-graph: a train step replayed from a graph (forward and backward recorded, AdamW after
// it) traces the same kernels in the same phases as the eager step, none unattributed.
TEST_F(Profiled, AStepReplayedFromAGraphHasTheEagerKernelsInTheSamePhases) {
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash}) {
    build(shape(64, 128, 2, 4, 16), 2, Precision::BF16, attention);
    ASSERT_EQ(p_->method(), "cupti") << p_->note();
    auto count = [&] {
      std::map<std::pair<std::string, std::string>, int> n;  // (phase path, kernel) -> instances in step 1
      for (const Activity& a : kept_.all)
        if (a.step == 1) ++n[{path(a), p_->names()[a.name]}];
      return n;
    };
    window(2);
    const auto eager = count();
    auto timer = be_.device->make_timer(kStepMarks);
    std::unique_ptr<GraphedStep> graph;
    p_->record_graph([&] {
      NvtxRange range("step");
      graph = std::make_unique<GraphedStep>(*model_, opt_.get(), Phase::TrainStep);
    });
    kept_.all.clear();
    p_->start(kept_);
    for (int s = 0; s < 2; ++s) {
      p_->set_step(s);
      NvtxRange range("step");
      graph->run(*timer);
    }
    p_->stop();
    EXPECT_EQ(p_->unattributed(), 0) << attention_name(attention);
    EXPECT_EQ(p_->dropped(), 0) << attention_name(attention);
    const auto replayed = count();
    EXPECT_EQ(replayed, eager) << attention_name(attention);
  }
}

TEST_F(Profiled, FlashAttentionKernelsAreInItsPhases) {
  build(shape(128, 256, 2, 2, 64), 2, Precision::BF16, AttentionKind::Flash);
  ASSERT_EQ(p_->method(), "cupti") << p_->note();
  window(1);
  int forward = 0, backward = 0;
  for (const Activity& a : kept_.all) {
    const std::string where = path(a);
    if (where.find("/flash_attention_backward") != std::string::npos) ++backward;
    else if (where.find("/flash_attention") != std::string::npos) ++forward;
    else continue;
    if (a.kind == ActivityKind::Kernel) EXPECT_EQ(category(a), "attention") << p_->names()[a.name];
  }
  EXPECT_EQ(forward, 2) << "one flash forward kernel per layer";
  EXPECT_GE(backward, 2 * 2) << "per layer at least the delta and a dK/dV/dQ kernel";
}

TEST_F(Profiled, TenStepsOf27BLoseNothingAndEveryStepTracesTheSameKernels) {
  // 2.7B's shape (a vocabulary of 128), context 128, batch 4, fp32 train steps: some 40 GB.
  const int steps = 10;
  build(shape(2560, 10240, 32, 32, 128), 4, Precision::FP32, AttentionKind::Naive);
  ASSERT_EQ(p_->method(), "cupti") << p_->note();
  window(steps);
  EXPECT_EQ(p_->dropped(), 0);
  EXPECT_EQ(p_->unattributed(), 0);
  std::vector<int64_t> per_step(steps, 0);
  for (const Activity& a : kept_.all) {
    ASSERT_TRUE(a.step >= 0 && a.step < steps);
    ++per_step[a.step];
  }
  for (int s = 1; s < steps; ++s) EXPECT_EQ(per_step[s], per_step[0]) << "step " << s;
  // Per layer at least forward's 4 GEMMs, 2 x 4 attention GEMMs and a softmax, backward's 8 + 4 x 4 + 4.
  EXPECT_GE(per_step[0], 32 * (4 + 8 + 1 + 8 + 16 + 4)) << "kernels missing";
}

TEST_F(Profiled, CuptiIsReleasedBetweenWindows) {
  build(shape(64, 128, 2, 4, 16), 2, Precision::FP32, AttentionKind::Naive);
  ASSERT_EQ(p_->method(), "cupti") << p_->note();
  window(1);
  EXPECT_GT(p_->activities(), 0);
  EXPECT_EQ(phase_listener(), nullptr);
  step();  // between windows: CUPTI disabled, nothing recorded
  be_.device->synchronize();
  window(0);  // an empty window: its final flush would deliver the step above if CUPTI had kept tracing
  EXPECT_EQ(p_->activities(), 0);
  EXPECT_TRUE(kept_.all.empty());
}

TEST_F(Profiled, WithoutCuptiPhasesAreTimedWithEvents) {
  build(shape(64, 128, 2, 4, 16), 2, Precision::FP32, AttentionKind::Naive, false);
  EXPECT_EQ(p_->method(), "phase events");
  window(2);
  EXPECT_TRUE(kept_.all.empty());
  for (const PhaseRange& r : p_->ranges()) {
    EXPECT_GE(r.device_start_ns, 0);
    EXPECT_GE(r.device_end_ns, r.device_start_ns);
  }
}

}  // namespace
}  // namespace llmhpc::test

// The memory and precision modes' pieces on the GPU: AdamW inside backward bitwise the
// separate optimizer (fp32 and bf16, naive and flash) with 4 bytes per parameter less; the
// allocation trace of a bf16 step balanced, its peak the allocator's and its snapshot
// complete; the accumulation experiment bitwise the CPU's. Skips without a GPU.
#include <algorithm>
#include <gtest/gtest.h>

#include "src/io/memory_snapshot.h"
#include "src/model/train_step.h"
#include "src/modes/memory_trace.h"
#include "tests/cuda/cuda_test_util.h"

namespace llmhpc::test {
namespace {

ModelConfig config() {
  ModelConfig c;
  c.vocab_size = 512;
  c.context_length = 128;
  c.d_model = 128;
  c.d_ff = 384;
  c.num_layers = 3;
  c.num_heads = 2;
  return c;
}

std::vector<int32_t> batch(int64_t n, int salt) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = int32_t((i * 131 + salt * 17) % 512);
  return t;
}

struct PlanCase {
  Precision precision;
  AttentionKind attention;
};

class CudaOptimizerInBackward : public ::testing::TestWithParam<PlanCase> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  }
};

TEST_P(CudaOptimizerInBackward, BitwiseTheSeparateOptimizerWithLessMemory) {
  const PlanCase pc = GetParam();
  std::vector<std::vector<char>> params, lowp;
  int64_t peaks[2];
  for (GradientStorage g : {GradientStorage::Whole, GradientStorage::PerRange}) {
    Backend be = make_gpu_backend();
    TracingAllocator& alloc = be.device->allocator();
    TransformerLM model({config(), pc.precision, pc.attention, MemoryPlan::Fast, 0, g}, *be.device, *be.ops);
    model.init_parameters(11);
    AdamW opt(model, *be.ops, AdamWHyper{});
    auto timer = be.device->make_timer(kStepMarks);
    alloc.reset_peak();
    for (int s = 0; s < 3; ++s) {
      const auto x = batch(2 * 128, s), y = batch(2 * 128, s + 1);
      model.set_batch(x.data(), y.data(), 2, 128);
      run_step(model, &opt, Phase::TrainStep, *timer);
    }
    be.device->synchronize();
    params.push_back(read_bytes(*be.device, model.params()));
    if (!model.params_lowp().empty()) lowp.push_back(read_bytes(*be.device, model.params_lowp()));
    peaks[int(g)] = alloc.peak_bytes();
  }
  EXPECT_TRUE(params[0] == params[1]) << "AdamW inside backward changed the weights";
  if (pc.precision == Precision::BF16) EXPECT_TRUE(lowp.size() == 2 && lowp[0] == lowp[1]);
  const ModelConfig c = config();
  const ParameterLayout layout(c);
  const auto layer = layout.layer_range(0);
  const int64_t largest = std::max(layer.second - layer.first, c.vocab_size * c.d_model + c.d_model);
  // Every gradient but the largest range's (a layer, or the head and final norm); more if the
  // peak falls in forward, before the first backward allocates that range (the CPU test,
  // whose peak is in backward, checks the equality).
  EXPECT_GE(peaks[0] - peaks[1], (c.num_params() - largest) * 4);
  EXPECT_LE(peaks[0] - peaks[1], c.num_params() * 4);
}

INSTANTIATE_TEST_SUITE_P(Plans, CudaOptimizerInBackward,
                         ::testing::Values(PlanCase{Precision::FP32, AttentionKind::Naive},
                                           PlanCase{Precision::BF16, AttentionKind::Flash},
                                           PlanCase{Precision::BF16, AttentionKind::Naive}));

TEST(CudaMemoryTrace, ABf16StepIsBalancedAndItsPeakIsTheAllocators) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  Backend be = make_gpu_backend();
  TracingAllocator& alloc = be.device->allocator();
  const std::vector<LiveAllocation> at_start = alloc.live_allocations();
  const double start = alloc.now_ms();
  alloc.reset_peak();
  alloc.set_recording(true);
  std::vector<PhaseMark> marks;
  auto mark = [&](const std::string& n) {
    alloc.set_phase(n);
    marks.push_back({n, alloc.now_ms(), alloc.live_bytes()});
  };
  mark("init");
  auto model = std::make_unique<TransformerLM>(TransformerLM::Config{config(), Precision::BF16, AttentionKind::Flash,
                                                                     MemoryPlan::Fast, 0, GradientStorage::PerRange},
                                               *be.device, *be.ops);
  model->init_parameters(3);
  AdamW opt(*model, *be.ops, AdamWHyper{});
  const auto x = batch(2 * 128, 0);
  model->set_batch(x.data(), x.data(), 2, 128);
  auto timer = be.device->make_timer(kStepMarks);
  run_step(*model, &opt, Phase::TrainStep, *timer, nullptr, [&](const char* n) { mark(n); });
  be.device->synchronize();
  alloc.set_recording(false);
  const TraceSummary s = summarize_trace(at_start, alloc.events(), marks, alloc.live_bytes(), 5);
  EXPECT_TRUE(s.balanced);
  EXPECT_EQ(s.peak, alloc.peak_bytes());
  EXPECT_EQ(s.at_peak.of("bf16 weights"), config().num_params() * 2);
  EXPECT_EQ(s.at_peak.of("parameters"), config().num_params() * 4);
  EXPECT_GT(s.at_peak.of("workspaces") + s.live_at_start, 0) << "cuBLAS's workspace is traced";
  const PyObject snap = memory_snapshot(at_start, alloc.events(), memory_categories(), start);
  int64_t live = 0;
  for (const PyObject& seg : snap.items()[0].items()) {
    const auto& keys = seg.keys();
    const size_t total = size_t(std::find(keys.begin(), keys.end(), "total_size") - keys.begin());
    ASSERT_LT(total, keys.size()) << "a segment without total_size";
    live += seg.items()[total].int_value();
  }
  EXPECT_EQ(live, alloc.live_bytes());
}

TEST(CudaPrecision, TheAccumulationExperimentIsTheCpus) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  Backend gpu = make_gpu_backend();
  Backend cpu = make_cpu_backend(BackendOptions{});
  Buffer g(gpu.device->allocator(), DType::F32, {4}, "test"), c(cpu.device->allocator(), DType::F32, {4}, "test");
  gpu.device->fill_zero(g.tensor().data, g.tensor().bytes());
  cpu.device->fill_zero(c.tensor().data, c.tensor().bytes());
  gpu.ops->accumulation_experiment(g, 0.01, 600);  // in two parts, as mode precision runs a long one
  gpu.ops->accumulation_experiment(g, 0.01, 400);
  cpu.ops->accumulation_experiment(c, 0.01, 1000);
  EXPECT_TRUE(read_bytes(*gpu.device, g) == read_bytes(*cpu.device, c));
  EXPECT_EQ(read_tensor(*gpu.device, g)[3], 4.0);
}

}  // namespace
}  // namespace llmhpc::test

// Mode profile's pieces on the CPU: the phase hook of NvtxRange, the CPU profiler's
// attribution of a tiny model's ops to the phases they ran in (counts known from the model's
// code), windows that record nothing outside them, the phase-event fallback, the category of
// known kernel names, the summary table's arithmetic, and the Chrome trace writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "kernels/backend.h"
#include "src/io/chrome_trace.h"
#include "src/model/adamw.h"
#include "src/model/transformer.h"
#include "src/modes/profile_report.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

class Heard final : public PhaseListener {
 public:
  void phase_push(const char* name) override { events.push_back(std::string("+") + name); }
  void phase_pop() override { events.push_back("-"); }
  std::vector<std::string> events;
};

TEST(PhaseHook, RangesReachTheListenerOnlyWhileItIsInstalled) {
  EXPECT_EQ(phase_listener(), nullptr) << "no listener unless a profiler window is open";
  Heard heard;
  { NvtxRange before("before"); }
  set_phase_listener(&heard);
  {
    NvtxRange outer("outer");
    { NvtxRange inner(std::string("inner")); }
  }
  std::unique_ptr<NvtxRange> open = std::make_unique<NvtxRange>("cut");
  set_phase_listener(nullptr);
  open.reset();  // closed after the listener left: it must not hear the pop
  { NvtxRange after("after"); }
  EXPECT_EQ(heard.events, (std::vector<std::string>{"+outer", "+inner", "-", "-", "+cut"}));
}

// Keeps every activity of a window.
class Keep final : public ActivitySink {
 public:
  void on_activity(const Activity& a) override { all.push_back(a); }
  std::vector<Activity> all;
};

// name, vocab, context, d_model, d_ff, layers, heads
const ModelConfig kTiny{"custom", 17, 8, 16, 24, 3, 2};

// One train step of a tiny model on `p`'s ops, inside a window, as mode profile runs it.
struct ProfiledStep {
  Backend be = cpu_backend();
  std::unique_ptr<Profiler> p;
  Keep kept;
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<AdamW> opt;

  explicit ProfiledStep(bool activities) : p(make_profiler(be, activities)) {
    model = std::make_unique<TransformerLM>(TransformerLM::Config{kTiny, Precision::FP32, AttentionKind::Naive},
                                            *be.device, p->ops());
    model->init_parameters(1);
    opt = std::make_unique<AdamW>(*model, p->ops(), AdamWHyper{});
    std::vector<int32_t> tokens(2 * 8), targets(2 * 8);
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = int32_t(k % 17), targets[k] = int32_t((3 * k) % 17);
    model->set_batch(tokens.data(), targets.data(), 2, 8);
  }
  void step() {
    NvtxRange range("step");
    model->forward();
    model->backward();
    opt->step();
  }
  void window(int steps) {
    p->start(kept);
    for (int s = 0; s < steps; ++s) {
      p->set_step(s);
      step();
    }
    p->stop();
  }
  // (phase path, activity name) -> count, over the window.
  std::map<std::pair<std::string, std::string>, int> counts() const {
    std::map<std::pair<std::string, std::string>, int> n;
    for (const Activity& a : kept.all) ++n[{a.phase >= 0 ? p->phases()[a.phase].path : "", p->names()[a.name]}];
    return n;
  }
};

TEST(CpuProfiler, EveryOpIsAttributedToThePhaseItRanIn) {
  ProfiledStep run(true);
  ASSERT_EQ(run.p->method(), "host ops");
  run.window(2);
  auto n = run.counts();
  const int steps = 2;
  // From src/model/transformer.cpp: per layer, forward runs 4 linear_forward (qkv, output
  // projection, w1|w3, w2) and one attention; backward 5 linear_backward (w2's input and weight
  // gradients apart, then w1|w3, output projection, qkv); the LM head once in each pass.
  for (int l = 0; l < 3; ++l) {
    const std::string layer = "layer " + std::to_string(l);
    EXPECT_EQ((n[{"step/forward/" + layer, "linear_forward"}]), 4 * steps) << layer;
    EXPECT_EQ((n[{"step/forward/" + layer, "attention_forward"}]), 1 * steps) << layer;
    EXPECT_EQ((n[{"step/backward/" + layer, "linear_backward"}]), 5 * steps) << layer;
    EXPECT_EQ((n[{"step/backward/" + layer, "attention_backward"}]), 1 * steps) << layer;
  }
  EXPECT_EQ((n[{"step/forward", "linear_forward"}]), 1 * steps);
  EXPECT_EQ((n[{"step/forward", "embedding_forward"}]), 1 * steps);
  EXPECT_EQ((n[{"step/backward", "linear_backward"}]), 1 * steps);
  EXPECT_EQ((n[{"step/backward", "embedding_backward"}]), 1 * steps);
  EXPECT_EQ((n[{"step/optimizer", "adamw_step"}]), 1 * steps);
  EXPECT_EQ(run.p->unattributed(), 0);
  EXPECT_EQ(run.p->dropped(), 0);
  EXPECT_EQ(run.p->activities(), int64_t(run.kept.all.size()));

  // Every activity: its range's phase and step, inside its range's times; ranges nest.
  const std::vector<PhaseRange>& ranges = run.p->ranges();
  for (const Activity& a : run.kept.all) {
    ASSERT_GE(a.range, 0);
    const PhaseRange& r = ranges[a.range];
    EXPECT_EQ(a.phase, r.phase);
    EXPECT_EQ(a.step, r.step);
    EXPECT_LE(r.host_start_ns, a.start_ns);
    EXPECT_LE(a.start_ns, a.end_ns);
    EXPECT_LE(a.end_ns, r.host_end_ns);
    EXPECT_EQ(a.kind, ActivityKind::Op);
  }
  for (const PhaseRange& r : ranges) {
    EXPECT_EQ(r.device_start_ns, r.host_start_ns) << "CPU ops run as they are called";
    EXPECT_EQ(r.device_end_ns, r.host_end_ns);
    if (r.parent < 0) continue;
    EXPECT_LE(ranges[r.parent].host_start_ns, r.host_start_ns);
    EXPECT_GE(ranges[r.parent].host_end_ns, r.host_end_ns);
    EXPECT_EQ(r.step, ranges[r.parent].step);
    EXPECT_EQ(run.p->phases()[r.phase].parent, ranges[r.parent].phase);
  }
  // Per step: step, forward, 3 layers each with the CPU attention's own range, backward, 3
  // layers, optimizer.
  EXPECT_EQ(ranges.size(), size_t(steps) * (1 + 1 + 3 * 2 + 1 + 3 + 1));
}

TEST(CpuProfiler, NothingIsRecordedOutsideAWindow) {
  ProfiledStep run(true);
  run.step();  // before any window
  run.window(1);
  const size_t in_window = run.kept.all.size();
  EXPECT_GT(in_window, 0u);
  EXPECT_EQ(phase_listener(), nullptr) << "stop() removes the listener";
  run.step();  // after it
  EXPECT_EQ(run.kept.all.size(), in_window);
  // A second window starts from empty ranges and counts, keeping the names' ids.
  const std::vector<std::string> names = run.p->names();
  run.window(1);
  EXPECT_EQ(run.p->activities(), int64_t(in_window));
  EXPECT_EQ(run.p->names(), names);
}

// The bookkeeping behind --cuda-graph (Profiler::record_graph), with a tracer that plays
// CUPTI's part: nodes noted in the ranges open while the graph is recorded, and replayed
// activities delivered with their node's recorded range under the range of their launch.
class GraphTracer final : public Profiler {
 public:
  GraphTracer() : Profiler(DeviceSpans::FromActivities) {}
  std::string method() const override { return "graph test"; }
  bool traces_activities() const override { return true; }
  Ops& ops() override { std::abort(); }
  int64_t open_range() const { return current_range(); }  // while recording: a node's range
  void replayed(int64_t launch, int64_t recorded, int64_t start_ns) {
    Activity a;
    a.name = intern_name("kernel " + std::to_string(recorded), ActivityKind::Kernel);
    a.range = launch;
    a.start_ns = start_ns;
    a.end_ns = start_ns + 5;
    deliver(a, recorded);
  }

 protected:
  void begin_window() override {}
  void end_window() override {}
  int64_t now_ns() override { return clock_ += 100; }

 private:
  int64_t clock_ = 0;
};

TEST(GraphReplay, ActivitiesGoToCopiesOfTheirRecordedRangesUnderTheirStep) {
  GraphTracer p;
  int64_t in_layer = -1, in_forward = -1, in_step = -1;
  p.record_graph([&] {
    NvtxRange step("step");
    {
      NvtxRange forward("forward");
      {
        NvtxRange layer("layer 0");
        in_layer = p.open_range();
      }
      in_forward = p.open_range();
    }
    in_step = p.open_range();
  });
  EXPECT_TRUE(p.ranges().empty()) << "the recording's ranges are not a window's";
  Keep kept;
  p.start(kept);
  for (int s = 0; s < 2; ++s) {
    p.set_step(s);
    NvtxRange step("step");
    const int64_t launch = p.open_range();
    p.replayed(launch, in_layer, 1000 * (s + 1));
    p.replayed(launch, in_forward, 1000 * (s + 1) + 10);
    p.replayed(launch, in_layer, 1000 * (s + 1) + 20);  // the same recorded range again: the same copy
    p.replayed(launch, in_step, 1000 * (s + 1) + 30);
    p.replayed(launch, -1, 1000 * (s + 1) + 40);  // a node not heard: the launch's range
  }
  p.stop();
  ASSERT_EQ(kept.all.size(), 10u);
  EXPECT_EQ(p.unattributed(), 0);
  const char* want[] = {"step/forward/layer 0", "step/forward", "step/forward/layer 0", "step", "step"};
  for (size_t k = 0; k < kept.all.size(); ++k) {
    const Activity& a = kept.all[k];
    EXPECT_EQ(p.phases()[a.phase].path, want[k % 5]) << k;
    EXPECT_EQ(a.step, int64_t(k / 5)) << k;
  }
  EXPECT_EQ(kept.all[0].range, kept.all[2].range);
  // Per step: the launch's own range and copies of forward and layer 0 under it.
  ASSERT_EQ(p.ranges().size(), 6u);
  for (const Activity& a : kept.all) {
    const PhaseRange& r = p.ranges()[a.range];
    int64_t top = a.range;
    while (p.ranges()[top].parent >= 0) top = p.ranges()[top].parent;
    const PhaseRange& root = p.ranges()[top];
    EXPECT_EQ(p.phases()[root.phase].path, "step");
    EXPECT_EQ(r.host_start_ns, root.host_start_ns) << "a copy has its launch's host times";
    EXPECT_EQ(r.host_end_ns, root.host_end_ns);
    EXPECT_LE(r.device_start_ns, a.start_ns);
    EXPECT_GE(r.device_end_ns, a.end_ns);
    EXPECT_LE(root.device_start_ns, r.device_start_ns) << "a copy lies inside its step's span";
  }
}

TEST(PhaseEventProfiler, TimesEveryRangeAndRecordsNoActivities) {
  ProfiledStep run(false);
  EXPECT_EQ(run.p->method(), "phase events");
  EXPECT_FALSE(run.p->traces_activities());
  EXPECT_NE(run.p->note().find("no_cupti"), std::string::npos);
  run.window(2);
  EXPECT_TRUE(run.kept.all.empty());
  EXPECT_EQ(run.p->activities(), 0);
  ASSERT_FALSE(run.p->ranges().empty());
  for (const PhaseRange& r : run.p->ranges()) {
    EXPECT_GE(r.device_start_ns, 0);
    EXPECT_GE(r.device_end_ns, r.device_start_ns);
    if (r.parent >= 0) {  // the marks are in stream order, so children lie inside parents
      EXPECT_LE(run.p->ranges()[r.parent].device_start_ns, r.device_start_ns);
      EXPECT_GE(run.p->ranges()[r.parent].device_end_ns, r.device_end_ns);
    }
  }
}

TEST(ActivityCategory, KnownKernelNames) {
  const std::vector<std::pair<std::string, std::string>> known = {
      {"sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4", "matmul"},
      {"ampere_sgemm_128x64_tn", "matmul"},
      {"nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "matmul"},
      {"void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(T1::Params)", "matmul"},
      {"void splitKreduce_kernel<32, 16, int, float, float, float>(cublasSplitKParams<float>)", "matmul"},
      {"linear_backward", "matmul"},
      {"void llmhpc::cuda::attention_softmax_forward_kernel<float>(float*, long, long, bool)", "attention"},
      {"void llmhpc::flash::flash_fwd_mma_kernel<Traits>(llmhpc::flash::FlashParams)", "attention"},
      {"attention_backward", "attention"},
      {"void llmhpc::cuda::rmsnorm_backward_kernel<float>(...)", "norm"},
      {"llmhpc::cuda::sum_partials_kernel(float*, float const*, int, long, bool)", "norm"},
      {"llmhpc::cuda::adamw_kernel(float*, float const*, float*, float*, bf16*, AdamWConstants, long)", "optimizer"},
      {"void llmhpc::cuda::swiglu_forward_kernel<float, float>(...)", "elementwise"},
      {"cross_entropy_backward", "elementwise"},
      {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"},
      {"ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"},
      {"void cub::DeviceRadixSortOnesweepKernel<...>", "other"}};
  for (const auto& [name, category] : known) EXPECT_EQ(activity_category(name, ActivityKind::Kernel), category) << name;
  EXPECT_STREQ(activity_category("[CUDA memcpy Host-to-Device]", ActivityKind::Memcpy), "memcpy");
  EXPECT_STREQ(activity_category("[CUDA memset]", ActivityKind::Memset), "memcpy");
}

TEST(ActivityCategory, AttentionParts) {
  EXPECT_EQ(attention_part("scores", "sm90_xmma_gemm", ActivityKind::Kernel), "scores");
  EXPECT_EQ(attention_part("softmax", "attention_softmax_forward_kernel", ActivityKind::Kernel), "softmax");
  EXPECT_EQ(attention_part("value_matmul", "nvjet_tst", ActivityKind::Kernel), "value_matmul");
  EXPECT_EQ(attention_part("flash_attention_backward", "flash_bwd_delta_kernel", ActivityKind::Kernel),
            "flash_bwd_delta_kernel");
  EXPECT_EQ(attention_part("layer 3", "attention_forward", ActivityKind::Op), "attention_forward");
  EXPECT_EQ(attention_part("layer 3", "linear_forward", ActivityKind::Op), "");
}

TEST(KernelSummary, ArithmeticOfKnownDurations) {
  const auto rows = kernel_rows(
      {{"b", {"matmul", {10}}}, {"a", {"norm", {1, 2, 3, 4}}}, {"c", {"other", {7, 1, 4}}}, {"d", {"other", {}}}});
  ASSERT_EQ(rows.size(), 3u) << "a name without instances has no row";
  // Totals 10, 10, 12: c first, then a and b (equal totals) by name.
  EXPECT_EQ(rows[0].name, "c");
  EXPECT_EQ(rows[1].name, "a");
  EXPECT_EQ(rows[2].name, "b");
  double pct = 0;
  for (const KernelRow& r : rows) pct += r.time_pct;
  EXPECT_NEAR(pct, 100.0, 1e-9);
  EXPECT_NEAR(rows[0].time_pct, 100.0 * 12 / 32, 1e-9);
  const KernelRow& a = rows[1];
  EXPECT_EQ(a.instances, 4);
  EXPECT_DOUBLE_EQ(a.total_ns, 10);
  EXPECT_DOUBLE_EQ(a.avg_ns, 2.5);
  EXPECT_DOUBLE_EQ(a.med_ns, 2.5) << "even count: the mean of the two middle values";
  EXPECT_DOUBLE_EQ(a.min_ns, 1);
  EXPECT_DOUBLE_EQ(a.max_ns, 4);
  EXPECT_NEAR(a.stddev_ns, std::sqrt(5.0 / 3.0), 1e-12) << "sample standard deviation (n - 1)";
  EXPECT_EQ(a.category, "norm");
  EXPECT_DOUBLE_EQ(rows[0].med_ns, 4) << "odd count: the middle value";
  EXPECT_DOUBLE_EQ(rows[2].stddev_ns, 0) << "one instance";
}

TEST(KernelSummary, PhasePatternsPoolLayers) {
  EXPECT_EQ(phase_pattern("step/forward/layer 12/scores"), "step/forward/layer */scores");
  EXPECT_EQ(phase_pattern("step/backward"), "step/backward");
  EXPECT_EQ(phase_pattern("flash_attention"), "flash_attention");
}

TEST(KernelSummary, NaiveAttentionFlops) {
  // B 2, T 8, H 2, head dim 8, 3 layers: 2 * 2 * 64 = 256 scores per layer, 768 in all.
  const ModelCase c{kTiny, 2, Precision::FP32, AttentionKind::Naive};
  EXPECT_DOUBLE_EQ(naive_attention_flops("forward", "scores", c), 2.0 * 8 * 768) << "Q K^T: 2 D per score";
  EXPECT_DOUBLE_EQ(naive_attention_flops("forward", "value_matmul", c), 2.0 * 8 * 768);
  EXPECT_DOUBLE_EQ(naive_attention_flops("backward", "scores", c), 4.0 * 8 * 768) << "dQ and dK";
  EXPECT_DOUBLE_EQ(naive_attention_flops("backward", "value_matmul", c), 4.0 * 8 * 768) << "dP and dV";
  EXPECT_DOUBLE_EQ(naive_attention_flops("forward", "softmax", c), 5.0 * 768);
  EXPECT_TRUE(std::isnan(naive_attention_flops("optimizer", "scores", c)));
  EXPECT_TRUE(std::isnan(naive_attention_flops("forward", "flash_fwd_kernel", c)));
  const ModelCase flash{kTiny, 2, Precision::FP32, AttentionKind::Flash};
  EXPECT_TRUE(std::isnan(naive_attention_flops("forward", "scores", flash)));
}

TEST(ChromeTrace, WritesTheArrayFormatWithEscapedNames) {
  const std::string path = testing::TempDir() + "/llmhpc_trace_" + std::to_string(getpid()) + ".json";
  {
    ChromeTrace t(path);
    t.process_name(3, "tiny (rank 0)");
    t.thread_name(3, 10, "stream 7", 10);
    t.complete(3, 10, "k<\"q\\x\">", "matmul", 1'000'500, 2'250, "\"step\": 1");
    t.complete(3, 10, "second", "other", 1'000'000, 1'000'999'999);
    t.close();
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  EXPECT_EQ(s.front(), '[');
  EXPECT_EQ(s.substr(s.size() - 3), "\n]\n");
  EXPECT_NE(s.find(R"({"ph": "X", "name": "k<\"q\\x\">", "cat": "matmul", "pid": 3, "tid": 10, "ts": 0.000, )"
                   R"("dur": 2.250, "args": {"step": 1}})"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find(R"("ts": -0.500, "dur": 1000999.999)"), std::string::npos) << "times relative to the first event, "
                                                                                 "in microseconds, exactly: "
                                                                              << s;
  EXPECT_NE(s.find(R"({"ph": "M", "name": "thread_name", "pid": 3, "tid": 10, "args": {"name": "stream 7"}})"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_THROW(ChromeTrace("/nonexistent-dir/x/trace.json"), UsageError);
}

}  // namespace
}  // namespace llmhpc::test

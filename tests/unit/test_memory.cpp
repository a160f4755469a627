// The memory mode's pieces on the CPU: AdamW inside backward (GradientStorage::PerRange)
// against AdamW after backward, activations freed as backward ends and taken again by the next
// forward, the allocation trace against the allocator, the pickle writer's bytes, and the
// accumulation experiment.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <unordered_map>

#include "src/io/memory_snapshot.h"
#include "src/io/pickle.h"
#include "src/model/train_step.h"
#include "src/modes/memory_trace.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.context_length = 16;
  c.d_model = 32;
  c.d_ff = 64;
  c.num_layers = 3;
  c.num_heads = 4;
  return c;
}

std::vector<int32_t> tokens(int64_t n, int salt) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = int32_t((i * 31 + salt * 7) % 97);
  return t;
}

std::vector<float> read(const Tensor& t) {
  const float* p = t.ptr<float>();
  return std::vector<float>(p, p + t.numel());
}

// Three train steps with AdamW inside backward give bitwise the weights and optimizer state
// of AdamW after backward, with 4 bytes per parameter less at the peak.
TEST(OptimizerInBackward, BitwiseTheSeparateOptimizer) {
  std::vector<std::vector<float>> params, m;
  int64_t peaks[2];
  for (GradientStorage g : {GradientStorage::Whole, GradientStorage::PerRange}) {
    Backend be = cpu_backend();
    TracingAllocator& alloc = be.device->allocator();
    alloc.reset_peak();
    const ModelConfig c = tiny_config();
    TransformerLM model({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, g}, *be.device, *be.ops);
    model.init_parameters(7);
    AdamW opt(model, *be.ops, AdamWHyper{});
    auto timer = be.device->make_timer(kStepMarks);
    for (int s = 0; s < 3; ++s) {
      const auto x = tokens(2 * 16, s), y = tokens(2 * 16, s + 1);
      model.set_batch(x.data(), y.data(), 2, 16);
      const StepTimes t = run_step(model, &opt, Phase::TrainStep, *timer);
      EXPECT_EQ(std::isnan(t.optimizer_ms), g == GradientStorage::PerRange);
    }
    params.push_back(read(model.params()));
    m.push_back(read(opt.m()));
    peaks[int(g)] = alloc.peak_bytes();
    EXPECT_EQ(model.grads().empty(), g == GradientStorage::PerRange);
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m[0].data(), m[1].data(), m[0].size() * sizeof(float)));
  const ModelConfig c = tiny_config();
  const ParameterLayout layout(c);
  const int64_t largest_range =
      std::max(layout.layer_range(0).second - layout.layer_range(0).first, c.vocab_size * c.d_model + c.d_model);
  EXPECT_EQ(peaks[0] - peaks[1], (c.num_params() - largest_range) * 4);
}

TEST(OptimizerInBackwardDeathTest, RefusesAccumulation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: MPI is initialised anew
  Backend be = cpu_backend();
  TransformerLM model(
      {tiny_config(), Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::PerRange},
      *be.device, *be.ops);
  const auto x = tokens(16, 0);
  model.set_batch(x.data(), x.data(), 1, 16);
  model.forward();
  EXPECT_DEATH(model.backward(nullptr, true), "GradientStorage::Whole");
}

// The trace of a traced step: balanced, its peak the allocator's, tags naming the tensors.
TEST(MemoryTrace, BalancedAndThePeakIsTheAllocators) {
  Backend be = cpu_backend();
  TracingAllocator& alloc = be.device->allocator();
  Buffer before(alloc, DType::F32, {100}, "cublas.workspace");  // live before the trace
  const std::vector<LiveAllocation> at_start = alloc.live_allocations();
  alloc.reset_peak();
  alloc.set_recording(true);
  std::vector<PhaseMark> marks;
  auto mark = [&](const std::string& n) {
    alloc.set_phase(n);
    marks.push_back({n, alloc.now_ms(), alloc.live_bytes()});
  };
  mark("init");
  const ModelConfig c = tiny_config();
  auto model = std::make_unique<TransformerLM>(
      TransformerLM::Config{c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::Whole},
      *be.device, *be.ops);
  model->init_parameters(1);
  AdamW opt(*model, *be.ops, AdamWHyper{});
  const auto x = tokens(2 * 16, 0);
  model->set_batch(x.data(), x.data(), 2, 16);
  auto timer = be.device->make_timer(kStepMarks);
  run_step(*model, &opt, Phase::TrainStep, *timer, nullptr, [&](const char* n) { mark(n); });
  { Buffer temp(alloc, DType::F32, {1000}, "gradients.extra"); }  // a free inside the trace
  alloc.set_recording(false);

  const TraceSummary s = summarize_trace(at_start, alloc.events(), marks, alloc.live_bytes(), 5);
  EXPECT_TRUE(s.balanced);
  EXPECT_EQ(s.live_at_start, 400);
  EXPECT_EQ(s.peak, alloc.peak_bytes());
  EXPECT_EQ(s.live_at_end, alloc.live_bytes());
  EXPECT_EQ(s.at_peak.total, s.peak);
  int64_t sum = 0;
  for (const auto& [name, bytes] : s.at_peak.bytes) sum += bytes;
  EXPECT_EQ(sum, s.peak);
  EXPECT_EQ(s.at_peak.of("parameters"), c.num_params() * 4);
  EXPECT_EQ(s.at_peak.of("optimizer state"), 2 * c.num_params() * 4);
  EXPECT_EQ(s.at_peak.of("workspaces"), 400);
  ASSERT_EQ(s.phases.size(), 4u);  // init, forward, backward, optimizer
  EXPECT_EQ(s.phases[2].name, "backward");
  EXPECT_GE(s.phases[2].peak, s.phases[2].live_at_start);
  ASSERT_EQ(s.largest.size(), 5u);
  EXPECT_EQ(s.largest[0].bytes, c.num_params() * 4);
  for (size_t k = 1; k < s.largest.size(); ++k) EXPECT_LE(s.largest[k].bytes, s.largest[k - 1].bytes);
  // Tags name the tensors: the first layer's residual input is B*T*d_model fp32, taken by
  // forward and given back as backward ends.
  std::vector<std::pair<int64_t, std::string>> resid;
  for (const AllocEvent& e : alloc.events())
    if (e.tag == "activations.layers.0.resid") resid.emplace_back(e.delta, e.phase);
  const int64_t resid_bytes = 2 * 16 * c.d_model * 4;
  EXPECT_EQ(resid,
            (std::vector<std::pair<int64_t, std::string>>{{resid_bytes, "forward"}, {-resid_bytes, "backward"}}));
}

// A batch given in parts (the measuring modes draw theirs a million tokens at a time) is the
// batch given whole: the same loss, bitwise.
TEST(Batch, GivenInPartsIsTheWholeBatch) {
  Backend be = cpu_backend();
  const ModelConfig c = tiny_config();
  const int64_t B = 2, T = 16, n = B * T, cut = 13;  // a part boundary inside a sequence
  const auto x = tokens(n, 3), y = tokens(n, 4);
  auto loss = [&](bool in_parts) {
    TransformerLM model({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, GradientStorage::Whole},
                        *be.device, *be.ops);
    model.init_parameters(7);
    if (in_parts) {
      model.reserve_batch(B, T);
      model.set_batch_part(cut, n - cut, x.data() + cut, y.data() + cut);  // in any order
      model.set_batch_part(0, cut, x.data(), y.data());
    } else {
      model.set_batch(x.data(), y.data(), B, T);
    }
    model.forward();
    return model.mean_loss();
  };
  EXPECT_EQ(loss(true), loss(false));
}

// The phase named for the peak is the traced step's where a warm-up step reached the same
// peak before it (the study asks which phase of a step peaks), and a warm-up's where that
// step went higher.
TEST(MemoryTrace, ThePeakIsNamedInTheTracedStepUnlessAWarmUpWentHigher) {
  const std::vector<PhaseMark> marks = {{"warmup", 0.0, 0}, {"forward", 2.0, 0}};
  auto trace = [&](int64_t warmup_bytes) {
    const std::vector<AllocEvent> events = {{1.0, warmup_bytes, warmup_bytes, 1, "activations.a", "warmup"},
                                            {1.5, -warmup_bytes, 0, 1, "activations.a", "warmup"},
                                            {3.0, 100, 100, 1, "activations.a", "forward"}};
    return summarize_trace({}, events, marks, 100, 5);
  };
  const TraceSummary same = trace(100), higher = trace(200);
  EXPECT_EQ(same.peak, 100);
  EXPECT_EQ(same.peak_phase, "forward");
  EXPECT_EQ(same.peak_ms, 3.0);
  EXPECT_EQ(higher.peak, 200);
  EXPECT_EQ(higher.peak_phase, "warmup");
  ASSERT_EQ(same.largest.size(), 1u);
  EXPECT_EQ(same.largest[0].phase, "forward");  // a tag's latest allocation
}

// The activations (and backward's scratch) live from a forward to the end of its backward:
// after a train step only the batch is left (tokens, targets, the per-token losses), and
// mean_loss() still reads the step's loss. A forward that no backward follows keeps them for
// the next forward unless released; a batch of another shape frees them.
TEST(Activations, LiveFromForwardToTheEndOfBackward) {
  for (GradientStorage g : {GradientStorage::Whole, GradientStorage::PerRange}) {
    SCOPED_TRACE(g == GradientStorage::Whole ? "AdamW after backward" : "AdamW inside backward");
    Backend be = cpu_backend();
    TracingAllocator& alloc = be.device->allocator();
    const ModelConfig c = tiny_config();
    TransformerLM model({c, Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, 0, g}, *be.device, *be.ops);
    model.init_parameters(7);
    AdamW opt(model, *be.ops, AdamWHyper{});
    auto timer = be.device->make_timer(kStepMarks);
    const int64_t B = 2, T = 16, C = c.d_model, batch_bytes = 3 * B * T * 4;  // int32 tokens, targets; fp32 losses
    auto activations = [&] { return model_memory(alloc).of("activations"); };
    auto scratch = [&] { return model_memory(alloc).of("scratch"); };
    int64_t live_after_step = 0;
    for (int s = 0; s < 3; ++s) {
      const auto x = tokens(B * T, s), y = tokens(B * T, s + 1);
      model.set_batch(x.data(), y.data(), B, T);
      EXPECT_EQ(activations(), batch_bytes);
      alloc.reset_peak();
      run_step(model, &opt, Phase::TrainStep, *timer);
      EXPECT_EQ(activations(), batch_bytes) << "step " << s;
      EXPECT_EQ(scratch(), 0) << "step " << s;
      EXPECT_TRUE(std::isfinite(model.mean_loss()));
      if (s == 0) {  // which allocated AdamW's state after backward
        live_after_step = alloc.live_bytes();
        continue;
      }
      EXPECT_EQ(alloc.live_bytes(), live_after_step) << "step " << s << ": a step leaves nothing behind";
      // At least each layer's residual input, qkv and h13 were live during the step.
      EXPECT_GT(alloc.peak_bytes(), live_after_step + c.num_layers * B * T * (C + 3 * C + 2 * c.d_ff) * 4);
    }
    // Forward only: the set stays for the next forward, which takes nothing new, unless it
    // is released (mode memory's forward-only steps), when the next forward takes it again.
    model.forward();
    const int64_t with_activations = alloc.live_bytes();
    EXPECT_GT(activations(), batch_bytes);
    EXPECT_EQ(scratch(), 0);
    const double loss = model.mean_loss();
    model.forward();
    EXPECT_EQ(alloc.live_bytes(), with_activations);
    EXPECT_EQ(model.mean_loss(), loss);
    model.release_activations();
    EXPECT_EQ(activations(), batch_bytes);
    model.forward();
    EXPECT_EQ(alloc.live_bytes(), with_activations);
    EXPECT_EQ(model.mean_loss(), loss);
    // A batch of another shape frees the kept set before it takes its own.
    const auto x = tokens(16, 5);
    model.set_batch(x.data(), x.data(), 1, 16);
    EXPECT_EQ(activations(), batch_bytes / 2);
    run_step(model, &opt, Phase::TrainStep, *timer);
    EXPECT_EQ(activations(), batch_bytes / 2);
    EXPECT_EQ(scratch(), 0);
  }
}

// A caching allocator as the GPU's (CachingDeviceAllocator): a freed block is kept and handed
// back to the next request of its size, the way forward takes again the blocks the last
// backward gave back. Every block is filled with NaN bytes as it is freed, so a kernel that read
// a buffer it was given again before writing it would pass the NaN on into the loss.
class PoisoningCache final : public Allocator {
 public:
  explicit PoisoningCache(Allocator& inner) : inner_(inner) {}
  ~PoisoningCache() override {
    for (auto& [bytes, p] : cached_) inner_.deallocate(p);
  }
  void* allocate(size_t bytes, const std::string& tag) override {
    void* p;
    auto hit = cached_.find(bytes);
    if (hit != cached_.end()) {
      p = hit->second;
      cached_.erase(hit);
      ++reused_;
    } else {
      p = inner_.allocate(bytes, tag);
    }
    sizes_[p] = bytes;
    return p;
  }
  void deallocate(void* p) override {
    const size_t bytes = sizes_.at(p);
    sizes_.erase(p);
    std::memset(p, 0xFF, bytes);  // NaN in fp32 and fp64
    cached_.emplace(bytes, p);
  }
  int64_t reused() const { return reused_; }

 private:
  Allocator& inner_;
  std::unordered_map<void*, size_t> sizes_;
  std::multimap<size_t, void*> cached_;
  int64_t reused_ = 0;
};

// The CPU device with its memory from a PoisoningCache.
class PoisoningDevice final : public Device {
 public:
  explicit PoisoningDevice(Device& inner) : inner_(inner) {}
  DeviceKind kind() const override { return inner_.kind(); }
  std::string name() const override { return inner_.name(); }
  int ordinal() const override { return inner_.ordinal(); }
  size_t memory_capacity() const override { return inner_.memory_capacity(); }
  Attrs environment() const override { return inner_.environment(); }
  TracingAllocator& allocator() override { return tracer_; }
  void synchronize() override { inner_.synchronize(); }
  std::unique_ptr<Timer> make_timer(int num_marks) override { return inner_.make_timer(num_marks); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { inner_.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_.copy_to_host(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { inner_.copy_on_device(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { inner_.fill_zero(dst, bytes); }
  const PoisoningCache& cache() const { return cache_; }

 private:
  Device& inner_;
  HostAllocator host_{size_t(1) << 30};
  PoisoningCache cache_{host_};
  TracingAllocator tracer_{cache_};
};

// Training whose every step takes its activations and scratch again from blocks the previous
// step freed (and that were poisoned in between) is bitwise training on fresh memory: the same
// loss at every step, the same weights and optimizer state; with either attention and either
// place of AdamW.
TEST(Activations, TakenAgainFromTheCacheBitwiseTheSameTraining) {
  for (AttentionKind attention : {AttentionKind::Naive, AttentionKind::Flash})
    for (GradientStorage g : {GradientStorage::Whole, GradientStorage::PerRange}) {
      SCOPED_TRACE(std::string(attention_name(attention)) +
                   (g == GradientStorage::Whole ? ", AdamW after backward" : ", AdamW inside backward"));
      Backend be = cpu_backend();
      PoisoningDevice cached(*be.device);
      std::vector<double> losses[2];
      std::vector<float> params[2], m[2];
      for (int k = 0; k < 2; ++k) {
        Device& dev = k == 0 ? *be.device : static_cast<Device&>(cached);
        const ModelConfig c = tiny_config();
        TransformerLM model({c, Precision::FP32, attention, MemoryPlan::Fast, 0, g}, dev, *be.ops);
        model.init_parameters(3);
        AdamW opt(model, *be.ops, AdamWHyper{});
        auto timer = dev.make_timer(kStepMarks);
        for (int s = 0; s < 3; ++s) {
          const auto x = tokens(2 * 16, s), y = tokens(2 * 16, s + 1);
          model.set_batch(x.data(), y.data(), 2, 16);
          run_step(model, &opt, Phase::TrainStep, *timer);
          losses[k].push_back(model.mean_loss());
        }
        params[k] = read(model.params());
        m[k] = read(opt.m());
      }
      EXPECT_EQ(losses[0], losses[1]);
      EXPECT_TRUE(std::isfinite(losses[1].back()));
      ASSERT_EQ(params[0].size(), params[1].size());
      EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(m[0].data(), m[1].data(), m[0].size() * sizeof(float)));
      // Steps 2 and 3 took every activation and scratch buffer from the cache (and AdamW's
      // state may have taken a block or two of the first step's).
      const ModelConfig c = tiny_config();
      EXPECT_GE(cached.cache().reused(), 2 * (8 * c.num_layers + 7 + 7));
    }
}

// The pickle's bytes, opcode by opcode.
TEST(Pickle, WritesTheOpcodesMemoryVizReads) {
  PyObject d = PyObject::dict();
  d.set("a", PyObject::integer(5));
  PyObject& l = d.set("l", PyObject::list());
  l.append(PyObject::integer(300));
  l.append(PyObject::integer(-2));
  l.append(PyObject::integer(int64_t(1) << 40));
  l.append(PyObject::boolean(true));
  l.append(PyObject());
  l.append(PyObject::real(1.5));
  const std::string p = pickle(d);
  const std::string expected = std::string("\x80\x04}(\x8c\x01"
                                           "aK\x05\x8c\x01l](M\x2c\x01J\xfe\xff\xff\xff",
                                           22) +
                               std::string("\x8a\x06\x00\x00\x00\x00\x00\x01\x88NG\x3f\xf8\0\0\0\0\0\0eu.", 22);
  EXPECT_EQ(p, expected);
}

TEST(Pickle, BatchesLongListsAndLongStrings) {
  PyObject l = PyObject::list();
  for (int i = 0; i < 2500; ++i) l.append(PyObject());
  const std::string p = pickle(l);
  EXPECT_EQ(p.size(), 2u + 1u + 2500u + 3u * 2u + 1u);  // PROTO, EMPTY_LIST, NONEs, 3 x MARK...APPENDS, STOP
  EXPECT_EQ(std::count(p.begin(), p.end(), 'e'), 3);    // APPENDS per 1000 items
  EXPECT_EQ(std::count(p.begin(), p.end(), '('), 3);
  const std::string s = pickle(PyObject::str(std::string(300, 'x')));
  EXPECT_EQ(s.substr(0, 7), std::string("\x80\x04X\x2c\x01\0\0", 7));
}

TEST(Snapshot, FreesAndLiveBlocks) {
  std::vector<AllocEvent> ev = {{1.0, 64, 64, 0x1000, "params", "init"},
                                {2.0, 32, 96, 0x2000, "gradients.qkv", "backward"},
                                {3.0, -32, 64, 0x2000, "gradients.qkv", "backward"}};
  const PyObject s = memory_snapshot({{0x500, 16, "cublas.workspace"}}, ev, memory_categories(), 0.0);
  ASSERT_EQ(s.keys(), (std::vector<std::string>{"segments", "device_traces"}));
  EXPECT_EQ(s.items()[0].items().size(), 2u);  // the workspace and params are live at the end
  const PyObject& trace = s.items()[1].items()[0];
  ASSERT_EQ(trace.items().size(), 2u + 2u + 3u);
  EXPECT_EQ(trace.items()[5].items()[0].str_value(), "free_completed");
}

// Pages of a paged block given back and taken again are PyTorch's segment_unmap / segment_map
// (as its expandable segments record them), not a free: the block stays, at its held size.
TEST(Snapshot, PagesGivenBackAreUnmappedNotFreed) {
  AllocEvent unmap{2.0, -24, 40, 0x1000, "params", "optimizer"};
  unmap.pages = true;
  const std::vector<AllocEvent> ev = {{1.0, 64, 64, 0x1000, "params", "init"}, unmap};
  const PyObject s = memory_snapshot({}, ev, memory_categories(), 0.0);
  const PyObject& segments = s.items()[0];
  ASSERT_EQ(segments.items().size(), 1u) << "the block stays";
  const PyObject& trace = s.items()[1].items()[0];
  ASSERT_EQ(trace.items().size(), 2u + 1u);
  EXPECT_EQ(trace.items()[2].items()[0].str_value(), "segment_unmap");
}

TEST(Precision, ReferenceStudyAccumulationValues) {
  Backend be = cpu_backend();
  HostTensor out(*be.device, DType::F32, {4});
  be.ops->accumulation_experiment(out, 0.01, 1000);
  auto printed = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", v);
    return std::string(b);
  };
  EXPECT_EQ(printed(out.get(0)), "10.0001");
  EXPECT_EQ(printed(out.get(1)), "9.9531");
  EXPECT_EQ(printed(out.get(2)), "10.0021");
  // bf16 stalls where 0.01 is below half its spacing: from 4 on (spacing 2^-5 > 0.02).
  EXPECT_EQ(out.get(3), 4.0);
}

// Mode precision runs a long experiment in parts (to say how far it is): the sums continue
// bitwise, the fp16 and bf16 ones past where they stall too.
TEST(Precision, TheAccumulationExperimentInPartsIsTheWhole) {
  Backend be = cpu_backend();
  HostTensor whole(*be.device, DType::F32, {4}), parts(*be.device, DType::F32, {4});
  be.ops->accumulation_experiment(whole, 0.01, 3000);
  for (int64_t n : {1, 999, 1, 1999}) be.ops->accumulation_experiment(parts, 0.01, n);
  EXPECT_EQ(parts.values(), whole.values());
  EXPECT_EQ(parts.get(3), 4.0);
}

TEST(Precision, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  for (uint32_t h = 0; h < 0x7c00; ++h) EXPECT_EQ(float_to_half_bits(half_bits_to_float(uint16_t(h))), h);
}

}  // namespace
}  // namespace llmhpc::test

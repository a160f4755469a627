// Checkpoints: a round trip keeps parameters and optimizer state bit for bit; files that
// are not checkpoints, or do not fit the model, are refused with a message that says why.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "src/io/h5.h"
#include "src/model/checkpoint.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

ModelConfig config(int64_t layers = 2) {
  ModelConfig c;
  c.vocab_size = 17;
  c.context_length = 8;
  c.d_model = 8;
  c.d_ff = 12;
  c.num_layers = layers;
  c.num_heads = 2;
  return c;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/llmhpc_" + std::to_string(getpid()) + "_" + name;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

class Checkpoint : public ::testing::Test {
 protected:
  Backend be = cpu_backend();
  TransformerLM make(int64_t layers = 2) {
    return TransformerLM({config(layers), Precision::FP32, AttentionKind::Naive}, *be.device, *be.ops);
  }
};

TEST_F(Checkpoint, RoundTripKeepsParametersAndOptimizerState) {
  TransformerLM a = make();
  a.init_parameters(11);
  AdamW opt_a(a, *be.ops, AdamWHyper{});
  std::mt19937_64 rng(1);
  for (int k = 0; k < 2; ++k) {
    for (int64_t i = 0; i < a.layout().total(); ++i) a.grads().ptr<float>()[i] = float(rng() % 1000) / 500.0f - 1.0f;
    opt_a.step();
  }
  const std::string path = temp_path("roundtrip.h5");
  OptimizerState state = host_state(opt_a);
  state.options = "--lr 0.003 --lr-schedule cosine";
  save_checkpoint(path, a, &state);

  TransformerLM b = make();
  AdamW opt_b(b, *be.ops, AdamWHyper{});
  load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(0, std::memcmp(a.params().data, b.params().data, a.params().bytes()));
  EXPECT_EQ(0, std::memcmp(opt_a.m().data, opt_b.m().data, opt_a.m().bytes()));
  EXPECT_EQ(0, std::memcmp(opt_a.v().data, opt_b.v().data, opt_a.v().bytes()));
  EXPECT_EQ(opt_b.steps_taken(), 2);

  const CheckpointInfo info = inspect_checkpoint(path);
  ASSERT_TRUE(info.config.has_value());
  EXPECT_EQ(info.config->num_layers, 2);
  EXPECT_EQ(info.config->vocab_size, 17);
  EXPECT_TRUE(info.has_optimizer);
  EXPECT_EQ(info.options, "--lr 0.003 --lr-schedule cosine");
  // The reference model's names and shapes, (out, in), row-major.
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::dataset_dims(f.id(), "params/layers.1.ffn.w2.weight"), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(h5::dataset_dims(f.id(), "params/token_embeddings.weight"), (std::vector<int64_t>{17, 8}));
  EXPECT_EQ(h5::dataset_dims(f.id(), "optimizer/m/lm_head.weight"), (std::vector<int64_t>{17, 8}));
  const std::vector<float> w1 = h5::read_floats(f.id(), "params/layers.0.ffn.w1.weight");
  const Tensor t = a.param("layers.0.ffn.w1.weight");
  EXPECT_EQ(0, std::memcmp(w1.data(), t.data, t.bytes()));
  std::remove(path.c_str());
}

// A sharded optimizer loads what it owns from a whole-model checkpoint: ranges that start and
// end inside tensors, in any order, into a model whose flat buffers are padded (as ZeRO-1's).
TEST_F(Checkpoint, OwnedRangesLoadTheirSlicesOfTheWholeState) {
  TransformerLM a = make();
  a.init_parameters(5);
  AdamW opt_a(a, *be.ops, AdamWHyper{});
  for (int64_t i = 0; i < a.layout().total(); ++i) a.grads().ptr<float>()[i] = float(i % 7) - 3.0f;
  opt_a.step();
  const std::string path = temp_path("owned.h5");
  const OptimizerState whole = host_state(opt_a);
  save_checkpoint(path, a, &whole);

  const int64_t total = a.layout().total(), padded = total + 50;
  TransformerLM b({config(), Precision::FP32, AttentionKind::Naive, MemoryPlan::Fast, padded}, *be.device, *be.ops);
  const std::vector<FlatRange> owned = {{total - 30, padded}, {3, 40}, {100, 101}};
  AdamW opt_b(b, *be.ops, AdamWHyper{}, owned);
  load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(opt_b.steps_taken(), 1);
  EXPECT_EQ(0, std::memcmp(a.params().data, b.params().data, a.params().bytes()));
  const OptimizerState got = host_state(opt_b);
  ASSERT_EQ(int64_t(got.m.size()), 30 + 50 + 37 + 1);
  std::vector<float> want_m, want_v;
  for (const FlatRange& r : owned)
    for (int64_t i = r.begin; i < r.end; ++i) {
      want_m.push_back(i < total ? whole.m[size_t(i)] : 0.0f);  // the padding's state is zero
      want_v.push_back(i < total ? whole.v[size_t(i)] : 0.0f);
    }
  EXPECT_EQ(got.m, want_m);
  EXPECT_EQ(got.v, want_v);
  EXPECT_EQ(b.param("lm_head.weight").data, b.params().slice(b.layout().find("lm_head.weight").offset, {1}).data)
      << "padding leaves every view where it was";
  std::remove(path.c_str());
}

TEST_F(Checkpoint, ACheckpointForAnotherShapeIsRefusedByName) {
  TransformerLM small = make(1);
  small.init_parameters(1);
  const std::string path = temp_path("one_layer.h5");
  save_checkpoint(path, small, nullptr);
  TransformerLM two = make(2);
  const std::string err = error_of([&] { load_checkpoint(path, two, nullptr); });
  EXPECT_NE(err.find("layers.1.ln1.weight"), std::string::npos) << err;

  TransformerLM one_again = make(1);
  load_checkpoint(path, one_again, nullptr);  // and the right shape loads
  EXPECT_EQ(0, std::memcmp(small.params().data, one_again.params().data, small.params().bytes()));
  std::remove(path.c_str());
}

TEST_F(Checkpoint, AnExtraTensorIsRefused) {
  TransformerLM two = make(2);
  two.init_parameters(1);
  const std::string path = temp_path("two_layers.h5");
  save_checkpoint(path, two, nullptr);
  TransformerLM one = make(1);
  const std::string err = error_of([&] { load_checkpoint(path, one, nullptr); });
  EXPECT_NE(err.find("layers.1."), std::string::npos) << err;
  std::remove(path.c_str());
}

TEST_F(Checkpoint, FilesThatAreNotCheckpointsAreRefused) {
  const std::string text = temp_path("not.h5");
  std::ofstream(text) << "hello";
  EXPECT_NE(error_of([&] { inspect_checkpoint(text); }).find("not an HDF5 file"), std::string::npos);
  const std::string empty = temp_path("empty.h5");
  { h5::Handle f = h5::open_file(empty, h5::Mode::Create); }
  EXPECT_NE(error_of([&] { inspect_checkpoint(empty); }).find("no /params"), std::string::npos);
  EXPECT_NE(error_of([&] { inspect_checkpoint(temp_path("missing.h5")); }).find("does not exist"), std::string::npos);
  std::remove(text.c_str());
  std::remove(empty.c_str());
}

}  // namespace
}  // namespace llmhpc::test

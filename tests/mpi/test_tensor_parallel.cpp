// Tensor parallelism (src/model/tensor_parallel.h) against one rank: a model split among tp
// ranks, with and without sequence parallelism, alone (tp = every rank) or with data
// parallelism across the groups (tp 2 x dp 2 on 4 ranks; tp 2 x dp 3 and tp 3 x dp 2 on 6),
// trains the same model as one rank on the whole batch: the same losses and weights after
// several AdamW steps, up to the rounding of sums split among the ranks, with a vocabulary that
// divides by no tp (padded), and with forward's products split into chunks (overlap_chunks,
// some of uneven length). Every rank also trains the one-rank model itself and compares its
// own part of each parameter.
#include <unistd.h>

#include <cstdio>

#include "src/dist/parallelism.h"
#include "src/model/checkpoint.h"
#include "src/dist/tensor_parallel.h"
#include "tests/mpi/dp_test_util.h"

namespace llmhpc::test {
namespace {

// Vocabulary 101 (prime: padded at every tp), context 12, d_model 48, d_ff 96, 2 layers,
// 12 heads of 4: heads and d_ff divide by 2, 3 and 4.
ModelConfig tp_model() { return ModelConfig{"custom", 101, 12, 48, 96, 2, 12}; }
constexpr int kTpSteps = 4;
constexpr double kTpTolerance = 1e-5;  // fp32: the split sums round differently

struct TpCase {
  CommBackend backend;
  int tp;
  bool sequence_parallel;
  int overlap = 1;  // TensorParallel::overlap_chunks
};

std::string tp_case_name(const ::testing::TestParamInfo<TpCase>& info) {
  return std::string(comm_backend_name(info.param.backend)) + "_tp" + std::to_string(info.param.tp) +
         (info.param.sequence_parallel ? "_sp" : "") +
         (info.param.overlap > 1 ? "_overlap" + std::to_string(info.param.overlap) : "");
}

// A communicator over the ranks of this rank's `color`.
std::unique_ptr<Communicator> split_comm(Env& env, CommBackend backend, int color) {
  MPI_Comm parent;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &parent);
  CommOptions o;
  o.backend = backend;
  o.parent = parent;
  o.gpu = env.device().ordinal();
  o.compute_stream = env.device().native_stream();
  std::unique_ptr<Communicator> comm = make_communicator(o);
  MPI_Comm_free(&parent);
  return comm;
}

struct Trained {
  std::vector<double> losses;  // the mean over the whole global batch, each step
  std::vector<double> grad_norms;
  std::vector<float> params;  // this rank's parameters, in its layout
  std::vector<float> m, v;    // its whole AdamW state, in its layout
  ParameterLayout layout;
};

// `tp` 1: the one-rank model on the whole batch, no communication. Else this rank's part in the
// tp x dp layout of every rank, data parallelism (bucketed, or zero1 sharding) over the dp ranks.
// `save`: where every rank's parts are put together at the end (save_checkpoint_from_ranks).
Trained train(Env& env, CommBackend backend, int tp, bool sequence_parallel, int overlap, Precision precision,
              double max_norm = 0, Sharding sharding = Sharding::None, const std::string& save = "") {
  const MeshPlace place = tp == 1 ? MeshPlace{} : mesh_place(world_rank(), world_size(), tp);
  std::unique_ptr<Communicator> tp_comm, dp_comm;
  std::unique_ptr<CommTensorParallelGroup> group;
  if (tp > 1) {
    tp_comm = split_comm(env, backend, world_rank() / tp);
    group = std::make_unique<CommTensorParallelGroup>(*tp_comm);
    dp_comm = split_comm(env, backend, world_rank() % tp);
  }
  TransformerLM::Config config{tp_model(), precision};
  config.tensor_parallel = {place.tp_size, place.tp_rank, sequence_parallel, overlap, group.get()};
  const ParameterLayout layout(tp_model(), TensorSplit{place.tp_size, place.tp_rank});
  const bool data_parallel = place.dp_size > 1;
  const SyncPlan plan = data_parallel_plan(data_parallel ? SyncStrategy::Bucketed : SyncStrategy::None,
                                           data_parallel ? sharding : Sharding::None, layout, precision,
                                           GradientDType::Master, 25, place.dp_size);
  config.flat_elements = plan.flat_elements;
  TransformerLM model(config, env.device(), env.ops());
  AdamW opt(model, env.ops(), AdamWHyper{3e-3, 0.9, 0.999, 1e-8, 0.01}, plan.owned(place.dp_rank));
  model.init_parameters(kRankZeroSeed);
  if (max_norm > 0 && tp > 1)
    opt.set_clipping(
        tensor_parallel_clipping(max_norm, world(), sharding == Sharding::None ? place.dp_size : 1, layout));
  else if (max_norm > 0) opt.set_clipping({max_norm, nullptr, {}});
  std::unique_ptr<GradientSync> sync;
  if (data_parallel) sync = make_model_sync(plan, *dp_comm, model, false);
  auto timer = env.device().make_timer(step_marks(1));
  Trained out{{}, {}, {}, {}, {}, layout};
  const int64_t T = tp_model().context_length, share = kGlobalBatch / place.dp_size;
  for (int s = 0; s < kTpSteps; ++s) {
    const TokenBatch b = global_batch(tp_model(), s);
    const size_t first = size_t(place.dp_rank * share * T);
    model.set_batch(b.tokens.data() + first, b.targets.data() + first, share, T);
    run_step(model, &opt, Phase::TrainStep, *timer, sync.get());
    double loss = model.mean_loss();
    if (tp > 1) loss = mean_over_ranks(loss);  // every group's ranks hold their share's mean
    out.losses.push_back(loss);
    out.grad_norms.push_back(opt.last_grad_norm());
  }
  model.wait_parameters();
  out.params = download(env.device(), model.params().slice(0, {layout.total()}));
  if (opt.owned_elements() >= layout.total()) {  // all of this rank's part: its state in layout order
    const OptimizerState state = host_state(opt);
    out.m.assign(state.m.begin(), state.m.begin() + layout.total());
    out.v.assign(state.v.begin(), state.v.begin() + layout.total());
  }
  if (!save.empty()) {
    const Runtime rt = world();
    Runtime dp_rt = rt.group(place.tp_rank), tp_rt = rt.group(place.dp_rank);
    save_checkpoint_from_ranks(dp_rt, save, model, opt, plan, &tp_rt);
    Runtime::free_group(dp_rt);
    Runtime::free_group(tp_rt);
  }
  return out;
}

class TensorParallelTest : public BackendTest<TpCase> {
 protected:
  void SetUp() override {
    BackendTest<TpCase>::SetUp();
    if (IsSkipped()) return;
    if (world_size() % GetParam().tp != 0 || world_size() == 1)
      GTEST_SKIP() << "tp " << GetParam().tp << " does not divide " << world_size() << " rank(s)";
  }
};

TEST_P(TensorParallelTest, StepsGiveTheOneRankModel) {
  const TpCase c = GetParam();
  const Trained want = train(*env_, c.backend, 1, false, 1, Precision::FP32);
  const Trained got = train(*env_, c.backend, c.tp, c.sequence_parallel, c.overlap, Precision::FP32);
  for (int s = 0; s < kTpSteps; ++s)
    EXPECT_LE(max_over_ranks(std::fabs(got.losses[size_t(s)] - want.losses[size_t(s)]) / want.losses[size_t(s)]),
              kTpTolerance)
        << "loss of step " << s;
  const std::vector<float> mine = take_part(want.params, got.layout);
  EXPECT_LE(max_over_ranks(rel_error(got.params, mine)), kTpTolerance) << "this rank's part after the steps";
  // The vocabulary's padding rows stay zero: no token reads them, no gradient reaches them.
  for (const char* name : {"token_embeddings.weight", "lm_head.weight"}) {
    const ParamInfo& p = got.layout.find(name);
    const int64_t C = p.shape[1];
    for (int64_t i = got.layout.vocab_valid() * C; i < p.shape.numel(); ++i)
      ASSERT_EQ(got.params[size_t(p.offset + i)], 0.0f) << name << " padding element " << i;
  }
  // The norm gains are whole on every rank of a group, and equal there.
  const ParamInfo& gain = got.layout.find("layers.1.ln2.weight");
  EXPECT_TRUE(same_on_every_rank(
      std::vector<float>(got.params.begin() + gain.offset, got.params.begin() + gain.offset + gain.shape.numel())));
}

// bf16: the products' partial sums are rounded to bf16 before the group adds them (one rounding
// more than one rank's product), so the losses and weights agree to bf16's precision, not fp32's:
// after 4 steps the weights of the one-rank bf16 and fp32 models themselves differ by 3.4e-3 (2
// H200), as much as the tensor-parallel bf16 model's from either. The losses (within 1e-3) are
// the sharper check: a wrong collective or split moves them by order 1.
TEST_P(TensorParallelTest, Bf16StepsGiveTheOneRankModel) {
  const TpCase c = GetParam();
  constexpr double kBf16TpTolerance = 1e-2;
  const Trained want = train(*env_, c.backend, 1, false, 1, Precision::BF16);
  const Trained got = train(*env_, c.backend, c.tp, c.sequence_parallel, c.overlap, Precision::BF16);
  for (int s = 0; s < kTpSteps; ++s)
    EXPECT_LE(max_over_ranks(std::fabs(got.losses[size_t(s)] - want.losses[size_t(s)]) / want.losses[size_t(s)]),
              kBf16TpTolerance / 10)
        << "bf16 loss of step " << s;
  const double err = max_over_ranks(rel_error(got.params, take_part(want.params, got.layout)));
  EXPECT_LE(err, kBf16TpTolerance) << "bf16: this rank's part after the steps";
}

TEST_P(TensorParallelTest, ClippedStepsGiveTheClippedOneRankModel) {
  const TpCase c = GetParam();
  constexpr double kMaxNorm = 0.05;
  const Trained want = train(*env_, c.backend, 1, false, 1, Precision::FP32, kMaxNorm);
  const Trained got =
      train(*env_, c.backend, c.tp, c.sequence_parallel, c.overlap, Precision::FP32, kMaxNorm, Sharding::Zero1);
  for (int s = 0; s < kTpSteps; ++s) {
    EXPECT_GT(want.grad_norms[size_t(s)], 2 * kMaxNorm) << "step " << s << " should clip";
    EXPECT_TRUE(same_on_every_rank(got.grad_norms[size_t(s)])) << "norm of step " << s;
    EXPECT_LE(
        max_over_ranks(std::fabs(got.grad_norms[size_t(s)] - want.grad_norms[size_t(s)]) / want.grad_norms[size_t(s)]),
        kTpTolerance)
        << "norm of step " << s;
  }
  EXPECT_LE(max_over_ranks(rel_error(got.params, take_part(want.params, got.layout))), kTpTolerance);
}

// A tp x dp run's checkpoint holds the whole model's tensors, put together from the parts
// bitwise (its own parts read back, and the whole model loaded by one rank), and loads into any
// other layout's parts.
TEST_P(TensorParallelTest, CheckpointsHoldTheWholeModel) {
  const TpCase c = GetParam();
  int pid = int(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's: one file for every rank
  const std::string path = "/tmp/llmhpc_tp_checkpoint_" + std::to_string(pid) + ".h5";
  const Trained got =
      train(*env_, c.backend, c.tp, c.sequence_parallel, c.overlap, Precision::FP32, 0, Sharding::Zero1, path);
  const HostCheckpoint mine = read_checkpoint(path, got.layout);  // this rank's parts, from the whole tensors
  EXPECT_TRUE(bitwise_on_every_rank(mine.params, got.params)) << "parameters put together and read back";
  ASSERT_TRUE(mine.state.has_value());
  // One rank's model from the same file: the whole tensors, of which every part is its piece.
  TransformerLM whole({tp_model(), Precision::FP32}, env_->device(), env_->ops());
  AdamW opt(whole, env_->ops(), AdamWHyper{});
  load_checkpoint(path, whole, &opt);
  EXPECT_EQ(opt.steps_taken(), kTpSteps);
  const std::vector<float> loaded = download(env_->device(), whole.params());
  EXPECT_TRUE(bitwise_on_every_rank(take_part(loaded, got.layout), got.params)) << "one rank's load, cut again";
  EXPECT_TRUE(bitwise_on_every_rank(take_part(download(env_->device(), opt.m()), got.layout), mine.state->m));
  if (!got.m.empty()) {  // this rank's optimizer held all of its part's state
    EXPECT_TRUE(bitwise_on_every_rank(mine.state->m, got.m)) << "m put together and read back";
    EXPECT_TRUE(bitwise_on_every_rank(mine.state->v, got.v)) << "v put together and read back";
  }
  // Another layout's parts (tp 2 and 3 from 4, ...), the padding of its vocabulary zero.
  for (int other : {2, 3, 4}) {
    const ParameterLayout part(tp_model(), TensorSplit{other, world_rank() % other});
    const HostCheckpoint theirs = read_checkpoint(path, part);
    EXPECT_TRUE(bitwise_on_every_rank(theirs.params, take_part(loaded, part))) << "into tp " << other;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

TEST(TensorParallelLayout, SplitsThatDoNotDivideAreRefused) {
  ModelConfig c = tp_model();
  EXPECT_THROW(ParameterLayout(c, TensorSplit{5, 0}), UsageError) << "12 heads among 5";
  c.num_heads = 6;  // head_dim 8
  c.d_ff = 100;
  EXPECT_THROW(ParameterLayout(c, TensorSplit{4, 0}), UsageError) << "d_ff 100 among 4: 6 heads do not divide either";
  c = tp_model();
  c.vocab_size = 9;  // padded to 32 at tp 4: rank 2 would hold none of it
  EXPECT_THROW(ParameterLayout(c, TensorSplit{4, 2}), UsageError);
  // Where the last rank would hold only padding, the message names the largest tp below the one
  // asked for that the vocabulary (a checkpoint's, which cannot change) takes, and the next
  // vocabulary that leaves the last rank some (33 at tp 4: 64 rows, 16 a rank, the last from row 48).
  auto fits = [&](int64_t v, int tp) {
    c.vocab_size = v;
    try {
      ParameterLayout(c, TensorSplit{tp, tp - 1});
      return true;
    } catch (const UsageError&) {
      return false;
    }
  };
  for (int tp : {2, 3, 4})
    for (int64_t vocab = 1; vocab <= 8 * tp * tp; ++vocab) {
      if (fits(vocab, tp)) continue;
      int64_t next = vocab + 1;
      while (!fits(next, tp)) ++next;
      int most = tp - 1;
      while (most > 1 && !fits(vocab, most)) --most;
      c.vocab_size = vocab;
      try {
        ParameterLayout(c, TensorSplit{tp, tp - 1});
      } catch (const UsageError& e) {
        const std::string said = e.what();
        EXPECT_NE(said.find("give a vocab_size of " + std::to_string(next) + " or more"), std::string::npos) << said;
        EXPECT_NE(said.find("takes tp " + std::to_string(most) + " (the largest below " + std::to_string(tp)),
                  std::string::npos)
            << said;
      }
    }
  c = tp_model();
  EXPECT_THROW(mesh_place(0, 6, 4), UsageError) << "tp 4 does not divide 6 ranks";
  const MeshPlace p = mesh_place(5, 8, 2);
  EXPECT_EQ(p.tp_rank, 1);
  EXPECT_EQ(p.dp_rank, 2);
  EXPECT_EQ(p.dp_size, 4);
}

TEST(TensorParallelLayout, PartsTileTheWholeTensors) {
  const ModelConfig c = tp_model();
  const ParameterLayout whole(c);
  for (int tp : {2, 3, 4}) {
    std::vector<int> covered(size_t(whole.total()), 0);
    for (int r = 0; r < tp; ++r) {
      const ParameterLayout part(c, TensorSplit{tp, r});
      EXPECT_EQ(part.vocab_rows(), padded_vocab(c.vocab_size, tp) / tp);
      for (const ParamInfo& p : part.params())
        for (const PartRun& run : part.part_runs(p)) {
          EXPECT_LE(run.part + run.count, p.shape.numel());
          for (int64_t i = 0; i < run.count; ++i) covered[size_t(whole.find(p.name).offset + run.whole + i)] += 1;
        }
    }
    for (const ParamInfo& p : whole.params())
      for (int64_t i = 0; i < p.shape.numel(); ++i)
        ASSERT_EQ(covered[size_t(p.offset + i)], p.shape.ndim == 1 ? tp : 1)
            << "tp " << tp << ": " << p.name << " element " << i;
  }
}

// The data-parallel groups of different tensor-parallel ranks may hold their state in different
// numbers of copies (shard groups of a node's ranks on nodes of uneven sizes): the norm adds each
// rank's sum over its own copies, and every rank gets the same.
TEST(TensorParallelClipping, RanksWithDifferentCopiesAgreeOnTheNorm) {
  const int rank = world_rank(), n = world_size();
  const ParameterLayout layout(tp_model(), TensorSplit{2, 0});
  const int copies = 1 + rank % 2;
  const GradClipping clipping = tensor_parallel_clipping(1.0, world(), copies, layout);
  const double sum = clipping.sum_over_ranks(double(rank + 1) * copies);  // rank r's elements: r + 1, r's copies times
  double want = 0;
  for (int r = 0; r < n; ++r) want += r + 1;
  EXPECT_EQ(sum, want) << "rank " << rank;
  double lowest = 0, highest = 0;
  MPI_Allreduce(&sum, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&sum, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lowest, highest);
}

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> cases;
  for (CommBackend b : {CommBackend::Mpi, CommBackend::Nccl}) {
    for (int tp : {2, 3, 4})
      for (bool sp : {false, true}) cases.push_back({b, tp, sp});
    // Chunks of uneven length: 5 of the 144 or 72 tokens (tp 2, on 2 or 4 ranks), of a
    // rank's 72 or 36 under sequence parallelism; 2 of tp 3's 48.
    cases.push_back({b, 2, false, 5});
    cases.push_back({b, 2, true, 5});
    cases.push_back({b, 3, true, 2});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelTest, ::testing::ValuesIn(tp_cases()), tp_case_name);

}  // namespace
}  // namespace llmhpc::test

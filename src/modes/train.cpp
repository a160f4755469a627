// Mode train: real training on a token file. Starts from --init (a checkpoint) or the
// seeded initialisation, takes --steps AdamW steps on batches drawn in --data-order (over
// ranks with --ddp, the optimizer state sharded with --shard-optimizer), records the loss of
// every step in /train/loss with the memory at the reference optimizer-sharding study's three points, and writes --save
// at the end (the whole optimizer state, however it was sharded), every --save-every steps,
// and when a signal stops it early (src/core/stop_request.h). A run from a checkpoint draws
// the batches of the steps after the checkpoint's, and takes the training options the checkpoint
// keeps where it is not given them, so a stopped run resumed with --init trains as the
// uninterrupted one would have.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include "src/core/progress_board.h"
#include "src/core/stats.h"
#include "src/core/stop_request.h"
#include "src/core/units.h"
#include "src/io/token_data.h"
#include "src/model/checkpoint.h"
#include "src/model/lr_schedule.h"
#include "src/model/train_step.h"
#include "src/core/watchdog.h"
#include "src/core/table.h"
#include "src/dist/data_parallel_training.h"
#include "src/dist/tensor_parallel.h"
#include "src/modes/data_parallel.h"
#include "src/modes/options.h"
#include "src/modes/step_timeline.h"
#include "src/modes/sensors.h"

namespace llmhpc {
namespace {

void add_options(po::options_description& desc) {
  po::options_description train("Train options");
  auto text = [](const char* def) { return po::value<std::string>()->default_value(def); };
  train.add_options()("data", po::value<std::string>(), "token file: .bin (uint16) or .npy (uint16 or int32)")(
      "data-order", text("random"), "sequential | random (seeded by --seed)")(
      "steps", text("10"), "optimizer steps (with --init: the steps still to take)")(
      "lr", text("1e-3"), "AdamW learning rate: the peak of --lr-schedule")(
      "lr-schedule", text("constant"),
      "constant | cosine | linear: after --lr-warmup-steps (rising linearly from 0), --lr held, or decayed along a "
      "cosine or a line to --min-lr at --lr-decay-steps; steps count over the whole training, so a run from --init "
      "goes on along the same curve")("lr-warmup-steps", text("0"),
                                      "optimizer steps of linear warm-up: step s of the first N takes --lr * s / N")(
      "lr-decay-steps", po::value<std::string>(),
      "the optimizer step at which cosine or linear decay reaches --min-lr (default: this run's last step, the "
      "checkpoint's step + --steps)")("min-lr", text("0"), "the learning rate cosine and linear decay end at")(
      "clip-grad-norm", text("0"),
      "clip the gradients' global L2 norm to this before each update, as torch.nn.utils.clip_grad_norm_ (0: no "
      "clipping; inf: only record the norm); with it, every step's norm goes to /train/grad_norm")(
      "weight-decay", text("0.01"), "AdamW decoupled weight decay")("beta1", text("0.9"), "AdamW beta1")(
      "beta2", text("0.999"), "AdamW beta2")("eps", text("1e-8"), "AdamW epsilon")(
      "init", po::value<std::string>(),
      "go on from this checkpoint: its model (shape options change it where its tensors still fit; its heads "
      "stay), its optimizer state, and the batches after its step")(
      "save", po::value<std::string>(),
      "write the final checkpoint here (rank 0; a checkpoint of that name is replaced, any other file refused); also "
      "when SIGTERM, SIGINT or SIGUSR1 stops the run early: every "
      "rank stops after the same step, saves it and exits with 128 + the signal (under mpirun, stop with SIGUSR1 "
      "to mpirun: Open MPI turns Ctrl-C into SIGTERM and kills the ranks a second later)")(
      "save-every", text("0"),
      "also write --save every N steps (0: only at the end), so a killed run loses at most N steps")(
      "log-every", text("10"),
      "print the loss every N steps (0: only the last), with the wall time per step since the first")(
      "grad-accum", text("1"),
      "micro-batches per optimizer step: each rank's share of --batch-size goes through forward and backward in "
      "this many parts, their gradients added up (activations of one part at a time; data parallelism "
      "communicates after the last part only); the same training as one pass, to rounding")(
      "cuda-graph", po::bool_switch(),
      "from the second step on, replay forward and backward from a CUDA graph recorded then, AdamW after it: "
      "one launch instead of hundreds for a small model (CUDA, one rank; bitwise the same training)");
  // What sweeps each option's lists: the layout's in mode ddp (and memory for --tp), the model's
  // in bench, profile, memory and ddp.
  add_data_parallel_options(
      train, ListUse{"train", "lists sweep in mode ddp, and the tensor-parallel ones in mode memory too"});
  po::options_description model("Model options");
  const ListUse one_model{"train", "lists sweep in modes bench, profile, memory and ddp"};
  add_model_options(model, one_model);
  add_precision_options(model, one_model);
  desc.add(train).add(model);
}

// Everything train takes from the command line, parsed and checked once by parse_options
// before any file or device is touched (the same verdict on every rank); run() reads only this.
struct TrainOptions {
  std::string data, init, save;  // init, save: "" when not given
  DataOrder order = DataOrder::Random;
  int64_t steps = 0, log_every = 0, save_every = 0, batch = 0;  // batch: the global batch
  int micro_batches = 1;
  uint64_t seed = 0;
  // The model: `shape` from --model (or the shape options without --init); else --init's, with
  // the shape options given over it, or `whole_shape` (all four given) for a checkpoint that
  // records no model.
  std::optional<ModelConfig> shape, whole_shape;
  ShapeOptions shape_given;
  std::optional<int64_t> vocab_size, context_length;
  std::optional<double> rope_theta;
  Precision precision = Precision::FP32;
  AttentionKind attention = AttentionKind::Naive;
  MemoryPlan memory = MemoryPlan::Fast;
  GradientDType grads = GradientDType::Master;
  Parallelism parallel;
  std::string backend;  // --backend as given: auto, nccl or mpi
  AdamWHyper hyper;
  LrSchedule schedule;             // its decay_steps set by run() when not given
  bool decay_steps_given = false;  // else the run's last step ends the decay
  double clip_grad_norm = 0;       // 0: off; inf: the norm recorded only
  bool cuda_graph = false;
  std::string taken_from_init;  // the options --init's checkpoint gave (with_checkpoint_options)
};

AdamWHyper hyper_from(const po::variables_map& vm) {
  AdamWHyper h;
  h.lr = opt_double(vm, "lr");
  h.weight_decay = opt_double(vm, "weight-decay");
  h.beta1 = opt_double(vm, "beta1");
  h.beta2 = opt_double(vm, "beta2");
  h.eps = opt_double(vm, "eps");
  if (h.weight_decay < 0) throw UsageError("--weight-decay must not be negative");
  if (!(h.beta1 >= 0 && h.beta1 < 1)) throw UsageError("--beta1 must be in [0, 1)");
  if (!(h.beta2 >= 0 && h.beta2 < 1)) throw UsageError("--beta2 must be in [0, 1)");
  if (!(h.eps > 0)) throw UsageError("--eps must be positive");
  return h;
}

// The schedule's shape; its end of decay, when not given, is the run's last step (run()).
LrSchedule lr_schedule(const po::variables_map& vm) {
  LrSchedule s;
  s.decay = parse_lr_decay(opt_string(vm, "lr-schedule"));
  s.peak = opt_double(vm, "lr");
  s.min = opt_double(vm, "min-lr");
  s.warmup_steps = opt_nonnegative(vm, "lr-warmup-steps");
  if (vm.count("lr-decay-steps")) s.decay_steps = opt_positive(vm, "lr-decay-steps");
  if (s.decay == LrDecay::Constant && (opt_given(vm, "min-lr") || vm.count("lr-decay-steps")))
    throw UsageError("--min-lr and --lr-decay-steps shape a decay: give them with --lr-schedule cosine or linear");
  return s;
}

// --clip-grad-norm: 0 (off), a positive norm, or inf.
double clip_grad_norm(const po::variables_map& vm) {
  const std::string text = opt_string(vm, "clip-grad-norm");
  if (text == "inf") return INFINITY;
  const double v = opt_double(vm, "clip-grad-norm");
  if (v < 0) throw UsageError("--clip-grad-norm must be positive, 0 (no clipping) or inf (the norm only)");
  return v;
}

TrainOptions parse_options(const po::variables_map& vm, int world_size) {
  if (!vm.count("data")) throw UsageError("--mode train needs --data FILE (a .bin of uint16 tokens or a .npy)");
  for (const auto& [option, example] : {std::pair{"data", "tokens.bin"}, {"init", "model.h5"}, {"save", "model.h5"}})
    if (vm.count(option) && opt_string(vm, option).empty())
      throw UsageError(std::string("--") + option + " needs a file name (e.g. --" + option + " " + example + ")");
  TrainOptions o;
  o.data = opt_string(vm, "data");
  if (vm.count("init")) o.init = opt_string(vm, "init");
  if (vm.count("save")) o.save = opt_string(vm, "save");
  o.order = parse_data_order(opt_string(vm, "data-order"));
  o.steps = opt_positive(vm, "steps");
  o.log_every = opt_nonnegative(vm, "log-every");
  o.save_every = opt_nonnegative(vm, "save-every");
  o.micro_batches = fits_int(opt_positive(vm, "grad-accum"), "grad-accum");
  o.seed = uint64_t(opt_int(vm, "seed"));
  o.cuda_graph = opt_flag(vm, "cuda-graph");
  if (o.micro_batches > 1 && o.cuda_graph)
    throw UsageError(
        "--cuda-graph replays one forward and backward per step: it cannot take --grad-accum micro-batches");
  if (o.save_every > 0 && o.save.empty())
    throw UsageError("--save-every needs --save FILE: the checkpoint it rewrites (e.g. --save model.h5)");
  o.hyper = hyper_from(vm);
  o.clip_grad_norm = clip_grad_norm(vm);
  o.schedule = lr_schedule(vm);
  o.decay_steps_given = vm.count("lr-decay-steps") > 0;
  // Checked here with the run's last step as the default end of decay; with --init that step is
  // known once run() has read the checkpoint's, and run() checks the schedule again then.
  LrSchedule check = o.schedule;
  if (!o.decay_steps_given) check.decay_steps = o.init.empty() ? o.steps : std::numeric_limits<int64_t>::max();
  check.validate();
  o.batch = batch_sizes(vm).front();
  o.precision = precisions(vm).front();
  o.attention = attentions(vm).front();
  o.memory = memory_plan(vm);
  o.grads = grad_dtype(vm);
  o.backend = opt_string(vm, "backend");
  o.parallel = parallelism(vm, world_size);
  check_parallelism(o.parallel, o.precision, o.memory, world_size);
  if (shards_parameters(o.parallel.sharding)) {
    const std::string stage = std::string("--shard-optimizer ") + sharding_name(o.parallel.sharding);
    if (o.cuda_graph)
      throw UsageError(stage + " gathers the weights between the kernels: --cuda-graph cannot record it");
  }
  if (o.parallel.tensor_parallel > 1 && o.cuda_graph)
    throw UsageError(
        "--cuda-graph records one rank's kernels: --tp's collectives inside each layer cannot be recorded");
  o.shape_given = shape_options(vm);
  if (opt_given(vm, "model") || o.init.empty()) o.shape = model_configs(vm).front();
  else if (o.shape_given.all()) o.whole_shape = model_configs(vm).front();  // for a checkpoint without its config
  if (opt_given(vm, "vocab-size")) o.vocab_size = opt_int(vm, "vocab-size");
  if (opt_given(vm, "rope-theta")) o.rope_theta = opt_double(vm, "rope-theta");
  if (opt_given(vm, "context-length")) o.context_length = opt_positive(vm, "context-length");
  return o;
}

// The options a checkpoint keeps (OptimizerState::options): those that shape the training from
// it on (its numerics too: attention and gradient dtype), each a name of kKeptOptions; not the
// layout's (--ddp, --tp, --grad-accum), which a resumed run chooses for its own ranks. The end of
// decay too where the schedule decays, also once passed: a run from a checkpoint whose decay
// ended is refused, told to choose another end or a constant rate, rather than decaying anew
// from --lr (a jump of the rate nobody asked for).
const char* const kKeptOptions[] = {"batch-size",   "data-order",     "seed",
                                    "precision",    "attention",      "grad-dtype",
                                    "lr",           "lr-schedule",    "lr-warmup-steps",
                                    "min-lr",       "lr-decay-steps", "clip-grad-norm",
                                    "weight-decay", "beta1",          "beta2",
                                    "eps"};

std::string kept_options(const TrainOptions& o, const LrSchedule& s) {
  std::string out = "--batch-size " + std::to_string(o.batch) + " --data-order " +
                    (o.order == DataOrder::Random ? "random" : "sequential") + " --seed " + std::to_string(o.seed) +
                    " --precision " + precision_name(o.precision) + " --attention " + attention_name(o.attention) +
                    " --grad-dtype " + (o.grads == GradientDType::BF16 ? "bf16" : "same") + " --lr " +
                    fmt_exact(s.peak) + " --lr-schedule " + lr_decay_name(s.decay) + " --lr-warmup-steps " +
                    std::to_string(s.warmup_steps);
  if (s.decay != LrDecay::Constant)
    out += " --min-lr " + fmt_exact(s.min) + " --lr-decay-steps " + std::to_string(s.decay_steps);
  return out + " --clip-grad-norm " + (std::isinf(o.clip_grad_norm) ? "inf" : fmt_exact(o.clip_grad_norm)) +
         " --weight-decay " + fmt_exact(o.hyper.weight_decay) + " --beta1 " + fmt_exact(o.hyper.beta1) + " --beta2 " +
         fmt_exact(o.hyper.beta2) + " --eps " + fmt_exact(o.hyper.eps);
}

// Two spellings of one option value: numbers by value (3e-4 is 0.0003), the rest as written.
bool same_value(const std::string& a, const std::string& b) {
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  const bool numbers = !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0';
  return numbers ? x == y : a == b;
}

// The command line with --init's kept options (`saved`) in place of those it leaves at their
// defaults; `taken` lists those that changed something, `notes` say so and name each one given
// that differs. A --lr-schedule given other than the checkpoint's takes none of its decay (its
// --min-lr and --lr-decay-steps shaped another curve), and says so.
po::variables_map with_kept_options(const po::variables_map& vm, const std::string& path, const std::string& saved,
                                    std::string& taken, std::vector<std::string>& notes) {
  std::map<std::string, std::string> kept;
  std::istringstream in(saved);
  for (std::string flag, value; in >> flag >> value;) kept[flag.substr(2)] = value;
  const bool other_schedule = opt_given(vm, "lr-schedule") && kept.count("lr-schedule") &&
                              !same_value(opt_string(vm, "lr-schedule"), kept["lr-schedule"]);
  const bool other_precision =
      opt_given(vm, "precision") && kept.count("precision") && opt_string(vm, "precision") != kept["precision"];
  po::variables_map out = vm;
  for (const char* name : kKeptOptions) {
    if (!kept.count(name)) continue;
    const std::string& value = kept[name];
    const std::string flag = std::string("--") + name;
    if (opt_given(vm, name)) {
      if (!same_value(opt_string(vm, name), value))
        notes.push_back(flag + " " + opt_string(vm, name) + " as given, not the " + value + " that '" + path +
                        "' was trained with");
      continue;
    }
    if (other_schedule && (flag == "--min-lr" || flag == "--lr-decay-steps")) {
      notes.push_back("not taken: '" + path + "''s " + flag + " " + value + ", which shaped its " +
                      kept["lr-schedule"] + " schedule");
      continue;
    }
    if (other_precision && flag == "--grad-dtype") {  // bf16 gradients are --precision bf16's
      if (value != "same")
        notes.push_back("not taken: '" + path + "''s " + flag + " " + value + ", of its --precision " +
                        kept["precision"]);
      continue;
    }
    if (!vm.count(name) || !same_value(opt_string(vm, name), value)) taken += " " + flag + " " + value;
    out.erase(name);
    out.insert({name, po::variable_value(boost::any(value), false)});
  }
  if (!taken.empty())
    notes.insert(notes.begin(), "as '" + path + "' was trained:" + taken + " (an option given here takes its place)");
  return out;
}

// This run's options from --init on: those the checkpoint keeps fill in what is not given, so
// that a resumed run needs only --init and --steps to train as the uninterrupted one. Checked
// once merged, when the file has been read (so a check such as --min-lr's, which needs a
// decaying schedule, sees the checkpoint's); an error is every rank's, agreed.
TrainOptions with_checkpoint_options(const Runtime& rt, const po::variables_map& vm) {
  const std::string path = opt_string(vm, "init");
  std::string saved;
  collective_check(rt, [&] {
    if (path.empty()) throw UsageError("--init needs a file name (e.g. --init model.h5)");
    try {
      saved = inspect_checkpoint(path).options;
    } catch (const UsageError& e) {  // the file's own message, naming the option it came from
      throw UsageError(std::string("--init: ") + e.what());
    }
  });
  // Every rank trains with the same options: a checkpoint read on each node must say the same.
  const std::string root_saved = rt.broadcast(saved);
  agree_or_exit(rt, root_saved == saved
                        ? ""
                        : "--init '" + path + "' on " + rt.hostname + " keeps other training options (" + saved +
                              ") than rank 0's (" + root_saved + "): give every node the same checkpoint");
  std::string taken;
  std::vector<std::string> notes;
  const po::variables_map merged = saved.empty() ? vm : with_kept_options(vm, path, saved, taken, notes);
  if (saved.empty())
    notes.push_back("'" + path +
                    "' keeps no training options (written before checkpoints kept them, or not by "
                    "mode train): the options not given take their defaults");
  for (const std::string& note : notes) log_root(rt, "train: %s\n", note.c_str());
  TrainOptions o;
  collective_check(rt, [&] { o = parse_options(merged, rt.world_size); });
  o.taken_from_init = taken.empty() ? taken : taken.substr(1);
  return o;
}

// The model to train: from --model (its sizes and the options that change them), or from
// --init's attributes with the options given over them. The tensors' shapes are checked
// against the checkpoint's later (check_checkpoint_fits); here what they do not show: the
// heads its weights were trained to form, which the run must keep, and RoPE's base, which a
// run may change (longer contexts are trained so) but is told about in `notes`.
ModelConfig resolve_config(const TrainOptions& o, const CheckpointInfo* init, int world_size,
                           std::vector<std::string>& notes) {
  ModelConfig c;
  if (o.shape) {
    c = *o.shape;
  } else if (o.whole_shape && init && !init->config) {
    c = *o.whole_shape;
  } else {
    if (!init || !init->config)
      throw UsageError("--init '" + o.init +
                       "' has no model config attributes; give the model with --model or "
                       "--d-model/--d-ff/--num-layers/--num-heads");
    c = *init->config;
    c.name = "checkpoint";
    o.shape_given.apply_to(c);
    if (o.vocab_size) c.vocab_size = *o.vocab_size;
    if (o.rope_theta) c.rope_theta = *o.rope_theta;
    if (o.context_length) c.context_length = *o.context_length;
    c.validate();
  }
  if (init && init->config) {
    const ModelConfig& trained = *init->config;
    if (c.num_heads != trained.num_heads && c.d_model == trained.d_model) {
      const std::string given = o.shape_given.num_heads
                                    ? "--num-heads " + std::to_string(c.num_heads)
                                    : "--model " + o.shape->name + "'s " + std::to_string(c.num_heads) + " heads";
      throw UsageError("--init '" + o.init + "' was trained with " + std::to_string(trained.num_heads) + " heads; " +
                       given + " would split its attention weights into other heads, another model: leave " +
                       (o.shape_given.num_heads ? "--num-heads" : "--model") +
                       " out (the checkpoint's model is used), or train from scratch without --init");
    }
    // Heads or d_ff the checkpoint's: name it, not an option the user did not give.
    const int tp = o.parallel.tensor_parallel;
    const bool heads = c.num_heads == trained.num_heads && c.num_heads % tp != 0;
    const bool ff = !o.shape && !o.shape_given.d_ff && c.d_ff % tp != 0;
    if (heads || ff)
      throw UsageError("--init '" + o.init + "' holds a model of " +
                       (heads ? std::to_string(c.num_heads) + " attention heads" : "d_ff " + std::to_string(c.d_ff)) +
                       ", which do" + (heads ? "" : "es") + " not divide among {tp} " + std::to_string(tp) +
                       " ranks (" +
                       (heads ? "each takes whole heads, and a checkpoint's heads stay as trained"
                              : "each takes d_ff / tp of the feed-forward features") +
                       "): give a {tp} that divides its heads, d_ff and the " + std::to_string(world_size) +
                       " ranks (" + tensor_parallel_fits(c, world_size) + ")");
    if (c.rope_theta != trained.rope_theta)
      notes.push_back("RoPE's base is " + fmt_exact(c.rope_theta) + ", not the " + fmt_exact(trained.rope_theta) +
                      " that '" + o.init + "' was trained with: positions are encoded anew");
  }
  return c;
}

// Of the parameters in `layout`, those `rank` updates (zero1's parts include the padding that
// rounds the flat buffer up for the ranks; it is not a parameter).
int64_t owned_parameters(const SyncPlan& plan, int rank, const ParameterLayout& layout) {
  int64_t n = 0;
  if (shards_parameters(plan.sharding)) {
    for (const ShardLayout::Piece& piece : ShardLayout(layout, plan.ranks, plan.alignment).pieces(layout, rank))
      n += piece.count;
    return n;
  }
  for (const PackedPiece& piece : packed_pieces(plan.owned(rank), {0, layout.total()})) n += piece.flat.size();
  return n;
}


// One run of mode train on this rank. The constructor sets it up: the tp x dp layout, every
// check that may fail on some ranks only (a file, the device's memory) agreed on by all ranks,
// the model with its parallelism, the run's description on rank 0 and its record. run() trains
// and keeps the record current as it goes.
struct TrainRun {
  TrainRun(ModeContext& ctx, const TrainOptions& o);
  void run();

  void check_inputs();                                // files, model, parallelism, batch split
  void build();                                       // communicators, model, optimizer, weights
  void describe() const;                              // rank 0's lines on what runs
  void make_record();                                 // the rank file's configuration
  Record progress_record(const std::string& status);  // the record with the steps so far
  void save_progress(const std::string& status);      // ... written, after any flush under way
  // At the run's end (ok or stopped): every step's collective time and the last steps' timeline.
  void finish_collectives(Record& r);
  void save(const std::string& when);  // the checkpoint (--save)
  // A step out of memory on `ranks_out` ranks (`this_rank`: this one's message, "" where it fit):
  // the record kept, one message from the lowest such rank. Collective.
  [[noreturn]] void stop_out_of_memory(double ranks_out, const std::string& this_rank, int64_t step);
  // Rank 0's line after `done` steps, the last one `t`.
  void log_progress(int64_t done, const StepTimes& t, std::chrono::steady_clock::time_point now) const;
  void end(int64_t done, int stopped_by);  // the last record, checkpoint and summary

  ModeContext& ctx;
  const TrainOptions& o;
  Runtime& rt;
  Device& dev;
  Ops& ops;
  const int64_t steps, log_every, save_every, batch;
  const int micro_batches;
  const Parallelism& par;
  const Sharding sharding;
  const SyncStrategy strategy;
  const double bucket_mb;
  const DataOrder order;
  const uint64_t seed;
  const Precision precision;
  const AttentionKind attention;
  const MemoryPlan memory;
  const bool share_copy;
  const bool reduce_in_bf16;
  const GradientDType grads;
  const int tp;
  const double max_grad_norm;
  const bool sharded;  // zero2, zero3: the shards hold the parameters
  // --tp: this rank's tensor-parallel group and the collectives inside each layer over it.
  const std::unique_ptr<TensorParallelMesh> tp_mesh;
  const MeshRuntimes& groups;
  const MeshPlace& mesh;
  const Runtime& dp_rt;  // data parallelism's ranks: all of them without --tp
  CommTensorParallelGroup* const tp_group;

  // check_inputs()
  TokenData data;
  ModelConfig config;
  SyncPlan plan;
  int shard_group;  // ranks that share one copy of the model state
  std::optional<CheckpointInfo> init;
  std::vector<std::string> notes;  // on the model against --init's (resolve_config)
  bool graphed = false;
  LocalBatch mine;  // this rank's sequences of each global batch
  int64_t micro_size = 0;

  // build()
  ShardGroups comms;  // the data-parallel ranks' (none where this rank trains alone)
  Communicator* comm = nullptr;
  CollectiveEngine engine = CollectiveEngine::Sm;
  int64_t seq = 0;  // sequences are as long as the model's context
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<DataParallelTraining> training;
  AdamW* opt = nullptr;
  GradientSync* sync = nullptr;
  LrSchedule schedule;
  MemoryBreakdown after_init;

  // The record and the steps so far.
  Record rec;
  std::vector<double> loss, lr, grad_norm, step_ms, wall_ms, fwd_ms, bwd_ms, sync_ms, param_sync_ms, opt_ms, tp_comm_ms,
      tp_busy_ms;
  CommTensorParallelGroup::Traffic tp_traffic;  // of the last step, the same every step
  std::unique_ptr<DeviceMonitor> monitor;       // the GPU's clocks over the run
  StepTimeline timeline;
  std::unique_ptr<DataParallelBusy> busy;            // with a data-parallel sync: its collectives' device time
  std::string kept;                                  // kept_options: the same for every checkpoint of the run
  std::chrono::steady_clock::time_point first_done;  // the time left is told from the steps after the first
  double wall_after_first_ms = 0;                    // wall_ms summed over the steps after the first
  RecordFlush flush{ctx.recorder, ctx.flush};        // the record's writes; destroyed first
};

TrainRun::TrainRun(ModeContext& ctx, const TrainOptions& o)
    : ctx(ctx), o(o), rt(ctx.rt), dev(*ctx.backend.device), ops(*ctx.backend.ops), steps(o.steps),
      log_every(o.log_every), save_every(o.save_every), batch(o.batch), micro_batches(o.micro_batches), par(o.parallel),
      sharding(par.sharding), strategy(par.strategy), bucket_mb(par.bucket_mb), order(o.order), seed(o.seed),
      precision(o.precision), attention(o.attention), memory(o.memory),
      share_copy(shares_compute_copy(par.share_weights, precision, memory, sharding)),
      reduce_in_bf16(par.reduce_in_bf16), grads(o.grads), tp(par.tensor_parallel), max_grad_norm(o.clip_grad_norm),
      sharded(shards_parameters(sharding)), tp_mesh(make_tensor_parallel_mesh(rt, tp, o.backend, dev)),
      groups(tp_mesh->ranks), mesh(groups.place), dp_rt(groups.dp), tp_group(tp_mesh->group.get()),
      shard_group(dp_rt.world_size) {
  if (tp_group) tp_group->time_collectives(true);  // taken every step (take_traffic)
  // Everything that can be wrong with files or the device, agreed on by all ranks.
  check_inputs();
  build();
  describe();
  make_record();
}

void TrainRun::check_inputs() {
  // zero2, zero3: the state is cut among a group's ranks (every rank's, unless hybrid). Its
  // reductions come before the checks below, which may fail on some ranks only (a file one node
  // lacks): a rank must not wait in them for ranks already agreeing on an error.
  collective_check(rt, [&] {
    shard_group = resolve_shard_group(par.shard_group, sharding, dp_rt);
    check_zero1_groups(par, shard_group, dp_rt.world_size);
  });
  warn_of_node_shard_groups(rt, dp_rt, par.shard_group, shard_group);
  collective_check(rt, [&] {
    if (o.cuda_graph && dev.kind() != DeviceKind::Cuda) throw UsageError(kCudaGraphNeedsCuda);
    graphed = o.cuda_graph;
    data = TokenData::open(o.data);
    if (!o.init.empty()) {
      try {
        init = inspect_checkpoint(o.init);
      } catch (const UsageError& e) {  // the file's own message, naming the option it came from
        throw UsageError(std::string("--init: ") + e.what());
      }
    }
    config = resolve_config(o, init ? &*init : nullptr, rt.world_size, notes);
    if (init) check_checkpoint_fits(o.init, ParameterLayout(config));
    data.validate(config.vocab_size, config.context_length);
    if (!o.save.empty() && rt.is_root()) {  // rank 0 writes it
      const std::string& save = o.save;
      check_output_file("--save", save);
      std::error_code ec;
      if (std::filesystem::equivalent(save, o.data, ec))
        throw UsageError("--save '" + save + "' is the --data file: the checkpoint would replace the tokens");
      // A checkpoint is replaced (a run saved again under one name); any other file is the
      // user's and is never written over: --data and --save swapped would lose the tokens.
      if (std::filesystem::exists(save, ec)) {
        try {
          inspect_checkpoint(save);
        } catch (const UsageError&) {
          throw UsageError("--save '" + save + "' exists and is not an llmhpc checkpoint: the checkpoint would " +
                           "replace it; name a new file (e.g. model.h5), or remove that one first");
        }
      }
      if (is_rank_file_of(save, ctx.out_dir))
        throw UsageError("--save '" + save + "' is a rank file of this run's --out: the checkpoint would replace " +
                         "its records; name it otherwise (e.g. " + ctx.out_dir + "/checkpoint.h5)");
    }
    check_parallelism(par, precision, memory, rt.world_size);
    if (graphed && rt.world_size > 1)
      throw UsageError("--cuda-graph trains on one rank: data parallelism's collectives are not recorded in the graph");
    const int64_t share = local_batch(batch, dp_rt.rank, dp_rt.world_size).count;
    if (share % micro_batches != 0)
      throw UsageError("--batch-size " + std::to_string(batch) + " gives each of " + std::to_string(dp_rt.world_size) +
                       " data-parallel rank(s) " + std::to_string(share) +
                       " sequences, which do not split into --grad-accum " + std::to_string(micro_batches) +
                       " equal micro-batches: give a global batch divisible by " +
                       std::to_string(dp_rt.world_size * micro_batches) + " (data-parallel ranks x micro-batches)");
    check_tensor_parallel_case(config, rt.world_size, tp, par.sequence_parallel, par.tp_overlap,
                               share / micro_batches * config.context_length,
                               "--batch-size, --context-length or --grad-accum");
    // After the tensor-parallel checks, which know the rank count that the layout's own does not.
    plan = data_parallel_plan(strategy, sharding, ParameterLayout(config, {tp, mesh.tp_rank}), precision, grads,
                              bucket_mb, shard_group, shard_alignment(dev, precision, share_copy), reduce_in_bf16);
  });
  // Every rank read a file (a node its own copy, say): the same tokens?
  const int64_t fewest = rt.reduce_all(data.size(), HostReduce::Min);
  const int64_t most = rt.reduce_all(data.size(), HostReduce::Max);
  if (fewest != most)
    throw AgreedError("--data " + o.data + ": the ranks read files of " + std::to_string(fewest) + " to " +
                      std::to_string(most) + " tokens; every rank must read the same tokens");
  mine = local_batch(batch, dp_rt.rank, dp_rt.world_size);
  micro_size = mine.count / micro_batches;
}

void TrainRun::build() {
  if (strategy != SyncStrategy::None)
    collective_check(rt, [&] {
      comms = make_shard_groups(dp_rt, resolve_backend(o.backend, dev.kind()), dev, shard_group,
                                par.engine == CollectiveEngine::Copy);
    });
  comm = comms.shard.get();
  engine = comm && !comms.replicas ? resolve_collective_engine(par.engine, strategy, sharding, dp_rt, dev, *comm)
                                   : CollectiveEngine::Sm;  // hybrid: the groups' average takes NCCL's kernels
  seq = config.context_length;                              // sequences are as long as the model's context
  collective_check(rt, [&] {
    const ModelStorage storage = model_storage(plan);
    TransformerLM::Config model_config{config,
                                       precision,
                                       attention,
                                       memory,
                                       storage.flat_elements,
                                       GradientStorage::Whole,
                                       grads,
                                       storage.parameters,
                                       tp_mesh->model_config(par.sequence_parallel, par.tp_overlap)};
    model = std::make_unique<TransformerLM>(model_config, dev, ops);
    training = std::make_unique<DataParallelTraining>(plan, comm, comms.replicas.get(), *model, ops, o.hyper,
                                                      micro_batches > 1);
    after_init = model_memory(dev.allocator());
    // Sharded parameters are drawn from the seed on every rank, each rank keeping its parts:
    // rank 0's weights, with no broadcast.
    if (init) training->load(o.init);
    else training->initialize(seed);
    const AdamW& opt = training->optimizer();
    schedule = o.schedule;
    if (!o.decay_steps_given) schedule.decay_steps = opt.steps_taken() + steps;  // this run's last step
    schedule.validate();
    if (schedule.decay != LrDecay::Constant && schedule.decay_steps <= opt.steps_taken())
      throw UsageError("--lr-decay-steps " + std::to_string(schedule.decay_steps) + ": the checkpoint is at step " +
                       std::to_string(opt.steps_taken()) + ", so every step of this run would train at --min-lr " +
                       fmt_exact(schedule.min) + "; give a later end of decay (--lr-decay-steps " +
                       std::to_string(opt.steps_taken() + steps) + ": this run's last step, decaying anew from --lr " +
                       fmt_exact(schedule.peak) + "), or --lr-schedule constant --lr " + fmt_exact(schedule.min) +
                       " if that is meant");
  });
  opt = &training->optimizer();
  if (max_grad_norm > 0) training->clip_gradients(max_grad_norm, rt, tp);
  training->start(share_copy, engine);  // every rank from rank 0's weights, whatever its seed or file
  sync = training->sync();
}

void TrainRun::describe() const {
  log_root(
      rt, "train: %s (%.1fM parameters), %s, %lld steps of %lld x %lld tokens from %s (%lld tokens, %s order)%s\n",
      config.name.c_str(), double(config.num_params()) / 1e6,
      (precision_name(precision) + std::string(grads == GradientDType::BF16 ? " with bf16 gradients" : "")).c_str(),
      (long long)steps, (long long)batch, (long long)seq, data.path().c_str(), (long long)data.size(),
      order == DataOrder::Random ? "random" : "sequential",
      init ? (", from " + o.init + " at step " + std::to_string(opt->steps_taken())).c_str() : "");
  for (const std::string& note : notes) log_root(rt, "train: %s\n", note.c_str());
  const int64_t last_step = opt->steps_taken() + steps;
  if (schedule.decay != LrDecay::Constant && schedule.decay_steps < last_step)
    log_root(
        rt, "train: note: the decay ends at step %lld (--lr-decay-steps), so steps %lld to %lld train at --min-lr %s\n",
        (long long)schedule.decay_steps, (long long)schedule.decay_steps + 1, (long long)last_step,
        fmt_exact(schedule.min).c_str());
  if (micro_batches > 1)
    log_root(rt, "train: each step in %d micro-batches of %lld sequence%s per rank, gradients added up%s\n",
             micro_batches, (long long)micro_size, micro_size == 1 ? "" : "s",
             grads == GradientDType::BF16 ? " in bf16" : "");
  note_cpu_bf16(ctx, {precision});
  if (sync)
    log_root(
        rt, "train: %s of %lld sequence%s each, --ddp %s%s (%s per step)%s\n",
        counted(dp_rt.world_size, tp > 1 ? "data-parallel rank" : "rank").c_str(), (long long)mine.count,
        mine.count == 1 ? "" : "s", sync_strategy_name(strategy),
        ((strategy == SyncStrategy::Bucketed ? " " + fmt_exact(bucket_mb) + " MiB" : std::string()) +
         (reduce_in_bf16 || grads == GradientDType::BF16 ? ", gradients averaged in bf16" : ""))
            .c_str(),
        counted(int64_t(sync->buckets().size()), "collective").c_str(),
        sharding == Sharding::None
            ? ""
            : (std::string(", --shard-optimizer ") + sharding_name(sharding) + ": rank 0 updates " +
               fmt(100.0 * double(owned_parameters(plan, 0, model->layout())) / double(model->layout().total()), 1) +
               "% of " + (tp > 1 ? "its part's" : "the") + " parameters" +
               (sharded ? std::string(" and holds them") : std::string()) +
               (share_copy ? ", --share-weights bf16" : "") +
               (engine == CollectiveEngine::Copy ? ", gradients moved by the copy engines" : ""))
                  .c_str());
  if (sync && tp > 1 && dp_rt.world_size == 1)
    log_root(rt,
             "train: note: --tp %d on %s leaves one data-parallel rank: --ddp and --shard-optimizer share with no "
             "other (run a multiple of --tp ranks for data parallelism across the groups)\n",
             tp, counted(rt.world_size, "rank").c_str());

  if (tp > 1) {
    // Which ranks work together, where the list is short: each tensor-parallel group and, across
    // them, each data-parallel group of the ranks holding the same part (mesh_place's layout).
    std::string who;
    if (mesh.dp_size <= 8) {
      std::vector<std::vector<int>> in_tp(static_cast<size_t>(mesh.dp_size)), in_dp(static_cast<size_t>(tp));
      for (int r = 0; r < rt.world_size; ++r) {
        const MeshPlace p = mesh_place(r, rt.world_size, tp);
        in_tp[size_t(p.dp_rank)].push_back(r);
        in_dp[size_t(p.tp_rank)].push_back(r);
      }
      std::vector<std::string> tp_groups, dp_groups;
      for (const std::vector<int>& g : in_tp) tp_groups.push_back(rank_ranges(g));
      for (const std::vector<int>& g : in_dp) dp_groups.push_back(rank_ranges(g));
      who = " (ranks " + join(tp_groups, "; ") +
            (mesh.dp_size > 1 ? "; data-parallel across them: " + join(dp_groups, "; ") : "") + ")";
    }
    log_root(rt, "train: tensor parallelism: %s of --tp %d consecutive ranks%s%s, each rank %s of every layer%s\n",
             counted(mesh.dp_size, "group").c_str(), tp, who.c_str(),
             par.sequence_parallel ? " with sequence parallelism" : "", ("1/" + std::to_string(tp)).c_str(),
             par.tp_overlap > 1
                 ? ("; forward's products in " + std::to_string(par.tp_overlap) + " chunks (--tp-overlap)").c_str()
                 : "");
  }
}

void TrainRun::make_record() {
  rec.group = "train";
  rec.attr("model", config.name)
      .attr("d_model", config.d_model)
      .attr("d_ff", config.d_ff)
      .attr("num_layers", config.num_layers)
      .attr("num_heads", config.num_heads)
      .attr("vocab_size", config.vocab_size)
      .attr("context_length", seq)
      .attr("batch_size", batch)
      .attr("local_batch_size", mine.count)
      .attr("grad_accum", int64_t(micro_batches))
      .attr("world_size", int64_t(rt.world_size))
      .attr("tp", int64_t(tp))
      .attr("dp", int64_t(mesh.dp_size))
      .attr("tp_rank", int64_t(mesh.tp_rank))
      .attr("dp_rank", int64_t(mesh.dp_rank))
      .attr("sequence_parallel", int64_t(par.sequence_parallel ? 1 : 0))
      .attr("tp_overlap", int64_t(par.tp_overlap))
      .attr("ddp", std::string(sync_strategy_name(strategy)))
      .attr("bucket_mb", bucket_mb)
      .attr("buckets", int64_t(sync ? sync->buckets().size() : 0))
      .attr("shard_optimizer", std::string(sharding_name(sharding)))
      .attr("shard_group", int64_t(shard_group))
      .attr("share_weights", std::string(shared_weights_name(share_copy, sharding, precision)))
      .attr("collective_engine", std::string(collective_engine_name(engine)))
      .attr("grad_reduce_dtype", grad_reduce_dtype_name(plan.reduce_in_bf16, model->grad_dtype()))
      .attr("optimizer_owned_elements", opt->owned_elements())
      .attr("precision", std::string(precision_name(precision)))
      .attr("attention", std::string(attention_name(attention)))
      .attr("low_memory", int64_t(memory == MemoryPlan::LowMemory ? 1 : 0))
      .attr("grad_dtype", std::string(dtype_name(model->grad_dtype())))
      .attr("data", data.path())
      .attr("data_order", std::string(order == DataOrder::Random ? "random" : "sequential"))
      .attr("lr", schedule.peak)
      .attr("lr_schedule", std::string(lr_decay_name(schedule.decay)))
      .attr("lr_warmup_steps", schedule.warmup_steps)
      .attr("lr_decay_steps", schedule.decay == LrDecay::Constant ? int64_t(0) : schedule.decay_steps)
      .attr("min_lr", schedule.decay == LrDecay::Constant ? schedule.peak : schedule.min)
      .attr("clip_grad_norm", max_grad_norm)
      .attr("weight_decay", opt->hyper().weight_decay)
      .attr("beta1", opt->hyper().beta1)
      .attr("beta2", opt->hyper().beta2)
      .attr("eps", opt->hyper().eps)
      .attr("init", o.init)
      .attr("init_options_taken", o.taken_from_init)
      .attr("first_step", opt->steps_taken() + 1)
      .attr("cuda_graph", int64_t(graphed ? 1 : 0));
  record_memory(rec, "after_init", after_init);
}

void TrainRun::save_progress(const std::string& status) { flush.write_now(progress_record(status)); }

Record TrainRun::progress_record(const std::string& status) {
  Record r = rec;
  r.status = status;
  r.add("loss", loss)
      .add("lr", lr)
      .add("step_ms", step_ms)
      .add("wall_ms", wall_ms)
      .add("forward_ms", fwd_ms)
      .add("backward_ms", bwd_ms)
      .add("optimizer_ms", opt_ms);
  if (sync) r.add("sync_ms", sync_ms).add("param_sync_ms", param_sync_ms);
  if (tp_group) {
    r.attr("tp_collectives_per_step", tp_traffic.collectives).attr("tp_bus_bytes_per_step", tp_traffic.bytes);
    r.add("tp_comm_ms", tp_comm_ms);
    if (std::all_of(tp_busy_ms.begin(), tp_busy_ms.end(), [](double ms) { return std::isfinite(ms); }))
      r.add("tp_comm_busy_ms", tp_busy_ms);
  }
  if (max_grad_norm > 0) r.add("grad_norm", grad_norm);
  r.attr("peak_memory_bytes", dev.allocator().peak_bytes());
  record_sensors(r, monitor->snapshot());
  record_arrivals(r);
  return r;
}

void TrainRun::finish_collectives(Record& r) {
  if (!busy) return;
  const std::vector<double>& per_step = busy->finish();
  if (busy->measured()) r.add("comm_busy_ms", per_step);
  timeline.record(r);
  busy.reset();
}

void TrainRun::save(const std::string& when) {
  model->wait_parameters();  // a sharded step's last all-gathers, before anything reads the weights
  const Runtime* parts = tp > 1 ? &groups.tp : nullptr;  // the tensor-parallel group's other parts
  try {
    training->save(dp_rt, o.save, parts, kept);
  } catch (const AgreedWriteFailed& e) {  // every rank: the run ends here, the steps so far kept
    finish_collectives(rec);
    save_progress(std::string("error: ") + e.what());
    throw;
  }
  log_root(rt, "saved %s (%s; optimizer step %lld)\n", o.save.c_str(), when.c_str(), (long long)opt->steps_taken());
}

void TrainRun::stop_out_of_memory(double ranks_out, const std::string& this_rank, int64_t step) {
  const bool fits = this_rank.empty();
  const int first = int(rt.reduce_all(int64_t(fits ? rt.world_size : rt.rank), HostReduce::Min));
  std::string what = rt.broadcast(this_rank, first);
  if (rt.world_size > 1)
    what =
        (ranks_out >= rt.world_size ? "every rank ran out; rank " + std::to_string(first) + ": "
         : ranks_out > 1 ? std::to_string(int64_t(ranks_out)) + " ranks ran out; rank " + std::to_string(first) + ": "
                         : "rank " + std::to_string(first) + ": ") +
        what;
  rec.attr("error", what);
  save_progress("oom");
  // Sharding is offered where there are data-parallel ranks to share the model state.
  throw AgreedOutOfMemory(what + " at step " + std::to_string(step) +
                          "; a step fits with a smaller --batch-size, --grad-accum 2 or more, " +
                          (dp_rt.world_size > 1 ? "a --shard-optimizer stage that shards more (zero2, zero3), " : "") +
                          "--low-memory, or a larger --memory-limit");
}

void TrainRun::log_progress(int64_t done, const StepTimes& t, std::chrono::steady_clock::time_point now) const {
  const double per_step =
      done > 1 ? std::chrono::duration<double>(now - first_done).count() / double(done - 1) : t.step_ms / 1e3;
  char shape[96] = "";  // what shaped the step's update, where the user asked for it
  if (schedule.decay != LrDecay::Constant || schedule.warmup_steps > 0)
    std::snprintf(shape, sizeof shape, "  lr %.3e", lr.back());
  if (max_grad_norm > 0)
    std::snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "  grad norm %.4g", grad_norm.back());
  // The wall time per step (the recorded wall_ms after the first step), what the run goes at;
  // where the step's own time is well under it, the rest is the host's part (the batch, waits
  // for a slower rank at the loss's reduction). Checkpoints written between steps are in the
  // time left (per_step), not in a step.
  const double step_wall_ms = done > 1 ? wall_after_first_ms / double(done - 1) : t.step_ms;
  char host[96] = "";
  if (done > 1 && t.step_ms < 0.8 * step_wall_ms)
    std::snprintf(host, sizeof host, "step %.1f + host's part and waits %.1f = ", t.step_ms, step_wall_ms - t.step_ms);
  log_root(rt, "step %5lld/%lld  loss %.6f%s  %s%.1f ms/step%s\n", (long long)done, (long long)steps, loss.back(),
           shape, host, step_wall_ms,
           done == steps ? "" : (", " + format_duration(per_step * double(steps - done)) + " left").c_str());
}

void TrainRun::end(int64_t done, int stopped_by) {
  finish_collectives(rec);   // the last steps' collectives, before wait_parameters() issues more
  model->wait_parameters();  // the last step's all-gathers, before the sync goes
  if (stopped_by) {
    const std::string why = "interrupted: " + signal_name(stopped_by) + " after step " + std::to_string(done) + " of " +
                            std::to_string(steps);
    save_progress(why);
    if (!o.save.empty()) save("stopped by " + signal_name(stopped_by));
    log_root(rt, "train: stopped by %s after step %lld of %lld%s; results in %s\n", signal_name(stopped_by).c_str(),
             (long long)done, (long long)steps,
             !o.save.empty()
                 // the checkpoint keeps the schedule, its end of decay included, and the other options
                 // that shape the training (kept_options)
                 ? ("; go on with --init " + o.save + " --steps " + std::to_string(steps - done)).c_str()
                 : " (no --save: the weights are not kept)",
             ctx.out_dir.c_str());
    throw Interrupted{stopped_by, why};
  }
  monitor->stop();
  save_progress("ok");
  if (!o.save.empty()) save("the last step");
  const std::string clocks = slowdown_note(rt, monitor->summary());
  // The steps after the first, which also allocates and (on a GPU) warms up, and their
  // throughput as the run had it: with the host's part of each step (its batch, the loss's
  // reduction over the ranks), which the device's step time leaves out.
  // --cuda-graph records its graph in the second step: that one is left out too.
  const size_t skip = std::min(step_ms.size() - 1, size_t(graphed ? 2 : 1));
  const double device_ms = mean(std::vector<double>(step_ms.begin() + ptrdiff_t(skip), step_ms.end()));
  const double whole_ms = mean(std::vector<double>(wall_ms.begin() + ptrdiff_t(skip), wall_ms.end()));
  const std::string which = skip == 0   ? " (the one step, with its allocation and warm-up)"
                            : skip == 1 ? " after the first"
                                        : " after the first " + std::to_string(skip);
  log_root(rt,
           "train: final loss %.6f, mean step %.1f ms%s (%.1f ms with the host's part), %s tokens/s%s; results in %s\n",
           loss.back(), device_ms, which.c_str(), whole_ms, fmt(double(batch * seq) / (whole_ms / 1000.0), 0).c_str(),
           clocks.c_str(), ctx.out_dir.c_str());
}

void TrainRun::run() {
  monitor = device_monitor(ctx);
  monitor->start();
  std::vector<int32_t> inputs(mine.count * seq), targets(mine.count * seq);
  // Steps alternate between two timers, so that the data-parallel collectives' spans can be read
  // during the next step, where the host waits for the device anyway (src/modes/step_timeline.h).
  auto timer = dev.make_timer(step_marks(micro_batches)), other_timer = dev.make_timer(step_marks(micro_batches));
  if (sync) busy = std::make_unique<DataParallelBusy>(*comm, comms.replicas.get(), timeline, micro_batches);
  kept = kept_options(o, schedule);

  // --grad-accum: the rank's share in micro-batches of micro_size sequences, each one's mean loss
  // weighted 1/micro_batches in backward and added into the step's.
  double micro_losses = 0;
  const MicroBatches micro{micro_batches,
                           [&](int i) {
                             model->set_batch(inputs.data() + i * micro_size * seq,
                                              targets.data() + i * micro_size * seq, micro_size, seq);
                           },
                           [&](int) { micro_losses += model->mean_loss() / micro_batches; }};
  if (micro_batches > 1) model->set_loss_weight(1.0 / micro_batches);
  std::unique_ptr<GraphedStep> graph;  // --cuda-graph: recorded at the second step, after the first allocated all
  // The record exists, status "running", before the first step: a run that hangs or is killed
  // early leaves its configuration beside the watchdog's report.
  save_progress("running");
  Watchdog::instance().set_context("train");
  const int64_t first_batch = opt->steps_taken();  // from a checkpoint: the batches after its steps
  int stopped_by = 0;                              // the signal all ranks agreed to stop on
  int64_t done = 0;
  for (int64_t s = 0; s < steps && !stopped_by; s = done) {
    const int64_t step = first_batch + s + 1;  // the optimizer's step, as the record's first_step counts
    const auto began = std::chrono::steady_clock::now();
    Watchdog::instance().set_step(step);
    data.fill_batch(first_batch + s, batch, seq, mine.first, mine.count, order, seed, inputs.data(), targets.data());
    if (micro_batches == 1) model->set_batch(inputs.data(), targets.data(), mine.count, seq);
    micro_losses = 0;
    opt->hyper().lr = schedule.at(opt->steps_taken() + 1);
    StepTimes t;
    Timer& on = s % 2 == 0 ? *timer : *other_timer;
    if (busy) busy->step_begins(on);
    std::string out_of_memory;  // this rank's allocator's message, where the step did not fit
    try {
      if (graphed && s == 1) graph = std::make_unique<GraphedStep>(*model, opt, Phase::TrainStep);
      t = graph ? graph->run(on)
                : run_step(*model, opt, Phase::TrainStep, on, sync, nullptr, micro_batches > 1 ? &micro : nullptr, [&] {
                    if (busy) busy->settle_previous();
                  });
    } catch (const OutOfMemory& e) {
      // The ranks agree on it in the step's reduction below, which every rank reaches (a rank that
      // went on into a collective this one left out waits for it: the watchdog ends the job then).
      out_of_memory = e.what();
      Watchdog::instance().settle_after_failure("out of memory (" + out_of_memory + ")");
    }
    const bool fits = out_of_memory.empty();
    if (tp_group && fits) {
      tp_traffic = tp_group->take_traffic(&on);  // complete: the step waited for each
      tp_comm_ms.push_back(tp_traffic.exposed_ms);
      tp_busy_ms.push_back(tp_traffic.busy_ms);
    }
    if (busy && fits) busy->step_ended(t, std::move(tp_traffic.spans));
    if (s == 0 && fits) {  // the memory points around the first optimizer step, which allocates its state
      record_memory(rec, "before_optimizer", t.memory_before_optimizer);
      record_memory(rec, "after_optimizer", model_memory(dev.allocator()));
    }
    // The mean over the global batch (the local batches are equal, so the mean of the means),
    // and in the same collective whether a signal asked any rank to stop, and whether a rank ran
    // out of memory: all stop together.
    const std::vector<double> reduced = rt.reduce_all(std::vector<double>{!fits               ? 0.0
                                                                          : micro_batches > 1 ? micro_losses
                                                                                              : model->mean_loss(),
                                                                          stop_signal() ? 1.0 : 0.0, fits ? 0.0 : 1.0},
                                                      HostReduce::Sum);
    // The losses so far are kept; the run ends, rank 0 says why (main).
    if (reduced[2] > 0) stop_out_of_memory(reduced[2], out_of_memory, step);
    wall_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    if (wall_ms.size() > 1) wall_after_first_ms += wall_ms.back();
    loss.push_back(reduced[0] / rt.world_size);
    lr.push_back(opt->hyper().lr);
    grad_norm.push_back(opt->last_grad_norm());
    done = s + 1;
    if (reduced[1] > 0 && done < steps) stopped_by = int(rt.reduce_all(int64_t(stop_signal()), HostReduce::Max));
    sync_ms.push_back(t.sync_ms);
    param_sync_ms.push_back(t.param_sync_ms);
    step_ms.push_back(t.step_ms);
    fwd_ms.push_back(t.forward_ms);
    bwd_ms.push_back(t.backward_ms);
    opt_ms.push_back(t.optimizer_ms);
    // The global loss and norm are the same on every rank: all stop here together.
    const std::string hint = s == 0 && init ? " (the first step from --init: are the checkpoint's values finite? "
                                              "else try a lower --lr)"
                                            : " (try a lower --lr)";
    const std::string at = " at step " + std::to_string(step);
    const std::string of_run = at + " (this run's " + std::to_string(done) + " of " + std::to_string(steps) + ")";
    auto stop = [&](const std::string& status, const std::string& why) {
      finish_collectives(rec);  // the steps so far, kept with the error (every rank stops here)
      save_progress(status);
      throw AgreedError(why);
    };
    if (!std::isfinite(loss.back()))
      stop("error: loss is not finite" + at, "the loss became " + std::to_string(loss.back()) + of_run + hint);
    if (max_grad_norm > 0 && !std::isfinite(grad_norm.back()))
      stop("error: gradient norm is not finite" + at,
           "the gradients' norm became " + std::to_string(grad_norm.back()) + of_run + hint);
    const bool last = done == steps;
    const auto now = std::chrono::steady_clock::now();
    if (done == 1) first_done = now;
    if (last || stopped_by || (log_every > 0 && done % log_every == 0)) log_progress(done, t, now);
    // Keep the file current on long runs so a crash loses at most --flush-s of losses, and none
    // that a checkpoint holds: a run resumed from it keeps the curve up to it.
    const bool checkpoint = !last && !stopped_by && save_every > 0 && done % save_every == 0;
    if (checkpoint) save("every " + std::to_string(save_every) + " steps");
    if (checkpoint) save_progress("running");
    else flush.when_due(done, [&] { return progress_record("running"); });
  }
  end(done, stopped_by);
}

void run(ModeContext& ctx, const TrainOptions& o) {
  install_stop_handlers();  // from here a signal stops the run after its first step at the latest
  TrainRun(ctx, o).run();
}

}  // namespace

ModeSpec train_mode() {
  return {"train", "train the model on a token file, from scratch or a checkpoint", add_options,
          [](const po::variables_map& vm, int world_size) -> ModeRun {
            if (vm.count("init"))  // checked once the checkpoint's options are in (with_checkpoint_options)
              return [vm](ModeContext& ctx) { run(ctx, with_checkpoint_options(ctx.rt, vm)); };
            const TrainOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          }};
}

}  // namespace llmhpc

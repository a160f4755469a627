// Mode precision: the reference mixed-precision study's two questions. (1) The accumulation
// experiment: `--additions` sequential additions of `--value`, computed on the device in use
// (Ops::accumulation_experiment), in the reference study's four cases and one more (kAccumulation).
// (2) The dtype of every kind of tensor of the model under --precision, read off its buffers,
// beside the dtype torch.autocast gives the same tensor of the reference PyTorch model.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "src/modes/options.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// The rows of the accumulation experiment: the reference study's four cases, in its order, as
// PyTorch code (s the sum, x the value, 0-dim tensors), then bf16, the half precision of
// llmhpc's mixed precision. `sum`: which of Ops::accumulation_experiment's four sums it is. Cases
// 3 and 4 are one computation: PyTorch's `s += x` with an fp32 s converts an fp16 x to fp32
// before adding, as case 4's x.type(torch.float32) does, and so does the device's fp16-into-fp32 sum.
struct AccumulationCase {
  const char* name;
  const char* pytorch;
  int sum;
};
constexpr AccumulationCase kAccumulation[] = {
    {"fp32 values, fp32 sum", "s += x (both fp32)", 0},
    {"fp16 values, fp16 sum", "s += x (both fp16)", 1},
    {"fp16 values, fp32 sum", "s += x (s fp32, x fp16)", 2},
    {"fp16 values cast to fp32, fp32 sum", "s += x.type(torch.float32) (s fp32, x fp16)", 2},
    {"bf16 values, bf16 sum", "s += x (both bf16)", 3}};
constexpr int kAccumulationRows = int(sizeof kAccumulation / sizeof kAccumulation[0]);
// Additions per part of the experiment (below).
constexpr int64_t kAccumulationPart = int64_t(1) << 24;

// What torch.autocast(bfloat16) makes of each tensor of the reference model
// (tests/reference/torch_model.py); without autocast everything is the parameters' fp32.
// Matrix products (linear layers) run and return bf16; RMSNorm computes in fp32 and returns
// its fp32 input's dtype; cross_entropy runs in fp32; elementwise ops keep their inputs' dtype;
// gradients take the parameters' dtype. `consumed_bf16`: every reader of the tensor is a
// matrix product, which autocast feeds bf16, so storing it rounded to bf16 gives them the same
// values. `difference`: where llmhpc's dtype differs from autocast's on purpose, what that does.
struct AutocastRule {
  const char* tensor;
  DType autocast;
  bool consumed_bf16;
  const char* difference = nullptr;
};

const std::vector<AutocastRule>& autocast_rules() {
  static const std::vector<AutocastRule> rules = {
      {"parameters (master weights)", DType::F32, false},
      {"weights as the matrix products read them", DType::BF16, true},
      {"embedding output, residual stream", DType::F32, false},
      {"RMSNorm output (ln1, ln2, ln_final)", DType::F32, true},
      {"RMSNorm statistics (rstd)", DType::F32, false},
      {"attention q, k, v projections", DType::BF16, false},
      {"attention probabilities (softmax output, kept for backward)", DType::F32, false,
       "half the bytes: P V reads it as bf16 under autocast too; "
       "softmax's backward reads the rounded values"},
      {"attention logsumexp (kept for backward)", DType::F32, false},
      {"attention output (before output_proj)", DType::BF16, false},
      {"attention block output (output_proj)", DType::BF16, false},
      {"FFN W1 x, W3 x", DType::BF16, false},
      {"FFN SwiGLU product", DType::BF16, false},
      {"FFN block output (W2)", DType::BF16, false},
      {"logits (LM head output)", DType::BF16, false},
      {"loss", DType::F32, false},
      {"parameter gradients", DType::F32, false}};
  return rules;
}

// Whether llmhpc's `dtype` of rule `r`'s tensor gives the values autocast's `expected` does: the
// same dtype, or the bf16 its only readers, matrix products, get under autocast too.
bool same_values(const AutocastRule& r, DType dtype, DType expected) {
  return dtype == expected || (r.consumed_bf16 && dtype == DType::BF16);
}

// That, in words: "same", the bf16 its readers get, the rule's known difference, or "DIFFERS".
std::string dtype_note(const AutocastRule& r, DType dtype, DType expected) {
  if (dtype == expected) return "same";
  if (same_values(r, dtype, expected)) return "stored as the bf16 the matrix products read under autocast too";
  return r.difference ? r.difference : "DIFFERS";
}

void add_options(po::options_description& desc) {
  po::options_description prec("Precision options");
  prec.add_options()("additions", po::value<std::string>()->default_value("1000"),
                     "accumulation experiment: how many additions")(
      "value", po::value<std::string>()->default_value("0.01"), "accumulation experiment: the value added");
  po::options_description model("Model options (the dtype table)");
  const ListUse one_model{"precision", "its dtype table is of one model"};
  add_model_options(model, one_model);
  model.add_options()("precision", listable(one_model, "precision", "bf16"),
                      "fp32 | bf16 (autocast-style mixed precision) | fp64: the dtype table's precision")(
      "attention", listable(one_model, "attention", "flash"), "naive | flash");
  desc.add(prec).add(model);
}

// Everything precision takes from the command line, parsed and checked once by parse_options
// before any file or device is touched; run() reads only this.
struct PrecisionOptions {
  int64_t additions = 0;
  double value = 0;
  Precision precision = Precision::FP32;
  AttentionKind attention = AttentionKind::Naive;
  ModelConfig config;  // the dtype table's model
};

PrecisionOptions parse_options(const po::variables_map& vm, int) {
  PrecisionOptions o;
  o.additions = opt_positive(vm, "additions");
  o.value = opt_double(vm, "value");
  o.precision = parse_precision(opt_string(vm, "precision"));
  o.attention = parse_attention(opt_string(vm, "attention"));
  o.config = model_configs(vm).front();
  return o;
}

// As PyTorch prints a 0-dim tensor: 4 decimals ("tensor(10.0001)", "tensor(4., dtype=...)"),
// in scientific notation from 1e8 up and below 1e-4 ("tensor(3.0000e-05)").
std::string torch_print(float v) {
  char buf[64];
  const double a = std::fabs(double(v));
  if (a != 0 && (a >= 1e8 || a < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.4e", double(v));
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.4f", double(v));
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') return s;  // PyTorch prints "4." for an integral value
  return buf;
}

void run(ModeContext& ctx, const PrecisionOptions& o) {
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  const int64_t n = o.additions;
  const double value = o.value;
  const ModelConfig& config = o.config;
  const Precision precision = o.precision;
  const AttentionKind attention = o.attention;
  collective_check(ctx.rt, [&] { ops.attention_saved({1, 1, 1, 2, true, attention}, compute_dtype(precision)); });
  Sweep sweep(ctx, "precision", 2, {"part", "status"});

  // (1) The accumulation experiment, on the device: its four sums, one row per case.
  std::vector<std::string> names;
  std::vector<double> sums(kAccumulationRows, NAN);
  for (const AccumulationCase& c : kAccumulation) names.push_back(c.name);
  Record acc;
  acc.group = "precision/accumulation";
  acc.attr("value", value).attr("additions", n).attr("device", dev.name());
  SweepStatus st = sweep.run("accumulation experiment", acc, [&] {
    Buffer out(dev.allocator(), DType::F32, {4}, "precision.sums");
    dev.fill_zero(out.tensor().data, out.tensor().bytes());
    float device_sums[4] = {};
    int64_t done = 0;
    auto record_sums = [&](Record& r) {
      for (int k = 0; k < kAccumulationRows; ++k) sums[size_t(k)] = double(device_sums[kAccumulation[k].sum]);
      r.add("experiment", names);
      r.add("sum", sums);
    };
    SweepSteps progress(sweep, acc, n, "additions", [&](Record& r) {
      record_sums(r);
      r.attr("additions_done", done);
    });
    // In parts of well under a second (one GPU thread, or one core), each read back: the sums so
    // far, and rank 0's progress through an experiment of billions of additions.
    while (done < n) {
      const int64_t part = std::min(kAccumulationPart, n - done);
      ops.accumulation_experiment(out, value, part);
      dev.copy_to_host(device_sums, out.tensor().data, sizeof device_sums);
      done += part;
      progress.update(done, n);
    }
    record_sums(acc);
    return std::string("done");
  });
  sweep.add_row({"accumulation experiment", st.column()});

  // (2) The dtype table: the model's buffers under `precision` (built, not run: storage is
  // the plan's, on every device), beside autocast's rule.
  std::vector<std::pair<std::string, DType>> dtypes;
  Record tab;
  tab.group = "precision/dtypes";
  tab.attr("precision", std::string(precision_name(precision)))
      .attr("attention", std::string(attention_name(attention)))
      .attr("model", config.name);
  st = sweep.run("dtype table", tab, [&] {
    TransformerLM model({config, precision, attention, MemoryPlan::Fast, 0, GradientStorage::PerRange}, dev, ops);
    const std::vector<int32_t> tokens(size_t(config.context_length), 0);
    model.set_batch(tokens.data(), tokens.data(), 1, config.context_length);
    dtypes = model.storage_dtypes();
    std::vector<std::string> tensor, mine, autocast, notes;
    std::vector<int64_t> same;
    for (const auto& [name, dtype] : dtypes) {
      const AutocastRule* rule = nullptr;
      for (const AutocastRule& r : autocast_rules())
        if (name == r.tensor) rule = &r;
      LLMHPC_CHECK(rule != nullptr, "no autocast rule for '" + name + "'");
      const DType expected = precision == Precision::BF16 ? rule->autocast : param_dtype(precision);
      tensor.push_back(name);
      mine.push_back(dtype_name(dtype));
      autocast.push_back(precision == Precision::BF16 ? dtype_name(expected) : "(no autocast)");
      same.push_back(same_values(*rule, dtype, expected));  // bf16 buffers exist under --precision bf16 only
      notes.push_back(dtype_note(*rule, dtype, expected));
    }
    tab.add("tensor", tensor)
        .add("llmhpc_dtype", mine)
        .add("autocast_dtype", autocast)
        .add("same_values", same)
        .add("note", notes);
    return std::string("done");
  });
  sweep.add_row({"dtype table", st.column()});
  if (!ctx.rt.is_root()) return;

  std::printf(
      "\naccumulation experiment: %lld additions of %g on %s (PyTorch prints 4 decimals; the 3rd and 4th\n"
      "are one computation: PyTorch's s += x converts an fp16 x to fp32 first, as x.type(torch.float32) does)\n",
      (long long)n, value, dev.name().c_str());
  TextTable a({"experiment", "in PyTorch", "as PyTorch prints it", "sum", "error"});
  for (int k = 0; k < kAccumulationRows; ++k) {
    const double sum = sums[size_t(k)];
    a.add_row({names[size_t(k)], kAccumulation[k].pytorch, torch_print(float(sum)), fmt(sum, 9),
               fmt(sum - value * double(n), 6)});
  }
  a.print();
  std::printf("\ndtype of each tensor under --precision %s (llmhpc's buffers; torch.autocast's result):\n",
              precision_name(precision));
  TextTable d({"tensor", "llmhpc", "autocast", "note"});
  for (const auto& [name, dtype] : dtypes) {
    for (const AutocastRule& r : autocast_rules()) {
      if (name != r.tensor) continue;
      const DType expected = precision == Precision::BF16 ? r.autocast : param_dtype(precision);
      d.add_row({name, dtype_name(dtype), precision == Precision::BF16 ? dtype_name(expected) : "-",
                 dtype_note(r, dtype, expected)});
    }
  }
  d.print();
}

}  // namespace

ModeSpec precision_mode() {
  return {"precision", "the accumulation experiment on the device, and the dtype of every tensor under --precision",
          add_options, [](const po::variables_map& vm, int world_size) -> ModeRun {
            const PrecisionOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          }};
}

}  // namespace llmhpc

#include "src/modes/options.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <regex>

#include "src/core/random.h"
#include "src/core/units.h"

namespace llmhpc {
namespace {

po::typed_value<std::string>* text(const std::string& def) { return po::value<std::string>()->default_value(def); }
po::typed_value<std::string>* text() { return po::value<std::string>(); }

const char* kShapeOptions[] = {"d-model", "d-ff", "num-layers", "num-heads"};

// A JSON number exactly as JSON spells it (no "+1", ".5" or "007"): only those go unquoted.
bool is_json_number(const std::string& s) {
  static const std::regex number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
  return std::regex_match(s, number);
}

}  // namespace

po::typed_value<std::string>* listable(const ListUse& use, const std::string& name, const char* def) {
  po::typed_value<std::string>* value = def ? text(def) : text();
  if (use.sweeps()) return value;
  const std::string refusal = "--mode " + use.mode + " takes one value for --" + name + " (" + use.why + ")";
  return value->notifier([refusal](const std::string& v) {
    if (v.find(',') != std::string::npos) throw UsageError(refusal);
  });
}

void add_model_options(po::options_description& desc, const ListUse& use) {
  const std::string list = use.sweeps() ? " (a comma-separated list sweeps)" : "";
  desc.add_options()("model", listable(use, "model", "small"),
                     ("size preset: tiny, small, medium, large, xl, 2.7B" + list).c_str())(
      "d-model", text(), "model width (with --d-ff --num-layers --num-heads instead of a preset)")(
      "d-ff", text(), "SwiGLU hidden width")("num-layers", text(), "number of transformer blocks")(
      "num-heads", text(), "attention heads; must divide --d-model")("vocab-size", text("10000"), "vocabulary size")(
      "context-length", listable(use, "context-length", "128"), ("sequence length T" + list).c_str())(
      "batch-size", listable(use, "batch-size", "4"),
      ("sequences per step: in ddp and train the global batch, shared equally by the data-parallel ranks (the "
       "ranks of a tensor-parallel group take the same); in bench, "
       "profile and memory every rank's own; unused by precision" +
       list)
          .c_str())("rope-theta", text("10000"), "RoPE base");
}

void add_precision_options(po::options_description& desc, const ListUse& use) {
  const std::string list = use.sweeps() ? " (list sweeps)" : "";
  desc.add_options()("precision", listable(use, "precision", "fp32"),
                     ("fp32 | bf16 (autocast-style mixed precision: fp32 master weights, bf16 matrix operands; on "
                      "the CPU computed in fp32 on bf16 values, for checking, not speed) | fp64 (CPU reference)" +
                      list)
                         .c_str())(
      "attention", listable(use, "attention", "naive"),
      ("naive | flash (FlashAttention-2; bitwise deterministic except the bf16 backward on long sequences, "
       "which LLMHPC_FLASH_BWD=split makes deterministic too)" +
       list)
          .c_str())("low-memory", po::bool_switch(),
                    "recompute each layer's norm outputs in backward instead of keeping them and, under bf16, cast "
                    "each layer's weights when forward or backward reaches it instead of keeping a bf16 copy of all "
                    "weights (2 bytes per parameter less: 2.7B -6.2 GiB); a few percent slower, bitwise the same "
                    "results")(
      "grad-dtype", text("same"),
      "what backward writes the parameter gradients in: same (the master weights' dtype, fp32, as PyTorch's "
      "autocast) | bf16 (--precision bf16: the products round their weight gradients to bf16, as llm.c: 2 bytes "
      "per parameter less, data-parallel reductions of half the bytes with no casts, and half the gradient bytes "
      "that clipping and AdamW read; micro-batches add up in bf16)");
}

MemoryPlan memory_plan(const po::variables_map& vm) {
  return opt_flag(vm, "low-memory") ? MemoryPlan::LowMemory : MemoryPlan::Fast;
}

GradientDType grad_dtype(const po::variables_map& vm) {
  const GradientDType g = parse_gradient_dtype(opt_string(vm, "grad-dtype"));
  for (Precision p : precisions(vm)) gradient_dtype(p, g);  // throws for bf16 gradients without bf16 precision
  return g;
}

std::string shape_label(const ModelConfig& c) {
  if (c.name != "custom") return c.name;
  return "d" + std::to_string(c.d_model) + "_ff" + std::to_string(c.d_ff) + "_L" + std::to_string(c.num_layers) + "_H" +
         std::to_string(c.num_heads);
}

void add_shape_attrs(Record& rec, const ModelConfig& c) {
  rec.attr("model", c.name)
      .attr("d_model", c.d_model)
      .attr("d_ff", c.d_ff)
      .attr("num_layers", c.num_layers)
      .attr("num_heads", c.num_heads)
      .attr("vocab_size", c.vocab_size)
      .attr("context_length", c.context_length);
}

void set_random_batch(TransformerLM& model, int64_t batch, int64_t seq, uint64_t seed, uint64_t stream) {
  model.reserve_batch(batch, seq);
  const int64_t n = batch * seq, part = std::min<int64_t>(n, 1 << 20);
  const uint64_t vocab = uint64_t(model.config().vocab_size);
  std::vector<int32_t> tokens(part), targets(part);
  for (int64_t first = 0; first < n; first += part) {
    const int64_t count = std::min(part, n - first);
    for (int64_t k = 0; k < count; ++k) {
      tokens[k] = int32_t(random_bits(seed, stream, uint64_t(first + k)) % vocab);
      targets[k] = int32_t(random_bits(seed, stream + 1, uint64_t(first + k)) % vocab);
    }
    model.set_batch_part(first, count, tokens.data(), targets.data());
  }
}

void add_gradient_options(po::options_description& desc) {
  desc.add_options()("separate-optimizer", po::bool_switch(),
                     "keep a gradient buffer of every parameter and run AdamW after backward, timed as its own "
                     "phase (4 bytes per parameter more); default: AdamW updates each layer as soon as backward "
                     "has its gradients, inside backward's time, bitwise the same weights");
}

GradientStorage gradient_storage(const po::variables_map& vm, const std::vector<Phase>& phases) {
  if (!opt_flag(vm, "separate-optimizer")) return GradientStorage::PerRange;
  if (std::all_of(phases.begin(), phases.end(), [](Phase p) { return p == Phase::Forward; }))
    throw UsageError("--separate-optimizer keeps every gradient for AdamW, and --phase forward makes none: give "
                     "--phase forward-backward or train-step, or leave --separate-optimizer out");
  return GradientStorage::Whole;
}

std::string opt_string(const po::variables_map& vm, const std::string& name) {
  const auto it = vm.find(name);
  return it == vm.end() ? std::string() : it->second.as<std::string>();
}
bool opt_given(const po::variables_map& vm, const std::string& name) {
  const auto it = vm.find(name);
  return it != vm.end() && !it->second.defaulted();
}

void check_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string what = option + " '" + path + "'";
  if (path.empty()) throw UsageError(option + " needs a file name");
  if (fs::is_directory(path)) throw UsageError(what + " is a directory: give the name of a file to write");
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::exists(dir)) throw UsageError(what + ": the directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir)) throw UsageError(what + ": '" + dir.string() + "' is not a directory");
  if (access(dir.c_str(), W_OK) != 0) throw UsageError(what + ": the directory '" + dir.string() + "' is not writable");
}
void check_new_output_file(const std::string& option, const std::string& path) {
  check_output_file(option, path);
  std::error_code ec;
  if (std::filesystem::exists(path, ec))
    throw UsageError(option + " '" + path + "': the file exists, and a run writes over no file of an earlier one: " +
                     "remove it or give another name");
}
bool opt_flag(const po::variables_map& vm, const std::string& name) {
  const auto it = vm.find(name);
  return it != vm.end() && it->second.as<bool>();
}
int64_t opt_int(const po::variables_map& vm, const std::string& name) { return parse_int(opt_string(vm, name), name); }
double opt_double(const po::variables_map& vm, const std::string& name) {
  return parse_double(opt_string(vm, name), name);
}
int64_t opt_positive(const po::variables_map& vm, const std::string& name) {
  int64_t v = opt_int(vm, name);
  if (v <= 0) throw UsageError("--" + name + " must be positive (got " + std::to_string(v) + ")");
  return v;
}
int fits_int(int64_t value, const std::string& name) {
  if (value > std::numeric_limits<int>::max() || value < std::numeric_limits<int>::min())
    throw UsageError("--" + name + " " + std::to_string(value) + " is out of range: at most " +
                     std::to_string(std::numeric_limits<int>::max()));
  return int(value);
}
int64_t opt_nonnegative(const po::variables_map& vm, const std::string& name) {
  int64_t v = opt_int(vm, name);
  if (v < 0) throw UsageError("--" + name + " must not be negative (got " + std::to_string(v) + ")");
  return v;
}

ShapeOptions shape_options(const po::variables_map& vm) {
  ShapeOptions s;
  std::optional<int64_t>* fields[] = {&s.d_model, &s.d_ff, &s.num_layers, &s.num_heads};  // kShapeOptions' order
  for (size_t k = 0; k < 4; ++k)
    if (opt_given(vm, kShapeOptions[k])) *fields[k] = opt_int(vm, kShapeOptions[k]);
  return s;
}

void ShapeOptions::apply_to(ModelConfig& c) const {
  if (d_model) c.d_model = *d_model;
  if (d_ff) c.d_ff = *d_ff;
  if (num_layers) c.num_layers = *num_layers;
  if (num_heads) c.num_heads = *num_heads;
}

std::vector<ModelConfig> model_configs(const po::variables_map& vm) {
  std::vector<ModelConfig> bases;
  const ShapeOptions shape = shape_options(vm);
  if (shape.any()) {
    const bool preset_given = opt_given(vm, "model");
    std::vector<std::string> presets = split_list(opt_string(vm, "model"), "model");
    if (preset_given && presets.size() > 1)
      throw UsageError(
          "explicit shape options (--d-model ...) change one model: give one --model preset (its sizes fill "
          "what they leave out) or none; to compare custom shapes, run each into its own folder under one "
          "parent, which analysis/report.py reads as one sweep");
    ModelConfig c = preset_given ? preset_config(presets[0]) : ModelConfig{};
    if (!preset_given) {
      std::vector<std::string> missing;
      for (const char* o : kShapeOptions)
        if (!opt_given(vm, o)) missing.push_back(std::string("--") + o);
      if (!missing.empty())
        throw UsageError("a custom model needs --d-model --d-ff --num-layers --num-heads; missing " +
                         join(missing, ", ") + " (or start from a preset with --model)");
    }
    c.name = "custom";
    shape.apply_to(c);
    bases.push_back(c);
  } else {
    for (const std::string& name : split_list(opt_string(vm, "model"), "model")) bases.push_back(preset_config(name));
  }
  std::vector<ModelConfig> out;
  for (ModelConfig base : bases) {
    base.vocab_size = opt_int(vm, "vocab-size");
    base.rope_theta = opt_double(vm, "rope-theta");
    if (base.rope_theta <= 1.0) throw UsageError("--rope-theta must be greater than 1");
    for (int64_t T : parse_int_list(opt_string(vm, "context-length"), "context-length")) {
      ModelConfig c = base;
      c.context_length = T;
      c.validate();
      out.push_back(c);
    }
  }
  return out;
}

std::vector<int64_t> batch_sizes(const po::variables_map& vm) {
  std::vector<int64_t> out = parse_int_list(opt_string(vm, "batch-size"), "batch-size");
  for (int64_t b : out)
    if (b <= 0) throw UsageError("--batch-size must be positive (got " + std::to_string(b) + ")");
  return out;
}

std::vector<Precision> precisions(const po::variables_map& vm) {
  return opt_list(vm, "precision", [](const std::string& p) { return parse_precision(p); });
}

const char* const kCudaGraphNeedsCuda = "--cuda-graph needs --device cuda: the CPU runs each op as it is called";

bool use_cuda_graph(const ModeContext& ctx, bool wanted) {
  if (!wanted) return false;
  if (ctx.backend.device->kind() != DeviceKind::Cuda) throw UsageError(kCudaGraphNeedsCuda);
  return true;
}

void note_cpu_bf16(const ModeContext& ctx, const std::vector<Precision>& wanted) {
  if (ctx.backend.device->kind() == DeviceKind::Cpu &&
      std::find(wanted.begin(), wanted.end(), Precision::BF16) != wanted.end())
    log_root(ctx.rt,
             "note: on the CPU, bf16 is computed in fp32 on values stored as bf16 (for checking, not for speed): "
             "its times say nothing of bf16 hardware\n");
}

std::vector<AttentionKind> attentions(const po::variables_map& vm) {
  return opt_list(vm, "attention", [](const std::string& a) { return parse_attention(a); });
}

std::string resolve_backend(const std::string& backend, DeviceKind device) {
  if (backend != "auto") return backend;
  return device == DeviceKind::Cuda ? "nccl" : "mpi";
}

std::string resolve_backend(const po::variables_map& vm, DeviceKind device) {
  return resolve_backend(opt_string(vm, "backend"), device);
}

std::string options_json(const po::variables_map& vm) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : vm) {
    std::string v;
    if (value.value().type() == typeid(std::string)) {
      const std::string& s = value.as<std::string>();
      v = is_json_number(s) ? s : "\"" + json_escape(s) + "\"";
    } else if (value.value().type() == typeid(bool)) {
      v = value.as<bool>() ? "true" : "false";
    } else {
      continue;
    }
    out += (first ? "\"" : ", \"") + json_escape(name) + "\": " + v;
    first = false;
  }
  return out + "}";
}

std::string option_for_field(const std::string& field) {
  std::string flag = "--" + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace llmhpc

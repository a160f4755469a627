// Options shared by several modes: the model shape (presets, explicit sizes, sweeps over
// lists), precision and attention. Every option is taken as text and parsed here, so each
// error names the option and what was wrong with it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/core/units.h"
#include "src/model/config.h"
#include "src/model/train_step.h"
#include "src/model/transformer.h"
#include "src/modes/mode.h"

namespace llmhpc {

// How a mode takes the options that sweeps take as comma-separated lists: as lists too, or as
// one value, a list refused where the option is declared ("--mode train takes one value for
// --model (lists sweep in modes bench, profile, memory and ddp)").
struct ListUse {
  std::string mode, why;  // empty mode: lists sweep
  bool sweeps() const { return mode.empty(); }
};
// A text option with default `def` (null: none) taken as `use` says.
po::typed_value<std::string>* listable(const ListUse& use, const std::string& name, const char* def);

// --model, --d-model, --d-ff, --num-layers, --num-heads, --vocab-size, --context-length,
// --batch-size, --rope-theta; --model, --context-length and --batch-size as `use` says.
void add_model_options(po::options_description& desc, const ListUse& use);
// --precision and --attention as `use` says, --low-memory, --grad-dtype.
void add_precision_options(po::options_description& desc, const ListUse& use);

// Presets x context lengths, in the order given. Throws UsageError.
std::vector<ModelConfig> model_configs(const po::variables_map& vm);
// The shape options given (--d-model --d-ff --num-layers --num-heads), each changing a base model
// (a preset's, a checkpoint's) where given.
struct ShapeOptions {
  std::optional<int64_t> d_model, d_ff, num_layers, num_heads;
  bool any() const { return d_model || d_ff || num_layers || num_heads; }
  bool all() const { return d_model && d_ff && num_layers && num_heads; }
  void apply_to(ModelConfig& c) const;
};
ShapeOptions shape_options(const po::variables_map& vm);
std::vector<int64_t> batch_sizes(const po::variables_map& vm);
std::vector<Precision> precisions(const po::variables_map& vm);
// Rank 0 says once that bf16 on the CPU is storage only (kernels/cpu), so its times mislead
// nobody; nothing unless --precision has bf16 and the device is the CPU.
void note_cpu_bf16(const ModeContext& ctx, const std::vector<Precision>& wanted);
// `wanted` (--cuda-graph: GraphedStep, src/model/train_step.h); UsageError when it is and ctx's
// device has no graphs.
bool use_cuda_graph(const ModeContext& ctx, bool wanted);
// The message of that UsageError (parse_step_options gives it earlier, for --device cpu).
extern const char* const kCudaGraphNeedsCuda;
std::vector<AttentionKind> attentions(const po::variables_map& vm);
MemoryPlan memory_plan(const po::variables_map& vm);  // --low-memory
// --grad-dtype; bf16 needs --precision bf16 for every configuration (a UsageError otherwise).
GradientDType grad_dtype(const po::variables_map& vm);
// A model's part of a configuration's label: the preset name, or d<d_model>_ff<d_ff>_L<layers>_H<heads>.
std::string shape_label(const ModelConfig& c);
// The model's shape as a record's attributes: model, d_model, d_ff, num_layers, num_heads,
// vocab_size, context_length.
void add_shape_attrs(Record& rec, const ModelConfig& c);
// The seeded random batch the measuring modes run on: token ids and targets below the model's
// vocabulary, token k of the batch random_bits(seed, stream, k) with `stream` for the tokens
// and stream + 1 for the targets; drawn into the model's buffers part by part.
void set_random_batch(TransformerLM& model, int64_t batch, int64_t seq, uint64_t seed, uint64_t stream = 1);

// --separate-optimizer (modes that time one model's train step: bench, memory).
void add_gradient_options(po::options_description& desc);
// --separate-optimizer keeps a gradient of every parameter for AdamW: refused where every phase
// is forward, which makes no gradient (`phases` the run's phases).
GradientStorage gradient_storage(const po::variables_map& vm, const std::vector<Phase>& phases);

// Typed accessors for options stored as text.
std::string opt_string(const po::variables_map& vm, const std::string& name);
int64_t opt_int(const po::variables_map& vm, const std::string& name);
int64_t opt_positive(const po::variables_map& vm, const std::string& name);
int64_t opt_nonnegative(const po::variables_map& vm, const std::string& name);
// `value` of --`name` as an int (a count of ranks, chunks, micro-batches): a UsageError past
// int's range, where a cast would wrap (--tp 4294967298 would run as 2).
int fits_int(int64_t value, const std::string& name);
double opt_double(const po::variables_map& vm, const std::string& name);
bool opt_flag(const po::variables_map& vm, const std::string& name);
bool opt_given(const po::variables_map& vm, const std::string& name);
// A file the run will write, as given to `option` (--save, --snapshot, --trace): a name in an
// existing, writable directory, and not a directory itself. Throws UsageError saying which.
void check_output_file(const std::string& option, const std::string& path);
// The same for a file that must not exist yet (--snapshot, --trace): a run never writes over a
// file it did not make, as --out never takes a folder that holds results.
void check_new_output_file(const std::string& option, const std::string& path);
// Each item of the comma-separated list option `name`, in order, through `parse` (which
// throws UsageError for a bad item); two items that parse to the same value are an error too.
template <class Parse>
auto opt_list(const po::variables_map& vm, const std::string& name, Parse parse) {
  const std::vector<std::string> items = split_list(opt_string(vm, name), name);
  std::vector<decltype(parse(std::string()))> out;
  for (const std::string& item : items) out.push_back(parse(item));
  require_distinct(out, items, name);
  return out;
}

// --backend with "auto" resolved: nccl on CUDA devices, mpi on the CPU.
std::string resolve_backend(const std::string& backend, DeviceKind device);
std::string resolve_backend(const po::variables_map& vm, DeviceKind device);

// How the command line spells a configuration field that a lower layer names in an error
// ({d_model}: --d-model). main() installs it (set_field_names, src/core/check.h).
std::string option_for_field(const std::string& field);

// Every option and its value as a JSON object (the config_json root attribute).
std::string options_json(const po::variables_map& vm);

}  // namespace llmhpc

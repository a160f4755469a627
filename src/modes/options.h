// Options shared by several modes: the model shape (presets, explicit sizes, sweeps over
// lists), precision and attention. Every option is taken as text and parsed here, so each
// error names the option and what was wrong with it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/model/config.h"
#include "src/model/transformer.h"
#include "src/modes/mode.h"

namespace llmhpc {

// --model, --d-model, --d-ff, --num-layers, --num-heads, --vocab-size, --context-length,
// --batch-size, --rope-theta. With `lists`, --model, --context-length and --batch-size
// take comma-separated lists (a sweep).
void add_model_options(po::options_description& desc, bool lists);
// --precision and --attention (lists when `lists`).
void add_precision_options(po::options_description& desc, bool lists);

// Presets x context lengths, in the order given. Throws UsageError.
std::vector<ModelConfig> model_configs(const po::variables_map& vm);
// True when the user gave any explicit shape option (--d-model ...).
bool has_explicit_shape(const po::variables_map& vm);
std::vector<int64_t> batch_sizes(const po::variables_map& vm);
std::vector<Precision> precisions(const po::variables_map& vm);
std::vector<AttentionKind> attentions(const po::variables_map& vm);
MemoryPlan memory_plan(const po::variables_map& vm);  // --low-memory

// Typed accessors for options stored as text.
std::string opt_string(const po::variables_map& vm, const std::string& name);
int64_t opt_int(const po::variables_map& vm, const std::string& name);
int64_t opt_positive(const po::variables_map& vm, const std::string& name);
int64_t opt_nonnegative(const po::variables_map& vm, const std::string& name);
double opt_double(const po::variables_map& vm, const std::string& name);
bool opt_flag(const po::variables_map& vm, const std::string& name);
bool opt_given(const po::variables_map& vm, const std::string& name);

// --backend with "auto" resolved: nccl on CUDA devices, mpi on the CPU.
std::string resolve_backend(const po::variables_map& vm, DeviceKind device);

// Every option and its value as a JSON object (the config_json root attribute).
std::string options_json(const po::variables_map& vm);

}  // namespace llmhpc

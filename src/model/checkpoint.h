// Checkpoints (docs/hdf5-schema.md, "Checkpoints"): one HDF5 file; /params holds one fp32
// dataset per tensor named as the reference PyTorch model names it; /optimizer holds
// step, m/<name>, v/<name>; the model config is in root attributes.
//
// The file always holds the whole model's optimizer state, whoever owned it: a sharded run
// gathers it to the rank that writes (src/dist/parallelism.h, save_checkpoint_from_ranks), and a load fills whatever
// ranges the loading optimizer owns, so any checkpoint starts any sharding on any ranks.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "src/model/adamw.h"
#include "src/model/config.h"
#include "src/model/transformer.h"

namespace llmhpc {

// An optimizer's state on the host, fp32: step, hyperparameters, and m and v of the `owned`
// ranges packed in their order (for the whole model, owned is [0, parameters) and m and v
// are in the flat layout).
struct OptimizerState {
  int64_t step = 0;
  AdamWHyper hyper;
  std::vector<FlatRange> owned;
  std::vector<float> m, v;
  // The training options the state goes on under, as the run that wrote it took them ("--lr 0.0003
  // --lr-schedule cosine ..."): a run from the checkpoint takes each it is not given (mode train).
  std::string options;
};
// A device tensor's elements as host floats (fp32 as they are, bf16 widened, fp64 rounded), and
// host floats into an fp32 or fp64 device tensor (its numel() of them from `values`).
std::vector<float> to_host_floats(Device& dev, const Tensor& t);
void from_host_floats(Device& dev, const Tensor& t, const float* values);

// The optimizer's own state (its owned ranges; zeros before its first step).
OptimizerState host_state(const AdamW& opt);

struct CheckpointInfo {
  std::optional<ModelConfig> config;  // from the root attributes, when they are all there
  bool has_optimizer = false;
  std::string options;  // OptimizerState::options; "" in a file without them
};

// Throws UsageError if `path` is missing or is not an HDF5 file with a /params group.
CheckpointInfo inspect_checkpoint(const std::string& path);

// Throws UsageError unless the checkpoint holds exactly the tensors of `layout`, with
// their shapes (and, if present, matching optimizer state).
void check_checkpoint_fits(const std::string& path, const ParameterLayout& layout);

// Writes the parameters, and `state` when given (the whole model's: owned [0, parameters)).
void save_checkpoint(const std::string& path, TransformerLM& model, const OptimizerState* state);

// The same file from the whole model's parameters on the host, in the flat layout (a run whose
// parameters are sharded gathers them first).
void save_checkpoint(const std::string& path, const ModelConfig& config, const std::vector<float>& params,
                     const OptimizerState* state);

// A checkpoint's contents on the host, in the flat layout of `layout`: the parameters, and the
// whole model's optimizer state where the file has one. Files hold whole tensors: a tensor-
// parallel part's layout gets its part of each (the vocabulary's padding zero), so a file from
// any tp loads at any other. Throws UsageError as load_checkpoint.
struct HostCheckpoint {
  std::vector<float> params;
  std::optional<OptimizerState> state;
};
HostCheckpoint read_checkpoint(const std::string& path, const ParameterLayout& layout);

// Loads the parameters into `model` (a tensor-parallel part: its part of each), and when the file has optimizer state and `opt` is
// given, its step and the state of the ranges `opt` owns (allocating opt's state). Throws
// UsageError naming the first tensor that is missing, extra or misshapen.
void load_checkpoint(const std::string& path, TransformerLM& model, AdamW* opt);

}  // namespace llmhpc

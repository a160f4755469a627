// Checkpoints (SPEC "Checkpoint and data formats"): one HDF5 file; /params holds one fp32
// dataset per tensor named as the reference PyTorch model names it; /optimizer holds
// step, m/<name>, v/<name>; the model config is in root attributes.
#pragma once
#include <optional>
#include <string>

#include "src/model/adamw.h"
#include "src/model/config.h"
#include "src/model/transformer.h"

namespace llmhpc {

struct CheckpointInfo {
  std::optional<ModelConfig> config;  // from the root attributes, when they are all there
  bool has_optimizer = false;
};

// Throws UsageError if `path` is missing or is not an HDF5 file with a /params group.
CheckpointInfo inspect_checkpoint(const std::string& path);

// Throws UsageError unless the checkpoint holds exactly the tensors of `layout`, with
// their shapes (and, if present, matching optimizer state).
void check_checkpoint_fits(const std::string& path, const ParameterLayout& layout);

// Writes parameters (and the optimizer state when `opt` is given and covers the model).
void save_checkpoint(const std::string& path, TransformerLM& model, const AdamW* opt);

// Loads parameters into `model`, and optimizer state into `opt` when both are present.
// Throws UsageError naming the first tensor that is missing, extra or misshapen.
void load_checkpoint(const std::string& path, TransformerLM& model, AdamW* opt);

}  // namespace llmhpc

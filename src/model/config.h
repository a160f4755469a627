// Model shape (the reference end-to-end benchmark's TransformerLM) and the size presets tiny ... 2.7B.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmhpc {

struct ModelConfig {
  std::string name = "custom";  // preset name, or "custom"
  int64_t vocab_size = 10000;
  int64_t context_length = 128;
  int64_t d_model = 768;
  int64_t d_ff = 3072;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return d_model / num_heads; }
  int64_t num_params() const;
  // Throws UsageError naming the offending option when the shape is impossible.
  void validate() const;
};

struct ModelPreset {
  const char* name;
  int64_t d_model, d_ff, num_layers, num_heads;
};
const std::vector<ModelPreset>& model_presets();
// Throws UsageError listing the presets when `name` is not one of them.
ModelConfig preset_config(const std::string& name);

}  // namespace llmhpc

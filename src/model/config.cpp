#include "src/model/config.h"

#include "src/core/check.h"
#include "src/core/units.h"

namespace llmhpc {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"tiny", 512, 1344, 4, 16},    {"small", 768, 3072, 12, 12}, {"medium", 1024, 4096, 24, 16},
      {"large", 1280, 5120, 36, 20}, {"xl", 1600, 6400, 48, 25},   {"2.7B", 2560, 10240, 32, 32},
  };
  return presets;
}

ModelConfig preset_config(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets()) {
    if (name == p.name) {
      ModelConfig c;
      c.name = p.name;
      c.d_model = p.d_model;
      c.d_ff = p.d_ff;
      c.num_layers = p.num_layers;
      c.num_heads = p.num_heads;
      return c;
    }
    names.push_back(p.name);
  }
  throw UsageError("{model} '" + name + "': unknown size; choose one of " + join(names, ", ") +
                   " or give {d_model} {d_ff} {num_layers} {num_heads}");
}

int64_t ModelConfig::num_params() const {
  const int64_t d = d_model;
  const int64_t per_layer = 2 * d + 4 * d * d + 3 * d * d_ff;
  return 2 * vocab_size * d + num_layers * per_layer + d;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* opt) {
    if (v <= 0) throw UsageError(std::string("--") + opt + " must be positive (got " + std::to_string(v) + ")");
  };
  positive(vocab_size, "vocab-size");
  positive(context_length, "context-length");
  positive(d_model, "d-model");
  positive(d_ff, "d-ff");
  positive(num_layers, "num-layers");
  positive(num_heads, "num-heads");
  if (d_model % num_heads != 0)
    throw UsageError("{d_model} " + std::to_string(d_model) + " is not divisible by {num_heads} " +
                     std::to_string(num_heads) + ": each head gets d_model / num_heads dimensions");
  if (head_dim() % 2 != 0)
    throw UsageError("head dimension d_model/num_heads = " + std::to_string(head_dim()) +
                     " is odd; RoPE rotates pairs, so it must be even");
  if (vocab_size > (int64_t(1) << 31) - 1) throw UsageError("{vocab_size} too large for int32 token ids");
}

}  // namespace llmhpc

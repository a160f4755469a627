// Where every parameter lives: one flat buffer, with named views in the order of the
// reference PyTorch model. The same layout serves gradients, optimizer state, flat
// all-reduce, buckets and optimizer shards.
//
// Within a layer, q/k/v are adjacent and form one (3d, d) matrix, and w1/w3 form one
// (2 d_ff, d) matrix, so each pair or triple is one GEMM. Layers are contiguous and in
// order, so backward finishes parameters from the end of the buffer towards the start.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/tensor.h"
#include "src/model/config.h"

namespace llmhpc {

struct ParamInfo {
  std::string name;  // as the reference PyTorch model names it: "layers.0.attn.q_proj.weight"
  Shape shape;
  int64_t offset;    // in elements, into the flat buffer
  int layer;         // -1 for embedding, final norm and head
  bool is_matrix;    // linear weights: truncated-normal init; embedding std 1; norms 1
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }
  // Throws UsageError for an unknown name.
  const ParamInfo& find(const std::string& name) const;
  // [begin, end) in elements covered by one layer's parameters.
  std::pair<int64_t, int64_t> layer_range(int layer) const;

 private:
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in params_ (find() is on the step's path)
  int64_t total_ = 0;
};

// Per-layer parameter names (without the "layers.{i}." prefix), in layout order.
const std::vector<std::string>& layer_param_names();

}  // namespace llmhpc

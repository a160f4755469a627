#include "src/model/params.h"

#include <algorithm>

#include "src/core/check.h"

namespace llmhpc {

std::vector<PackedPiece> packed_pieces(const std::vector<FlatRange>& ranges, FlatRange within) {
  std::vector<PackedPiece> pieces;
  int64_t packed = 0;
  for (const FlatRange& r : ranges) {
    const int64_t begin = std::max(r.begin, within.begin), end = std::min(r.end, within.end);
    if (begin < end) pieces.push_back({{begin, end}, packed + begin - r.begin});
    packed += r.size();
  }
  return pieces;
}

int64_t packed_size(const std::vector<FlatRange>& ranges) {
  int64_t n = 0;
  for (const FlatRange& r : ranges) n += r.size();
  return n;
}

const std::vector<std::string>& layer_param_names() {
  static const std::vector<std::string> names = {"ln1.weight",         "attn.q_proj.weight",      "attn.k_proj.weight",
                                                 "attn.v_proj.weight", "attn.output_proj.weight", "ln2.weight",
                                                 "ffn.w1.weight",      "ffn.w3.weight",           "ffn.w2.weight"};
  return names;
}

ParameterLayout::ParameterLayout(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff;
  auto add = [&](const std::string& name, Shape shape, int layer, bool matrix) {
    index_[name] = params_.size();
    ParamUnit& u = units_.back();
    ParamInfo p{name, shape, total_, layer, matrix, int(units_.size()) - 1, 0};
    p.lane_offset = u.lane_elements[int(p.lane())];
    u.lane_elements[int(p.lane())] += shape.numel();
    params_.push_back(p);
    total_ += shape.numel();
    u.range.end = total_;
  };
  auto unit = [&] { units_.push_back({{total_, total_}, {0, 0}}); };
  unit();
  add("token_embeddings.weight", {c.vocab_size, d}, -1, false);
  for (int i = 0; i < c.num_layers; ++i) {
    unit();
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "ln1.weight", {d}, i, false);
    add(p + "attn.q_proj.weight", {d, d}, i, true);
    add(p + "attn.k_proj.weight", {d, d}, i, true);
    add(p + "attn.v_proj.weight", {d, d}, i, true);
    add(p + "attn.output_proj.weight", {d, d}, i, true);
    add(p + "ln2.weight", {d}, i, false);
    add(p + "ffn.w1.weight", {f, d}, i, true);
    add(p + "ffn.w3.weight", {f, d}, i, true);
    add(p + "ffn.w2.weight", {d, f}, i, true);
  }
  unit();
  add("ln_final.weight", {d}, -1, false);
  add("lm_head.weight", {c.vocab_size, d}, -1, true);
  LLMHPC_CHECK(total_ == c.num_params(), "parameter count mismatch");
}

const ParamInfo& ParameterLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw UsageError("unknown parameter '" + name + "'");
  return params_[it->second];
}

std::pair<int64_t, int64_t> ParameterLayout::layer_range(int layer) const {
  int64_t begin = -1, end = -1;
  for (const ParamInfo& p : params_)
    if (p.layer == layer) {
      if (begin < 0) begin = p.offset;
      end = p.offset + p.shape.numel();
    }
  LLMHPC_CHECK(begin >= 0, "no such layer");
  return {begin, end};
}

}  // namespace llmhpc

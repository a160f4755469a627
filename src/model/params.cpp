#include "src/model/params.h"

#include <algorithm>

#include "src/core/check.h"
#include "src/core/units.h"

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

int64_t padded_vocab(int64_t vocab, int tp) {
  if (tp <= 1) return vocab;
  const int64_t multiple = 8 * int64_t(tp);
  return (vocab + multiple - 1) / multiple * multiple;
}

std::string tensor_parallel_fits(const ModelConfig& c, int ranks) {
  std::vector<std::string> fit;
  for (int64_t n = 1; n <= 16; ++n)
    if (c.num_heads % n == 0 && c.d_ff % n == 0 && (ranks == 0 || ranks % n == 0)) fit.push_back(std::to_string(n));
  return join(fit, ", ");
}

namespace {
// A UsageError naming `field` unless `value` divides among `tp` ranks, with the group sizes
// that split the whole model `c` (and divide `ranks`, where given).
void divided(int64_t value, int tp, const char* field, const char* why, const ModelConfig& c, int ranks) {
  if (value % tp == 0) return;
  throw UsageError(std::string("{") + field + "} " + std::to_string(value) + " does not divide among {tp} " +
                   std::to_string(tp) + " ranks: " + why + "; give a {tp} that divides {num_heads} " +
                   std::to_string(c.num_heads) + (ranks > 0 ? ", " : " and ") + "{d_ff} " + std::to_string(c.d_ff) +
                   (ranks > 0 ? " and the " + std::to_string(ranks) + " ranks" : std::string()) + " (" +
                   tensor_parallel_fits(c, ranks) + ")");
}
}  // namespace

void check_tensor_split(const ModelConfig& c, int tp, int ranks) {
  // Heads, not only d_model: each rank's attention runs on whole heads of its own.
  divided(c.num_heads, tp, "num_heads", "each rank takes whole attention heads", c, ranks);
  divided(c.d_ff, tp, "d_ff", "each rank takes d_ff / tp of the feed-forward features", c, ranks);
}

ParameterLayout::ParameterLayout(const ModelConfig& c, TensorSplit tp) : tp_(tp) {
  const int64_t d = c.d_model, f = c.d_ff;
  LLMHPC_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "a tensor-parallel rank outside its group");
  check_tensor_split(c, tp.size);
  vocab_rows_ = padded_vocab(c.vocab_size, tp.size) / tp.size;
  vocab_valid_ = std::clamp(c.vocab_size - vocab_begin(), int64_t(0), vocab_rows_);
  if (vocab_valid_ == 0) {
    // Every rank holds some of the vocabulary (the last holds the least): the next vocabulary up
    // that does so at this tp, and the largest tp below this one that this vocabulary (a
    // checkpoint's, which cannot change) allows. The sizes that fit are not all the small ones:
    // 67 fits 2, 3 and 5, not 4.
    const auto fits = [](int64_t vocab, int size) {
      return (vocab - 1) / (padded_vocab(vocab, size) / size) >= size - 1;
    };
    int64_t more = c.vocab_size + 1;
    while (!fits(more, tp.size)) ++more;
    int below = tp.size - 1;
    while (below > 1 && !fits(c.vocab_size, below)) --below;
    throw UsageError("{vocab_size} " + std::to_string(c.vocab_size) + " is too small for {tp} " +
                     std::to_string(tp.size) + ": padded to " + std::to_string(padded_vocab(c.vocab_size, tp.size)) +
                     " rows (a multiple of 8 x tp), " + std::to_string(vocab_rows_) + " a rank, rank " +
                     std::to_string(tp.rank) + " would hold only padding; this vocabulary (a checkpoint's too) takes " +
                     "{tp} " + std::to_string(below) + " (the largest below " + std::to_string(tp.size) +
                     " that leaves every rank some of it), or give a {vocab_size} of " + std::to_string(more) +
                     " or more for a new model");
  }
  int64_t whole_total = 0;
  auto add = [&](const std::string& name, Shape whole, int layer, bool matrix, Split split = Split::Whole) {
    Shape shape = whole;
    const bool vocabulary = name == "token_embeddings.weight" || name == "lm_head.weight";
    if (split == Split::Rows) shape.dims[0] = vocabulary ? vocab_rows_ : whole.dims[0] / tp.size;
    if (split == Split::Columns) shape.dims[1] = whole.dims[1] / tp.size;
    if (tp.size == 1) split = Split::Whole;
    index_[name] = params_.size();
    ParamUnit& u = units_.back();
    ParamInfo p{name, shape, total_, layer, matrix, int(units_.size()) - 1, 0, split, whole, whole_total};
    whole_total += whole.numel();
    p.lane_offset = u.lane_elements[int(p.lane())];
    u.lane_elements[int(p.lane())] += shape.numel();
    params_.push_back(p);
    total_ += shape.numel();
    u.range.end = total_;
  };
  auto unit = [&] { units_.push_back({{total_, total_}, {0, 0}}); };
  unit();
  add("token_embeddings.weight", {c.vocab_size, d}, -1, false, Split::Rows);
  for (int i = 0; i < c.num_layers; ++i) {
    unit();
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "ln1.weight", {d}, i, false);
    add(p + "attn.q_proj.weight", {d, d}, i, true, Split::Rows);
    add(p + "attn.k_proj.weight", {d, d}, i, true, Split::Rows);
    add(p + "attn.v_proj.weight", {d, d}, i, true, Split::Rows);
    add(p + "attn.output_proj.weight", {d, d}, i, true, Split::Columns);
    add(p + "ln2.weight", {d}, i, false);
    add(p + "ffn.w1.weight", {f, d}, i, true, Split::Rows);
    add(p + "ffn.w3.weight", {f, d}, i, true, Split::Rows);
    add(p + "ffn.w2.weight", {d, f}, i, true, Split::Columns);
  }
  unit();
  add("ln_final.weight", {d}, -1, false);
  add("lm_head.weight", {c.vocab_size, d}, -1, true, Split::Rows);
  LLMHPC_CHECK(tp.size > 1 || total_ == c.num_params(), "parameter count mismatch");
}

std::vector<float> take_part(const std::vector<float>& whole, const ParameterLayout& part) {
  std::vector<float> out(size_t(part.total()), 0.0f);
  for (const ParamInfo& p : part.params())
    for (const PartRun& run : part.part_runs(p))
      std::copy_n(whole.begin() + p.whole_offset + run.whole, run.count, out.begin() + p.offset + run.part);
  return out;
}

void place_part(std::vector<float>& whole, const ParameterLayout& part, const std::vector<float>& values) {
  LLMHPC_CHECK(int64_t(values.size()) >= part.total(), "a part's values shorter than its layout");
  for (const ParamInfo& p : part.params())
    for (const PartRun& run : part.part_runs(p))
      std::copy_n(values.begin() + p.offset + run.part, run.count, whole.begin() + p.whole_offset + run.whole);
}

std::vector<PartRun> ParameterLayout::part_runs(const ParamInfo& p) const {
  const int64_t n = p.shape.numel();
  if (p.split == Split::Whole) return {{0, 0, n}};
  const int64_t cols = p.shape.dims[1];
  if (p.split == Split::Rows) {  // one run: the rank's rows (the vocabulary's real ones)
    const int64_t first = p.shape.dims[0] * tp_.rank;
    const int64_t rows = std::min(p.shape.dims[0], p.whole.dims[0] - first);
    return {{first * cols, 0, rows * cols}};
  }
  std::vector<PartRun> runs;  // Columns: a run in every row
  const int64_t rows = p.shape.dims[0], whole_cols = p.whole.dims[1];
  runs.reserve(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) runs.push_back({r * whole_cols + cols * tp_.rank, r * cols, cols});
  return runs;
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

// Where every parameter lives: one flat buffer, with named views in the order of the
// reference PyTorch model. The same layout serves gradients, optimizer state, flat
// all-reduce, buckets and optimizer shards, all of which are ranges of it (FlatRange).
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

// Elements [begin, end) of the flat buffer: a tensor, a gradient bucket, an optimizer shard.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange& o) const { return begin == o.begin && end == o.end; }
};

// State kept for some ranges only (a sharded optimizer's m and v) is packed: the ranges'
// elements one after another, in the order of the list. A piece is where flat elements sit
// in that packed copy.
struct PackedPiece {
  FlatRange flat;
  int64_t packed_offset;  // of flat.begin
};
// The pieces of `within` that the ranges hold, one per range it meets, in the ranges' order.
std::vector<PackedPiece> packed_pieces(const std::vector<FlatRange>& ranges, FlatRange within);
// Elements the ranges hold (the packed length).
int64_t packed_size(const std::vector<FlatRange>& ranges);

// How the model reads a parameter: the matrices through the compute dtype (bf16 under
// --precision bf16), the others (the token embedding, the norm gains) as they are.
enum class Lane { Matrices = 0, Others = 1 };

// How tensor parallelism splits a parameter among the ranks of a group (Megatron-LM's layout):
// Rows, by output features (q, k, v, w1, w3: column-parallel products; the embedding and the LM
// head: by vocabulary); Columns, by input features (the attention output and w2: row-parallel
// products); Whole: on every rank (the norm gains).
enum class Split { Whole, Rows, Columns };

// Tensor parallelism's share of the model that one rank holds: part `rank` of `size`.
struct TensorSplit {
  int size = 1, rank = 0;
};

// The vocabulary rows every rank of a tensor-parallel group holds: `vocab` rounded up to a
// multiple of 8 x `tp` (rows of 8 keep bf16 products aligned), so each rank holds the same
// number; the rows past `vocab` are padding, zero and never read. `vocab` itself on one rank.
int64_t padded_vocab(int64_t vocab, int tp);

// The tensor-parallel group sizes up to 16 that split `c` (dividing its heads and d_ff) and, where
// `ranks` is given, divide that many ranks, as text: "1, 2, 4" (what a refusal of another --tp offers).
std::string tensor_parallel_fits(const ModelConfig& c, int ranks = 0);
// A UsageError unless `tp` divides `c`'s heads and d_ff, offering tensor_parallel_fits(c, ranks).
void check_tensor_split(const ModelConfig& c, int tp, int ranks = 0);

// Where rank r's part of a split parameter lies in the whole tensor: `count` elements from
// `whole` (in the whole tensor) are at `part` (in the part), for each contiguous run.
struct PartRun {
  int64_t whole = 0, part = 0, count = 0;
};

struct ParamInfo {
  std::string name;         // as the reference PyTorch model names it: "layers.0.attn.q_proj.weight"
  Shape shape;              // this rank's part (the whole tensor without tensor parallelism)
  int64_t offset;           // in elements, into the flat buffer
  int layer;                // -1 for embedding, final norm and head
  bool is_matrix;           // linear weights: truncated-normal init; embedding std 1; norms 1
  int unit = 0;             // the unit it belongs to (ParameterLayout::units)
  int64_t lane_offset = 0;  // where it starts in its unit's lane (ParamUnit)
  Split split = Split::Whole;
  Shape whole;               // the whole tensor's shape (rows: the unpadded vocabulary where it is split)
  int64_t whole_offset = 0;  // its offset in the whole model's layout (ParameterLayout without a split)
  Lane lane() const { return is_matrix ? Lane::Matrices : Lane::Others; }
};

// What the model reads and backward finishes together: the token embedding, one layer, the
// final norm with the LM head, in the order forward reaches them. Parallelisms that shard the
// parameters themselves gather and reduce unit by unit. Within a unit, each lane packs its
// tensors in layout order (q, k and v stay adjacent, as w1 and w3), so that a lane can travel
// in the dtype the model reads it in.
struct ParamUnit {
  FlatRange range;
  int64_t lane_elements[2] = {0, 0};  // by Lane
  int64_t elements(Lane lane) const { return lane_elements[int(lane)]; }
};

class ParameterLayout {
 public:
  // The parameters a rank holds: all of them, or under tensor parallelism its part of each
  // (Split): d_model / tp of q, k and v's rows and of the attention output's columns, d_ff / tp
  // of w1 and w3's rows and of w2's columns, padded_vocab / tp rows of the embedding and the LM
  // head. Throws UsageError where the heads, d_ff or the vocabulary do not divide.
  explicit ParameterLayout(const ModelConfig& config, TensorSplit tp = {});

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }
  // Throws UsageError for an unknown name.
  const ParamInfo& find(const std::string& name) const;
  // [begin, end) in elements covered by one layer's parameters.
  std::pair<int64_t, int64_t> layer_range(int layer) const;
  // The units in forward order: the embedding, layer 0 .. L-1, the head (ln_final, lm_head).
  const std::vector<ParamUnit>& units() const { return units_; }

  const TensorSplit& tensor_split() const { return tp_; }
  // The vocabulary this rank's rows of the embedding and the LM head hold: ids from
  // vocab_begin(), vocab_rows() of them, the first vocab_valid() real (the rest padding).
  int64_t vocab_begin() const { return vocab_rows_ * tp_.rank; }
  int64_t vocab_rows() const { return vocab_rows_; }
  int64_t vocab_valid() const { return vocab_valid_; }
  // Where this rank's part of `p` lies in the whole tensor, in order; padding rows lie nowhere.
  std::vector<PartRun> part_runs(const ParamInfo& p) const;

 private:
  TensorSplit tp_;
  int64_t vocab_rows_ = 0, vocab_valid_ = 0;
  std::vector<ParamUnit> units_;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in params_ (find() is on the step's path)
  int64_t total_ = 0;
};

// Host arrays in the flat layout of the whole model and of a tensor-parallel part (`part`):
// the part's elements taken from the whole (the vocabulary's padding zero), and placed into it.
std::vector<float> take_part(const std::vector<float>& whole, const ParameterLayout& part);
void place_part(std::vector<float>& whole, const ParameterLayout& part, const std::vector<float>& values);

}  // namespace llmhpc

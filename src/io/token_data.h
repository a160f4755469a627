// Token data: a flat little-endian file of uint16 token ids (.bin), or a 1-D .npy of uint16
// or int32. Memory-mapped, never copied whole.
//
// Batches: for step s, sequence b of the global batch starts at offset o, with inputs
// tokens[o, o+T) and targets tokens[o+1, o+T+1):
//   sequential: o = ((s*B + b) * T) mod (N - T)
//   random:     o = hash(seed, s*B + b) mod (N - T)
// Rank r of n takes sequences [r*B/n, (r+1)*B/n), so any world size sees the same global
// batches.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace llmhpc {

enum class DataOrder { Sequential, Random };
DataOrder parse_data_order(const std::string& text);  // sequential | random

class TokenData {
 public:
  // Throws UsageError when the file is missing, empty, or not in a supported format.
  static TokenData open(const std::string& path);

  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }
  int64_t token(int64_t i) const;

  // Throws UsageError if a token id is outside [0, vocab_size) or the file holds too few
  // tokens for one sequence of length `seq` plus its target.
  void validate(int64_t vocab_size, int64_t seq) const;

  // Offset of sequence b of global batch `step`.
  int64_t offset(int64_t step, int64_t b, int64_t global_batch, int64_t seq, DataOrder order, uint64_t seed) const;

  // Fills inputs and targets ((count, seq) each) with sequences [first, first + count).
  void fill_batch(int64_t step, int64_t global_batch, int64_t seq, int64_t first, int64_t count, DataOrder order,
                  uint64_t seed, int32_t* inputs, int32_t* targets) const;

 private:
  struct Mapping;
  std::shared_ptr<Mapping> map_;
  std::string path_;
  const unsigned char* data_ = nullptr;  // first token
  int element_size_ = 2;                 // 2: uint16, 4: int32
  int64_t count_ = 0;
};

}  // namespace llmhpc

// Which ranges of the flat gradient buffer a data-parallel strategy reduces, and which of them
// each rank's optimizer owns when its state is sharded: pure functions of the parameters'
// places in the buffer, so they are unit-tested without communication.
//
// A parameter tensor is a range of elements of the one flat buffer (ParamSpan). Every plan
// lists ranges in reverse parameter order (descending offsets), the order in which backward
// finishes them, and never includes a frozen parameter unless a strategy says so (flat, and
// ZeRO-1's buckets, which cover the whole buffer).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/model/params.h"

namespace llmhpc {

// One parameter tensor: elements [begin, end) of the flat gradient buffer.
struct ParamSpan {
  std::string name;
  int64_t begin = 0, end = 0;
  bool trainable = true;  // false: frozen; its gradient is never communicated
};

// One range per trainable tensor (naive, overlap).
std::vector<FlatRange> plan_per_tensor(const std::vector<ParamSpan>& params);

// The one range from the first trainable element to the last (flat): the whole buffer when
// every parameter trains. Frozen tensors between trainable ones are inside it and are
// communicated (harmless: the optimizer never reads their gradients); frozen tensors before
// the first or after the last trainable one are not. Empty when nothing trains.
std::vector<FlatRange> plan_flat(const std::vector<ParamSpan>& params);

// Buckets (bucketed): trainable tensors taken in reverse parameter order and packed into
// contiguous ranges of at most bucket_mb MiB; a tensor larger than that is a bucket of its
// own. A frozen tensor, or a gap between tensors, ends a bucket, so a bucket is one range of
// the buffer that holds trainable gradients only and is reduced in place, with no copies.
// Throws UsageError (naming --bucket-mb) unless bucket_mb > 0.
std::vector<FlatRange> plan_buckets(const std::vector<ParamSpan>& params, size_t element_bytes, double bucket_mb);

// ---- Optimizer shards ------------------------------------------------------------------------

// Every shard starts at a multiple of this many elements from its group's start, and every
// ZeRO-1 bucket starts at a multiple of ranks x this from the buffer's start. 64 elements:
// fp32 shards start on 256 bytes (cudaMalloc's alignment, two 128-byte GPU cache lines, four
// CPU ones), so the fused AdamW kernel takes its 16-byte vector path on every shard and its
// packed state, and the collectives of neighbouring owners never share a line; bf16 copies
// start on 128 bytes. What it costs: shards differ by up to 63 elements, and ZeRO-1 pads the
// buffer by less than ranks x 64 elements. (A plan may align to more: a page, where the bf16
// copy's shards are shared through registered windows, src/dist/parallelism.h shard_alignment.)
constexpr int64_t kShardAlignment = 64;

// The smallest multiple of `multiple` (> 0) that is >= x (>= 0).
int64_t round_up(int64_t x, int64_t multiple);

// Part `part` (0-based) of `parts` of `group`, balanced and aligned: the cuts between parts
// are the multiples of `alignment` (counted from the group's start) at or below k/parts of it,
// so parts differ from group.size()/parts by less than one alignment unit (one may be empty
// when the group is small), no element is in two parts, and parts are exactly equal when the
// group's size is a multiple of parts x alignment.
FlatRange shard_part(FlatRange group, int part, int parts, int64_t alignment = kShardAlignment);

// ZeRO-1's buckets: a strategy's `ranges` re-cut so that every bucket divides into `ranks`
// equal aligned parts (a reduce-scatter's equal chunks). Each range boundary moves up to the
// next multiple of granule = ranks x alignment, towards the end of the buffer whose
// gradients backward finishes first, so no bucket waits for gradients its original range
// did not: it hands its first few elements to the next bucket and takes a few, already
// final, from the previous one. The buckets tile [0, flat_elements) whole (a multiple of the
// granule): frozen tensors, gaps and the padding at the end join a neighbour; a range that
// shrinks to nothing disappears. In reverse parameter order.
std::vector<FlatRange> plan_zero1_buckets(const std::vector<FlatRange>& ranges, int64_t flat_elements, int ranks,
                                          int64_t alignment = kShardAlignment);

}  // namespace llmhpc

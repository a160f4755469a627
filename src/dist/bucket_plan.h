// Which ranges of the flat gradient buffer a data-parallel strategy reduces: pure functions
// of the parameters' places in the buffer, so they are unit-tested without communication.
//
// A parameter tensor is a range of elements of the one flat buffer (ParamSpan). Every plan
// lists ranges in reverse parameter order (descending offsets), the order in which backward
// finishes them, and never includes a frozen parameter unless a strategy says so (flat).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llmhpc {

// One parameter tensor: elements [begin, end) of the flat gradient buffer.
struct ParamSpan {
  std::string name;
  int64_t begin = 0, end = 0;
  bool trainable = true;  // false: frozen; its gradient is never communicated
};

// A range of the flat buffer that one collective reduces in place.
struct GradRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const GradRange& o) const { return begin == o.begin && end == o.end; }
};

// One range per trainable tensor (naive, overlap).
std::vector<GradRange> plan_per_tensor(const std::vector<ParamSpan>& params);

// The one range from the first trainable element to the last (flat): the whole buffer when
// every parameter trains. Frozen tensors between trainable ones are inside it and are
// communicated (harmless: the optimizer never reads their gradients); frozen tensors before
// the first or after the last trainable one are not. Empty when nothing trains.
std::vector<GradRange> plan_flat(const std::vector<ParamSpan>& params);

// Buckets (bucketed): trainable tensors taken in reverse parameter order and packed into
// contiguous ranges of at most bucket_mb MiB; a tensor larger than that is a bucket of its
// own. A frozen tensor, or a gap between tensors, ends a bucket, so a bucket is one range of
// the buffer that holds trainable gradients only and is reduced in place, with no copies.
// Throws UsageError (naming --bucket-mb) unless bucket_mb > 0.
std::vector<GradRange> plan_buckets(const std::vector<ParamSpan>& params, size_t element_bytes, double bucket_mb);

}  // namespace llmhpc

#include "src/dist/bucket_plan.h"

#include <algorithm>
#include <sstream>

#include "src/core/check.h"

namespace llmhpc {
namespace {

// The trainable tensors in reverse parameter order (descending offsets), empty ones left
// out. Tensors that overlap are a bug of whoever described the buffer.
std::vector<FlatRange> trainable_from_the_end(const std::vector<ParamSpan>& params) {
  std::vector<const ParamSpan*> order;
  for (const ParamSpan& p : params) {
    LLMHPC_CHECK(0 <= p.begin && p.begin <= p.end, "parameter " + p.name + " has a negative range");
    order.push_back(&p);
  }
  std::sort(order.begin(), order.end(), [](const ParamSpan* a, const ParamSpan* b) { return a->begin > b->begin; });
  std::vector<FlatRange> out;
  for (size_t i = 0; i < order.size(); ++i) {
    const ParamSpan& p = *order[i];
    LLMHPC_CHECK(i == 0 || p.end <= order[i - 1]->begin || p.begin == p.end,
                 "parameters " + p.name + " and " + order[i - 1]->name + " overlap in the flat buffer");
    if (p.trainable && p.begin < p.end) out.push_back({p.begin, p.end});
  }
  return out;
}

}  // namespace

std::vector<FlatRange> plan_per_tensor(const std::vector<ParamSpan>& params) { return trainable_from_the_end(params); }

std::vector<FlatRange> plan_flat(const std::vector<ParamSpan>& params) {
  const std::vector<FlatRange> tensors = trainable_from_the_end(params);
  if (tensors.empty()) return {};
  return {{tensors.back().begin, tensors.front().end}};
}

// The cap is in MiB, as PyTorch's bucket_cap_mb (DistributedDataParallel multiplies it by
// 1024 * 1024), so --bucket-mb 25 is PyTorch's default bucket. Two differences, both so that
// a bucket is exactly what its size says: PyTorch closes a bucket only once it has reached
// the cap, so its buckets exceed the cap by up to one tensor, where here a bucket stays
// within it unless it is one tensor larger than the cap; and PyTorch caps its first bucket
// at 1 MiB to start communicating sooner, where here every bucket has the same cap.
std::vector<FlatRange> plan_buckets(const std::vector<ParamSpan>& params, size_t element_bytes, double bucket_mb) {
  if (!(bucket_mb > 0)) {
    std::ostringstream text;
    text << bucket_mb;
    throw UsageError("{bucket_mb} " + text.str() + ": must be a positive size in MiB");
  }
  const double cap_bytes = bucket_mb * 1024 * 1024;
  std::vector<FlatRange> buckets;
  for (const FlatRange& tensor : trainable_from_the_end(params)) {
    // Joins the open bucket when adjacent to it (no frozen tensor or gap between) and the
    // sum fits; otherwise starts the next one.
    if (!buckets.empty()) {
      FlatRange& open = buckets.back();
      if (tensor.end == open.begin && double(open.size() + tensor.size()) * double(element_bytes) <= cap_bytes) {
        open.begin = tensor.begin;
        continue;
      }
    }
    buckets.push_back(tensor);
  }
  return buckets;
}

int64_t round_up(int64_t x, int64_t multiple) {
  LLMHPC_CHECK(x >= 0 && multiple > 0, "round_up of a negative size or to a non-positive multiple");
  return (x + multiple - 1) / multiple * multiple;
}

FlatRange shard_part(FlatRange group, int part, int parts, int64_t alignment) {
  LLMHPC_CHECK(0 <= part && part < parts && alignment > 0 && group.begin <= group.end, "shard_part arguments");
  // The cut before part k; exact integer arithmetic (sizes * parts stay far below 2^63).
  auto cut = [&](int k) {
    if (k == parts) return group.end;
    return group.begin + group.size() * k / (int64_t(parts) * alignment) * alignment;
  };
  return {cut(part), cut(part + 1)};
}

std::vector<FlatRange> plan_zero1_buckets(const std::vector<FlatRange>& ranges, int64_t flat_elements, int ranks,
                                          int64_t alignment) {
  const int64_t granule = int64_t(ranks) * alignment;
  LLMHPC_CHECK(flat_elements % granule == 0, "ZeRO-1 needs the flat buffer padded to a multiple of ranks x alignment");
  std::vector<int64_t> cuts = {0, flat_elements};
  for (const FlatRange& r : ranges) {
    LLMHPC_CHECK(0 <= r.begin && r.end <= flat_elements, "a bucket lies beyond the flat buffer");
    cuts.push_back(round_up(r.begin, granule));
    cuts.push_back(round_up(r.end, granule));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<FlatRange> buckets;
  for (size_t i = cuts.size() - 1; i > 0; --i) buckets.push_back({cuts[i - 1], cuts[i]});
  return buckets;
}

}  // namespace llmhpc

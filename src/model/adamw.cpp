#include "src/model/adamw.h"

#include <algorithm>

#include "src/core/nvtx.h"

namespace llmhpc {

AdamW::AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, std::vector<FlatRange> owned)
    : model_(model), ops_(ops), hyper_(hyper), owned_(std::move(owned)) {
  if (owned_.empty()) owned_ = {{0, model.layout().total()}};
  std::vector<FlatRange> sorted = owned_;
  std::sort(sorted.begin(), sorted.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    LLMHPC_CHECK(0 <= sorted[i].begin && sorted[i].begin <= sorted[i].end && sorted[i].end <= model.params().numel(),
                 "optimizer range outside the flat parameters");
    LLMHPC_CHECK(i == 0 || sorted[i - 1].end <= sorted[i].begin, "optimizer ranges overlap");
  }
}

AdamW::AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, Shard shard)
    : model_(model), ops_(ops), hyper_(hyper), owned_({{0, shard.params.numel()}}), shard_(shard) {
  LLMHPC_CHECK(!shard.params.empty() && shard.grads, "an optimizer shard needs parameters and their gradients");
}

void AdamW::allocate_state() {
  if (has_state_) return;
  const int64_t n = owned_elements();
  if (n > 0) {  // an owner of nothing (a tiny model split among many ranks) keeps nothing
    Device& dev = model_.device();
    const DType pd = params().dtype;
    m_ = Buffer(dev.allocator(), pd, {n}, "optimizer.m");
    v_ = Buffer(dev.allocator(), pd, {n}, "optimizer.v");
    dev.fill_zero(m_.tensor().data, m_.tensor().bytes());
    dev.fill_zero(v_.tensor().data, v_.tensor().bytes());
  }
  has_state_ = true;
}

void AdamW::begin_step() {
  LLMHPC_CHECK(owned_.size() == 1 && owned_[0].begin == 0, "AdamW in backward needs an unsharded optimizer");
  LLMHPC_CHECK(!(clipping_.max_norm > 0), "AdamW in backward cannot clip: the norm needs every gradient first");
  allocate_state();
  ++step_;
}

void AdamW::update(FlatRange r, Tensor grads) {
  LLMHPC_CHECK(r.begin >= 0 && r.end <= owned_[0].end && grads.numel() == r.size(), "AdamW update outside its range");
  NvtxRange range("optimizer");
  const Tensor lowp = this->lowp();
  const int64_t n = r.size();
  ops_.adamw_step(params().slice(r.begin, {n}), grads, m_.tensor().slice(r.begin, {n}), v_.tensor().slice(r.begin, {n}),
                  lowp.empty() ? Tensor() : lowp.slice(r.begin, {n}), hyper_, step_);
}

double AdamW::clipping_factor() {
  if (!(clipping_.max_norm > 0)) return 1.0;
  const int64_t total = parameters();  // a sharded buffer's padding is no parameter
  std::vector<Span> spans;
  for (const FlatRange& r : owned_) {
    int64_t at = r.begin;
    const int64_t end = std::min(r.end, total);
    for (const FlatRange& skip : clipping_.counted_elsewhere) {  // in layout order, as owned_
      if (skip.end <= at || skip.begin >= end) continue;
      if (skip.begin > at) spans.push_back({at, skip.begin - at});
      at = std::max(at, skip.end);
    }
    if (end > at) spans.push_back({at, end - at});
  }
  Device& dev = model_.device();
  Buffer sum(dev.allocator(), DType::F64, {1}, "optimizer.grad_norm");
  ops_.sum_of_squares(sum.tensor(), grads(), spans);
  double squares = 0;
  dev.copy_to_host(&squares, sum.tensor().data, sizeof squares);
  if (clipping_.sum_over_ranks) squares = clipping_.sum_over_ranks(squares);
  grad_norm_ = std::sqrt(squares);
  return std::min(1.0, clipping_.max_norm / (grad_norm_ + 1e-6));  // torch's clip_coef, clamped to 1
}

void AdamW::step(ParallelHooks* listener) {
  NvtxRange range("optimizer");
  allocate_state();
  ++step_;
  AdamWHyper hyper = hyper_;
  hyper.grad_scale = clipping_factor();
  const Tensor params = this->params(), grads = this->grads(), lowp = this->lowp();
  // Owned ranges go to the kernel together until they add up to kElementsPerLaunch (a
  // launch costs a few us: one launch per slice cost +0.52 ms a step over zero1's 242 slices
  // of xl at 25 MiB buckets, docs/results/sharding.md), then the listener hears of each, so
  // that what it sends still overlaps the rest of the step.
  constexpr int64_t kElementsPerLaunch = int64_t(1) << 26;  // 256 MiB of fp32, ~0.6 ms on an H100
  std::vector<AdamWSlice> slices;
  int64_t packed = 0, pending = 0;
  size_t first_unreported = 0;
  for (size_t i = 0; i < owned_.size(); ++i) {
    const FlatRange& r = owned_[i];
    slices.push_back({r.begin, packed, r.size()});
    packed += r.size();
    pending += r.size();
    if (pending < kElementsPerLaunch && i + 1 < owned_.size()) continue;
    if (pending > 0) ops_.adamw_step(params, grads, m_.tensor(), v_.tensor(), lowp, slices, hyper, step_);
    for (; first_unreported <= i; ++first_unreported)
      if (listener) listener->parameters_updated(owned_[first_unreported].begin, owned_[first_unreported].end);
    slices.clear();
    pending = 0;
  }
}

}  // namespace llmhpc

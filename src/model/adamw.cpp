#include "src/model/adamw.h"

#include "src/core/nvtx.h"

namespace llmhpc {

AdamW::AdamW(TransformerLM& model, Ops& ops, const AdamWHyper& hyper, int64_t begin, int64_t end)
    : model_(model), ops_(ops), hyper_(hyper), begin_(begin), end_(end < 0 ? model.layout().total() : end) {
  LLMHPC_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= model.layout().total(), "optimizer range");
  Device& dev = model.device();
  const DType pd = model.params().dtype;
  m_ = Buffer(dev.allocator(), pd, {end_ - begin_}, "optimizer.m");
  v_ = Buffer(dev.allocator(), pd, {end_ - begin_}, "optimizer.v");
  dev.fill_zero(m_.tensor().data, m_.tensor().bytes());
  dev.fill_zero(v_.tensor().data, v_.tensor().bytes());
}

void AdamW::step() {
  NvtxRange range("optimizer");
  ++step_;
  const int64_t n = end_ - begin_;
  if (n == 0) return;
  Tensor lowp = model_.params_lowp();
  ops_.adamw_step(model_.params().slice(begin_, {n}), model_.grads().slice(begin_, {n}), m_, v_,
                  lowp.empty() ? Tensor() : lowp.slice(begin_, {n}), hyper_, step_);
}

}  // namespace llmhpc

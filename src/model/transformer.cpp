#include "src/model/transformer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "src/core/nvtx.h"
#include "src/core/units.h"

namespace llmhpc {

Precision parse_precision(const std::string& text) {
  require_choice(text, {"fp32", "bf16", "fp64"}, "precision");
  return text == "bf16" ? Precision::BF16 : text == "fp64" ? Precision::FP64 : Precision::FP32;
}

const char* precision_name(Precision p) {
  return p == Precision::BF16 ? "bf16" : p == Precision::FP64 ? "fp64" : "fp32";
}

DType param_dtype(Precision p) { return p == Precision::FP64 ? DType::F64 : DType::F32; }

DType compute_dtype(Precision p) {
  return p == Precision::BF16 ? DType::BF16 : p == Precision::FP64 ? DType::F64 : DType::F32;
}

GradientDType parse_gradient_dtype(const std::string& text) {
  require_choice(text, {"same", "bf16"}, "grad-dtype");
  return text == "bf16" ? GradientDType::BF16 : GradientDType::Master;
}

DType gradient_dtype(Precision p, GradientDType g) {
  if (g == GradientDType::Master) return param_dtype(p);
  if (p != Precision::BF16)
    throw UsageError(std::string("{grad_dtype} bf16 keeps the gradients in the dtype of the products that make them, "
                                 "which {precision} ") +
                     precision_name(p) + " computes in " + dtype_name(compute_dtype(p)) +
                     ": every {precision} of the run must be bf16, or use {grad_dtype} same");
  return DType::BF16;
}

AttentionKind parse_attention(const std::string& text) {
  require_choice(text, {"naive", "flash"}, "attention");
  return text == "flash" ? AttentionKind::Flash : AttentionKind::Naive;
}

const char* attention_name(AttentionKind k) { return k == AttentionKind::Flash ? "flash" : "naive"; }

// What lives from a forward to the end of its backward: what forward keeps for backward, per
// layer, its temporaries, and backward's scratch (shared by layers). Taken by forward from the
// allocator (its cache on a GPU) and given back at the end of backward, as PyTorch frees a
// graph's saved tensors, so nothing of it is live between steps.
struct TransformerLM::Activations {
  struct Layer {
    Buffer resid;       // (B,T,C) param dtype: the layer's input
    Buffer ln1_rstd;    // (B*T): the norm of the layer input
    Buffer ln1_out;     // (B,T,C) compute: its output (MemoryPlan::Fast; LowMemory recomputes it)
    Buffer qkv;         // (B,T,3C) compute, after RoPE
    Buffer attn_saved;  // probabilities or logsumexp
    Buffer attn_out;    // (B,T,C) compute
    Buffer resid_mid;   // (B,T,C) param dtype: after the attention residual
    Buffer ln2_rstd;    // like ln1
    Buffer ln2_out;     // like ln1_out
    Buffer h13;         // (B,T,2F) compute: [W1 x | W3 x]
  };
  std::vector<Layer> layers;
  Buffer resid_final, lnf_out, lnf_rstd, logits;
  Buffer branch_out;  // (B,T,C) compute: attention or FFN output before its residual add
  // One SwiGLU product (B,T,F) for all layers, which backward recomputes from h13; under
  // LowMemory also one norm output (B,T,C), which backward recomputes from the saved norm
  // inputs and statistics.
  Buffer norm_out, gated;
  // Tensor parallelism: under sequence parallelism the (tokens, C) input of a column-parallel
  // product gathered from every rank, shared by the layers (forward, then backward); with the
  // vocabulary split, the loss's per-token statistics of this rank's logits, every rank's,
  // and the logsumexp over the whole vocabulary, which backward reads. With forward's products
  // split under sequence parallelism (overlap_chunks), this rank's (R, C) rows of a row-parallel
  // product's sum, reduce-scattered chunk by chunk.
  Buffer gathered, ce_stats, ce_stats_all, lse, reduced;
  // The norm outputs the products read: the layer's own, or the shared one (LowMemory).
  Tensor ln1_out(int64_t l) const { return pick(layers[size_t(l)].ln1_out); }
  Tensor ln2_out(int64_t l) const { return pick(layers[size_t(l)].ln2_out); }
  Tensor pick(const Buffer& kept) const { return kept.empty() ? norm_out.tensor() : kept.tensor(); }
  // Backward scratch, allocated as backward begins.
  Buffer d_resid, d_branch, d_norm, d_qkv, d_attn, d_h13, d_gated;
};

TransformerLM::TransformerLM(const Config& c, Device& device, Ops& ops)
    : config_(c.shape), tp_(c.tensor_parallel), layout_(c.shape, TensorSplit{tp_.size, tp_.rank}),
      precision_(c.precision), grad_dtype_(gradient_dtype(c.precision, c.grad_dtype)), attention_(c.attention),
      device_(device), ops_(ops), memory_(c.memory), storage_(c.storage) {
  const int64_t flat_elements = c.flat_elements;
  const GradientStorage gradients = c.gradients;
  config_.validate();
  LLMHPC_CHECK(
      !tp_.active() || (tp_.group != nullptr && tp_.group->size() == tp_.size && tp_.group->rank() == tp_.rank),
      "tensor parallelism needs the group's collectives");
  LLMHPC_CHECK(tp_.active() || !tp_.sequence_parallel, "sequence parallelism splits a tensor-parallel group's tokens");
  if (storage_ == ParameterStorage::Sharded) {
    LLMHPC_CHECK(flat_elements == 0 && gradients == GradientStorage::Whole,
                 "sharded parameters: the model keeps no flat buffers to pad or to hold one range's gradients");
    unit_params_.resize(layout_.units().size());
    unit_grads_.resize(layout_.units().size());
    return;
  }
  Allocator& a = device_.allocator();
  const DType pd = param_dtype(precision_);
  const int64_t total = layout_.total(), flat = flat_elements == 0 ? total : flat_elements;
  LLMHPC_CHECK(flat >= total, "the flat buffers must hold every parameter");
  // Paged: a sharded optimizer that shares the bf16 copy gives back the pages of the masters
  // this rank neither updates nor reads (src/dist/grad_sync.h, CopySharing).
  params_ = Buffer(a, pd, {flat}, "params", MemoryKind::Paged);
  if (gradients == GradientStorage::Whole) {
    // Shareable: data-parallel collectives through the copy engines move the gradients where
    // they lie (CopyEngines::register_window).
    grads_ = Buffer(a, grad_dtype_, {flat}, "grads", MemoryKind::Shareable);
  } else {
    LLMHPC_CHECK(flat == total, "per-range gradients need an unpadded flat buffer");
    const ParamInfo& lnf = layout_.find("ln_final.weight");
    const auto layer = layout_.layer_range(0);  // every layer has the same size
    grad_window_elements_ = std::max(
        {layer.second - layer.first, total - lnf.offset, layout_.find("token_embeddings.weight").shape.numel()});
  }
  for (const Buffer* b : {&params_, &grads_}) {  // the padding: zero, and nothing ever writes it
    if (b->empty()) continue;
    const Tensor padding = b->tensor().slice(total, {flat - total});
    device_.fill_zero(padding.data, padding.bytes());
  }
  if (casts_per_layer()) {
    const auto layer = layout_.layer_range(0);  // every layer has the same size
    layer_window_.buffer = Buffer(a, DType::BF16, {layer.second - layer.first}, "params.bf16.layer");
    head_window_.buffer = Buffer(a, DType::BF16, layout_.find("lm_head.weight").shape, "params.bf16.lm_head");
  } else if (precision_ == Precision::BF16) {
    take_lowp();
  }
}

void TransformerLM::take_lowp() {
  // Shareable: a sharded optimizer's all-gathers of the copy through the copy engines move it
  // where it lies (CopySharing::copy_engines).
  params_lowp_ =
      Buffer(device_.allocator(), DType::BF16, {params_.tensor().numel()}, "params.bf16", MemoryKind::Shareable);
  // The padding, which no range asks for, zero as the fp32 padding: written, not converted,
  // since the last all-gather of a step may still be writing the fp32 padding (its zeros).
  const int64_t total = layout_.total();
  const Tensor padding = params_lowp_.tensor().slice(total, {params_.tensor().numel() - total});
  device_.fill_zero(padding.data, padding.bytes());
}

TransformerLM::~TransformerLM() = default;

Tensor TransformerLM::view(const Tensor& flat, const std::string& name) const {
  const ParamInfo& p = layout_.find(name);
  return flat.slice(p.offset, p.shape);
}

Tensor TransformerLM::Window::view(int64_t offset, Shape shape) const {
  LLMHPC_CHECK(offset >= begin && offset + shape.numel() <= end,
               "flat offset " + std::to_string(offset) + " used outside the range its window holds");
  return buffer.tensor().slice(offset - begin, shape);
}

Tensor TransformerLM::compute_view(int64_t offset, Shape shape) const {
  LLMHPC_CHECK(!lowp_released(), "the bf16 copy is read before the arriving parameters were asked for");
  if (!params_lowp_.empty()) return params_lowp_.tensor().slice(offset, shape);
  if (!casts_per_layer()) return params_.tensor().slice(offset, shape);
  const bool in_layer = offset >= layer_window_.begin && offset + shape.numel() <= layer_window_.end;
  return (in_layer ? layer_window_ : head_window_).view(offset, shape);
}

Tensor TransformerLM::grad_view(int64_t offset, Shape shape) const {
  return grads_.empty() ? grad_window_.view(offset, shape) : grads_.tensor().slice(offset, shape);
}

Tensor TransformerLM::unit_view(const std::vector<UnitView>& views, const ParamInfo& p, Shape shape) const {
  const UnitView& v = views[size_t(p.unit)];
  const Tensor& lane = p.is_matrix ? v.matrices : v.others;
  LLMHPC_CHECK(!lane.empty(), p.name + " is read or written before its unit was asked for in this pass");
  return lane.slice(p.lane_offset, shape);
}

Tensor TransformerLM::grad(const std::string& name) const {
  const ParamInfo& p = layout_.find(name);
  if (storage_ == ParameterStorage::Sharded) return unit_view(unit_grads_, p, p.shape);
  return grad_view(p.offset, p.shape);
}

Tensor TransformerLM::gradients(int64_t begin, int64_t end) const { return grad_view(begin, {end - begin}); }

void TransformerLM::open_gradients(int64_t begin, int64_t end) {
  if (!grads_.empty()) return;
  if (grad_window_.buffer.empty())
    grad_window_.buffer = Buffer(device_.allocator(), grad_dtype_, {grad_window_elements_}, "grads.range");
  LLMHPC_CHECK(end - begin <= grad_window_.buffer.tensor().numel(), "a gradient range larger than its buffer");
  grad_window_.begin = begin;
  grad_window_.end = end;
}

void TransformerLM::cast_into(Window& window, std::pair<int64_t, int64_t> range) {
  if (window.begin == range.first && window.end == range.second) return;  // already there
  const int64_t n = range.second - range.first;
  ops_.convert(window.buffer.tensor().slice(0, {n}), params_.tensor().slice(range.first, {n}));
  window.begin = range.first;
  window.end = range.second;
}

Tensor TransformerLM::weight(const std::string& name) const {
  const ParamInfo& p = layout_.find(name);
  if (storage_ == ParameterStorage::Sharded) return unit_view(unit_params_, p, p.shape);
  return compute_view(p.offset, p.shape);
}

Tensor TransformerLM::gain(const std::string& name) const {
  const ParamInfo& p = layout_.find(name);
  if (storage_ == ParameterStorage::Sharded) return unit_view(unit_params_, p, p.shape);
  return params_.tensor().slice(p.offset, p.shape);
}

Tensor TransformerLM::weight_rows(const std::string& first, int64_t rows) const {
  const ParamInfo& p = layout_.find(first);
  if (storage_ == ParameterStorage::Sharded) return unit_view(unit_params_, p, {rows, p.shape[1]});
  return compute_view(p.offset, {rows, p.shape[1]});
}

Tensor TransformerLM::grad_rows(const std::string& first, int64_t rows) const {
  const ParamInfo& p = layout_.find(first);
  if (storage_ == ParameterStorage::Sharded) return unit_view(unit_grads_, p, {rows, p.shape[1]});
  return grad_view(p.offset, {rows, p.shape[1]});
}

// The initialisation of transformer.h (init_parameters), drawn where the parameters live
// (Ops::random_normal: a GPU draws 3.4 billion in milliseconds, the host in seconds per core),
// the same values on every backend.
void TransformerLM::init_parameter(Ops& ops, Device& device, const ParameterLayout& layout, size_t k, Tensor dst,
                                   uint64_t seed) {
  const ParamInfo& p = layout.params()[k];
  LLMHPC_CHECK(dst.numel() == p.shape.numel(), "init_parameter into a tensor of another size");
  if (p.split != Split::Whole) {  // drawn whole, as one rank draws it; this rank's part copied out
    Buffer whole(device.allocator(), dst.dtype, p.whole, "init.whole");
    init_whole(ops, device, p, k, whole.tensor(), seed);
    device.fill_zero(dst.data, dst.bytes());  // the vocabulary's padding rows
    const size_t es = dtype_size(dst.dtype);
    for (const PartRun& run : layout.part_runs(p))
      device.copy_on_device(static_cast<char*>(dst.data) + run.part * es,
                            static_cast<const char*>(whole.tensor().data) + run.whole * es, size_t(run.count) * es);
    return;
  }
  init_whole(ops, device, p, k, dst, seed);
}

void TransformerLM::init_whole(Ops& ops, Device& device, const ParamInfo& p, size_t k, Tensor dst, uint64_t seed) {
  if (p.shape.ndim == 1) {  // a norm gain: ones
    std::vector<unsigned char> ones(dst.bytes());
    for (int64_t i = 0; i < dst.numel(); ++i) store_from_double(ones.data(), size_t(i), dst.dtype, 1.0);
    device.copy_to_device(dst.data, ones.data(), ones.size());
  } else {
    const double std = p.is_matrix ? std::sqrt(2.0 / double(p.whole[0] + p.whole[1])) : 1.0;
    ops.random_normal(dst, seed, k, std, 3.0);
  }
}

void TransformerLM::init_parameters(uint64_t seed) {
  LLMHPC_CHECK(storage_ == ParameterStorage::Local, "sharded parameters are initialised where they are held");
  for (size_t k = 0; k < layout_.params().size(); ++k)
    init_parameter(ops_, device_, layout_, k, param(layout_.params()[k].name), seed);
  parameters_changed();
}

void TransformerLM::parameters_changed() {
  if (storage_ == ParameterStorage::Sharded) return;
  // Arriving parameters would land on top of the change.
  LLMHPC_CHECK(arriving_ == nullptr && masters_from_ == nullptr,
               "parameters changed while others still arrive or are stale: wait_parameters() first");
  if (lowp_released()) take_lowp();
  if (!params_lowp_.empty()) ops_.convert(params_lowp_, params_);
  layer_window_.forget();
  head_window_.forget();
}

std::vector<FlatRange> TransformerLM::full_precision_ranges() const {
  std::vector<FlatRange> out;
  for (const ParamInfo& p : layout_.params())
    if (!p.is_matrix) out.push_back({p.offset, p.offset + p.shape.numel()});  // read with param(), not weight()
  return out;
}

void TransformerLM::parameters_arriving(ParallelHooks& source) {
  LLMHPC_CHECK(arriving_ == nullptr, "parameters arriving twice without a forward or wait_parameters()");
  LLMHPC_CHECK(masters_from_ == nullptr || masters_from_ == &source,
               "parameters arriving from a second source while the first one's masters are stale");
  arriving_ = &source;
  if (source.shares_compute_copy()) {
    LLMHPC_CHECK(!params_lowp_.empty(), "the bf16 copy arrives into a model that keeps none");
    masters_from_ = &source;
    return;
  }
  // Every range of the bf16 copy is cast again as forward asks for it (need_parameters), so
  // until then the copy holds nothing anyone reads: its memory goes back to the allocator
  // between the steps, as autocast's per-forward casts do. Taken again at the first range
  // asked for, so the peak (in backward) is the same.
  params_lowp_.release();
}

void TransformerLM::wait_parameters() {
  if (storage_ == ParameterStorage::Sharded) return;  // the holder's own business
  if (masters_from_ != nullptr) {                     // the bf16 copy is (or arrives) fresh; the masters were stale
    masters_from_->masters_needed();
    masters_from_ = arriving_ = nullptr;
    return;
  }
  if (arriving_ == nullptr) return;
  arriving_->parameters_needed(0, params_.tensor().numel());
  arriving_ = nullptr;
  parameters_changed();
}

namespace {
// Whether `v` has room for each of `unit`'s lanes.
bool holds_lanes(const UnitView& v, const ParamUnit& unit) {
  for (Lane which : {Lane::Matrices, Lane::Others}) {
    const Tensor& lane = which == Lane::Matrices ? v.matrices : v.others;
    if (unit.elements(which) > 0 && (lane.empty() || lane.numel() < unit.elements(which))) return false;
  }
  return true;
}
}  // namespace

void TransformerLM::need_unit(int u, int next) {
  const std::vector<ParamUnit>& units = layout_.units();
  const ParamUnit& unit = units[size_t(u)];
  if (storage_ == ParameterStorage::Local) return need_parameters(unit.range.begin, unit.range.end);
  LLMHPC_CHECK(hooks_ != nullptr, "sharded parameters need set_parallel_hooks()");
  const UnitView v = hooks_->unit_parameters(unit, next >= 0 ? &units[size_t(next)] : nullptr);
  LLMHPC_CHECK(holds_lanes(v, unit), "a unit's parameters given in lanes shorter than the unit's");
  LLMHPC_CHECK(unit.elements(Lane::Matrices) == 0 || v.matrices.dtype == compute_dtype(precision_),
               "a unit's matrices given in another dtype than the products read");
  LLMHPC_CHECK(unit.elements(Lane::Others) == 0 || v.others.dtype == param_dtype(precision_),
               "a unit's gains given in another dtype than the parameters'");
  unit_params_[size_t(u)] = v;
}

void TransformerLM::open_unit_gradients(int u, ParallelHooks* listener) {
  const ParamUnit& unit = layout_.units()[size_t(u)];
  if (storage_ == ParameterStorage::Local) return open_gradients(unit.range.begin, unit.range.end);
  // A backward that reports to nobody (a micro-batch before the last) still writes where the
  // holder of the parameters says.
  ParallelHooks* holder = listener ? listener : hooks_;
  LLMHPC_CHECK(holder != nullptr, "backward under sharded parameters needs the hooks that hold them");
  const UnitView g = holder->unit_gradients(unit);
  LLMHPC_CHECK(holds_lanes(g, unit), "a unit's gradients given in lanes shorter than the unit's");
  LLMHPC_CHECK((unit.elements(Lane::Matrices) == 0 || g.matrices.dtype == grad_dtype_) &&
                   (unit.elements(Lane::Others) == 0 || g.others.dtype == grad_dtype_),
               "a unit's gradients given in another dtype than backward writes");
  unit_grads_[size_t(u)] = g;
}

void TransformerLM::need_parameters(int64_t begin, int64_t end) {
  if (arriving_ == nullptr) return;
  arriving_->parameters_needed(begin, end);
  if (arriving_ == masters_from_) return;  // the copy itself arrived
  if (lowp_released()) take_lowp();
  // The same rounding as one convert of the whole buffer, element by element: bitwise the same copy.
  if (!params_lowp_.empty())
    ops_.convert(params_lowp_.tensor().slice(begin, {end - begin}), params_.tensor().slice(begin, {end - begin}));
}

Tensor TransformerLM::token_rows(Tensor t, int64_t first, int64_t count) const {
  const int64_t columns = t.numel() / (batch_ * seq_);
  return t.slice(first * columns, {count, columns});
}

Tensor TransformerLM::gathered(Tensor rows) {
  if (!tp_.sequence_parallel) return rows;
  const Tensor whole = act_->gathered.tensor();
  tp_.group->all_gather(whole, rows);
  return whole;
}

void TransformerLM::over_gathered(Tensor rows, const std::function<void(Tensor, int64_t, int64_t)>& product) {
  const int64_t N = batch_ * seq_;
  if (!tp_.sequence_parallel || tp_.overlap_chunks < 2) return product(gathered(rows), 0, N);
  const Tensor whole = act_->gathered.tensor();
  const int64_t R = stream_rows(), own = R * tp_.rank;
  auto gather = tp_.group->begin_all_gather(whole, rows);
  product(rows, own, R);  // this rank's own tokens, under the gather of the others'
  gather->finish();
  if (own > 0) product(token_rows(whole, 0, own), 0, own);
  if (own + R < N) product(token_rows(whole, own + R, N - own - R), own + R, N - own - R);
}

void TransformerLM::column_parallel_forward(Tensor y, Tensor rows, Tensor w) {
  over_gathered(
      rows, [&](Tensor x, int64_t first, int64_t count) { ops_.linear_forward(token_rows(y, first, count), x, w); });
}

Tensor TransformerLM::row_parallel_forward(Tensor y, Tensor x, Tensor w) {
  const int K = tp_.active() ? tp_.overlap_chunks : 1;
  if (K < 2) {
    ops_.linear_forward(y, x, w);
    return reduced(y);
  }
  const int64_t N = batch_ * seq_, C = y.numel() / N;
  std::vector<std::unique_ptr<TensorParallelGroup::Pending>> sums;
  if (!tp_.sequence_parallel) {  // chunk c: tokens [c N / K, (c + 1) N / K), all-reduced in place
    for (int c = 0; c < K; ++c) {
      const int64_t first = N * c / K, count = N * (c + 1) / K - first;
      const Tensor part = token_rows(y, first, count);
      ops_.linear_forward(part, token_rows(x, first, count), w);
      sums.push_back(tp_.group->begin_all_reduce(part));
    }
    for (auto& sum : sums) sum->finish();
    return y;
  }
  // Sequence parallelism: chunk c is rows [c R / K, (c + 1) R / K) of every rank's share,
  // written into y rank after rank, so that its reduce-scatter gives each rank its own.
  const int64_t R = stream_rows(), P = tp_.size;
  const Tensor mine = act_->reduced.tensor();
  for (int c = 0; c < K; ++c) {
    const int64_t first = R * c / K, count = R * (c + 1) / K - first;
    for (int64_t r = 0; r < P; ++r)
      ops_.linear_forward(token_rows(y, P * first + r * count, count), token_rows(x, r * R + first, count), w);
    sums.push_back(
        tp_.group->begin_reduce_scatter(mine.slice(first * C, {count, C}), token_rows(y, P * first, P * count)));
  }
  for (auto& sum : sums) sum->finish();
  return mine;
}

TransformerLM::Reduction TransformerLM::begin_reduce(Tensor partial) {
  if (!tp_.active()) return {nullptr, partial};
  if (!tp_.sequence_parallel) return {tp_.group->begin_all_reduce(partial), partial};
  const int64_t R = stream_rows(), C = partial.numel() / (batch_ * seq_);
  const Tensor mine = partial.slice(R * C * tp_.rank, {R, C});
  return {tp_.group->begin_reduce_scatter(mine, partial), mine};
}

Tensor TransformerLM::column_parallel_backward(Tensor dx, Tensor dw, Tensor dy, Tensor rows, Tensor w,
                                               bool accumulate) {
  if (!tp_.active()) {  // one call: the backends may fuse the two products
    ops_.linear_backward(dx, dw, dy, rows, w, accumulate);
    return dx;
  }
  std::unique_ptr<TensorParallelGroup::Pending> gather;  // the input, which only dw reads
  Tensor x = rows;
  if (tp_.sequence_parallel) {
    x = act_->gathered.tensor();
    gather = tp_.group->begin_all_gather(x, rows);
  }
  ops_.linear_backward(dx, Tensor(), dy, Tensor(), w, accumulate);
  Reduction sum = begin_reduce(dx);
  if (gather) gather->finish();
  ops_.linear_backward(Tensor(), dw, dy, x, w, accumulate);
  return sum.finish();
}

Tensor TransformerLM::row_parallel_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) {
  if (!tp_.sequence_parallel || tp_.overlap_chunks < 2) {
    const Tensor whole = gathered(dy);
    ops_.linear_backward(dx, dw, whole, x, w, accumulate);
    return whole;
  }
  over_gathered(dy, [&](Tensor g, int64_t first, int64_t count) {
    ops_.linear_backward(token_rows(dx, first, count), Tensor(), g, Tensor(), w, accumulate);
  });
  const Tensor whole = act_->gathered.tensor();
  if (!dw.empty()) ops_.linear_backward(Tensor(), dw, whole, x, w, accumulate);
  return whole;
}

void TransformerLM::sum_norm_gradients(std::initializer_list<std::string> names) {
  if (!tp_.sequence_parallel) return;  // every rank computed them from every token: the same
  for (const std::string& name : names) tp_.group->all_reduce(grad(name));
}

void TransformerLM::set_batch(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq) {
  reserve_batch(batch, seq);
  set_batch_part(0, batch * seq, tokens, targets);
}

void TransformerLM::set_batch_part(int64_t first, int64_t count, const int32_t* tokens, const int32_t* targets) {
  LLMHPC_CHECK(first >= 0 && count >= 0 && first + count <= batch_ * seq_, "a batch part outside the batch");
  device_.copy_to_device(static_cast<int32_t*>(tokens_.tensor().data) + first, tokens, count * sizeof(int32_t));
  has_targets_ = targets != nullptr;
  has_loss_ = false;
  if (has_targets_)
    device_.copy_to_device(static_cast<int32_t*>(targets_.tensor().data) + first, targets, count * sizeof(int32_t));
}

void TransformerLM::reserve_batch(int64_t batch, int64_t seq) {
  if (batch <= 0 || seq <= 0) throw UsageError("batch size and sequence length must be positive");
  if (seq > config_.context_length)
    throw UsageError("sequence length " + std::to_string(seq) + " exceeds {context_length} " +
                     std::to_string(config_.context_length));
  if (tp_.sequence_parallel && (batch * seq) % tp_.size != 0)
    throw UsageError("sequence parallelism splits the " + std::to_string(batch * seq) +
                     " tokens of a micro-batch (batch x sequence) among {tp} " + std::to_string(tp_.size) +
                     " ranks: give a batch or context length whose product divides by it");
  const int64_t split_rows = tp_.sequence_parallel ? batch * seq / tp_.size : batch * seq;
  if (tp_.active() && tp_.overlap_chunks > split_rows)
    throw UsageError("{tp_overlap} " + std::to_string(tp_.overlap_chunks) +
                     " splits forward's products into chunks of " +
                     std::string(tp_.sequence_parallel ? "each rank's " : "the micro-batch's ") +
                     std::to_string(split_rows) + " tokens: give at most that many");
  if (batch != batch_ || seq != seq_) {
    // A set a forward-only pass kept is of the old shape: freed before anything new is taken.
    act_.reset();
    tokens_.release();
    targets_.release();
    losses_.release();
    batch_ = seq_ = 0;
    Allocator& a = device_.allocator();
    tokens_ = Buffer(a, DType::I32, {batch, seq}, "batch.tokens");
    targets_ = Buffer(a, DType::I32, {batch, seq}, "batch.targets");
    // The per-token losses outlive backward, so that mean_loss() reads them after the step.
    losses_ = Buffer(a, param_dtype(precision_), {batch * seq}, "batch.losses");
    batch_ = batch;
    seq_ = seq;
  }
}

void TransformerLM::release_activations() { act_.reset(); }

// Forward takes the activations as it reaches them: the temporaries the layers share first,
// each layer's saved tensors right before forward first writes them, the final norm's and the
// logits after the last layer; so on a GPU the host allocates while the kernels already enqueued
// run. A set that a forward-only pass kept is complete, and nothing is taken.
TransformerLM::Activations& TransformerLM::take_activations() {
  if (!act_) {
    auto act = std::make_unique<Activations>();
    Allocator& a = device_.allocator();
    const DType cd = compute_dtype(precision_);
    const int64_t N = batch_ * seq_, R = stream_rows(), C = config_.d_model, F = config_.d_ff / tp_.size;
    act->layers.resize(size_t(config_.num_layers));
    if (memory_ == MemoryPlan::LowMemory) act->norm_out = Buffer(a, cd, {R, C}, "activations.norm_out");
    act->branch_out = Buffer(a, cd, {N, C}, "activations.branch_out");
    act->gated = Buffer(a, cd, {N, F}, "activations.ffn.gated");
    if (tp_.sequence_parallel) act->gathered = Buffer(a, cd, {N, C}, "activations.gathered");
    if (tp_.sequence_parallel && tp_.overlap_chunks > 1) act->reduced = Buffer(a, cd, {R, C}, "activations.reduced");
    act_ = std::move(act);
  }
  return *act_;
}

void TransformerLM::take_layer_activations(int64_t l) {
  Activations::Layer& L = act_->layers[size_t(l)];
  if (!L.resid.empty()) return;
  Allocator& a = device_.allocator();
  const DType pd = param_dtype(precision_), cd = compute_dtype(precision_);
  const DType sd = pd;  // statistics (rstd) in fp32, or fp64 in reference runs, as the losses
  // This rank's heads and features (tensor parallelism), and rows of the residual stream.
  const int64_t B = batch_, T = seq_, C = config_.d_model, Cl = C / tp_.size, F = config_.d_ff / tp_.size;
  const int64_t R = stream_rows();
  const SavedSpec saved =
      ops_.attention_saved({B, T, config_.num_heads / tp_.size, config_.head_dim(), true, attention_}, cd);
  const std::string p = "activations.layers." + std::to_string(l) + ".";
  L.resid = Buffer(a, pd, {R, C}, p + "resid");
  L.ln1_rstd = Buffer(a, sd, {R}, p + "ln1.rstd");
  if (memory_ == MemoryPlan::Fast) L.ln1_out = Buffer(a, cd, {R, C}, p + "ln1.out");
  L.qkv = Buffer(a, cd, {B, T, 3 * Cl}, p + "attn.qkv");
  L.attn_saved =
      Buffer(a, saved.dtype, saved.shape, p + (attention_ == AttentionKind::Naive ? "attn.probs" : "attn.logsumexp"));
  L.attn_out = Buffer(a, cd, {B, T, Cl}, p + "attn.out");
  L.resid_mid = Buffer(a, pd, {R, C}, p + "resid_mid");
  L.ln2_rstd = Buffer(a, sd, {R}, p + "ln2.rstd");
  if (memory_ == MemoryPlan::Fast) L.ln2_out = Buffer(a, cd, {R, C}, p + "ln2.out");
  L.h13 = Buffer(a, cd, {B, T, 2 * F}, p + "ffn.h13");
}

void TransformerLM::take_head_activations() {
  Activations& A = *act_;
  if (!A.resid_final.empty()) return;
  Allocator& a = device_.allocator();
  const DType pd = param_dtype(precision_), cd = compute_dtype(precision_), sd = pd;
  const int64_t N = batch_ * seq_, R = stream_rows(), C = config_.d_model, V = layout_.vocab_rows();
  A.resid_final = Buffer(a, pd, {R, C}, "activations.resid_final");
  A.lnf_out = Buffer(a, cd, {R, C}, "activations.ln_final.out");
  A.lnf_rstd = Buffer(a, sd, {R}, "activations.ln_final.rstd");
  A.logits = Buffer(a, cd, {N, V}, "activations.logits");  // this rank's vocabulary
  if (tp_.active()) {
    A.ce_stats = Buffer(a, sd, {N, 3}, "activations.loss.stats");
    A.ce_stats_all = Buffer(a, sd, {int64_t(tp_.size), N, 3}, "activations.loss.stats_all");
    A.lse = Buffer(a, sd, {N}, "activations.loss.logsumexp");
  }
}

void TransformerLM::forward() {
  LLMHPC_CHECK(batch_ > 0, "forward() before set_batch()");
  NvtxRange range("forward");
  Activations& A = take_activations();
  layer_window_.forget();  // AdamW may have changed the weights since the last forward
  head_window_.forget();
  // This rank's heads and features: all of them on one rank, 1/tp of them under tensor parallelism.
  const int64_t L = config_.num_layers, C = config_.d_model, Cl = C / tp_.size, F = config_.d_ff / tp_.size,
                H = config_.num_heads / tp_.size;
  const AttentionDims dims{batch_, seq_, H, config_.head_dim(), true, attention_};

  // While parameters arrive, each range is asked for right before its first read, in the
  // order of the flat buffer: the embedding, each layer (whose ln1 the previous layer's last
  // norm reads), then the final norm with the LM head.
  // Units: 0 the embedding, 1 + l layer l, L + 1 the head.
  std::fill(unit_params_.begin(), unit_params_.end(), UnitView{});
  need_unit(0, 1);
  take_layer_activations(0);
  if (!tp_.active()) {
    ops_.embedding_forward(A.layers[0].resid, tokens_, gain("token_embeddings.weight"));
  } else {         // each token's row from the rank holding it, zeros from the others, added up
    Buffer whole;  // sequence parallelism: every token's row, of which this rank keeps its own
    if (tp_.sequence_parallel)
      whole = Buffer(device_.allocator(), param_dtype(precision_), {batch_ * seq_, C}, "activations.embedding");
    const Tensor rows = tp_.sequence_parallel ? whole.tensor() : A.layers[0].resid.tensor();
    ops_.embedding_forward(rows, tokens_, gain("token_embeddings.weight"), layout_.vocab_begin());
    if (tp_.sequence_parallel) tp_.group->reduce_scatter(A.layers[0].resid, rows);
    else tp_.group->all_reduce(rows);
  }
  need_unit(1, 2);
  ops_.rmsnorm_forward(A.ln1_out(0), A.layers[0].ln1_rstd, A.layers[0].resid, gain("layers.0.ln1.weight"));
  for (int64_t l = 0; l < L; ++l) {
    NvtxRange layer_range("layer " + std::to_string(l));
    const std::string p = "layers." + std::to_string(l) + ".";
    Activations::Layer& X = A.layers[l];
    if (casts_per_layer()) cast_into(layer_window_, layout_.layer_range(int(l)));
    column_parallel_forward(X.qkv, A.ln1_out(l), weight_rows(p + "attn.q_proj.weight", 3 * Cl));
    ops_.rope_forward(X.qkv, H, config_.rope_theta);
    ops_.attention_forward(X.attn_out, X.attn_saved, X.qkv, dims);
    const Tensor attn_branch = row_parallel_forward(A.branch_out, X.attn_out, weight(p + "attn.output_proj.weight"));
    ops_.residual_rmsnorm_forward(X.resid_mid, A.ln2_out(l), X.ln2_rstd, X.resid, attn_branch, gain(p + "ln2.weight"));
    column_parallel_forward(X.h13, A.ln2_out(l), weight_rows(p + "ffn.w1.weight", 2 * F));
    ops_.swiglu_forward(A.gated, X.h13);
    const Tensor branch = row_parallel_forward(A.branch_out, A.gated, weight(p + "ffn.w2.weight"));
    const bool last = l + 1 == L;
    need_unit(int(l + 2), last ? -1 : int(l + 3));
    const std::string next_norm = last ? "ln_final.weight" : "layers." + std::to_string(l + 1) + ".ln1.weight";
    if (last) take_head_activations();
    else take_layer_activations(l + 1);
    ops_.residual_rmsnorm_forward(last ? A.resid_final : A.layers[l + 1].resid,
                                  last ? A.lnf_out.tensor() : A.ln1_out(l + 1),
                                  last ? A.lnf_rstd : A.layers[l + 1].ln1_rstd, X.resid_mid, branch, gain(next_norm));
  }
  if (casts_per_layer()) {
    const ParamInfo& head = layout_.find("lm_head.weight");
    cast_into(head_window_, {head.offset, head.offset + head.shape.numel()});
  }
  column_parallel_forward(A.logits, A.lnf_out, weight("lm_head.weight"));
  if (has_targets_ && !tp_.active()) {
    ops_.cross_entropy_forward(losses_, A.logits, targets_);
  } else if (has_targets_) {  // the loss from every rank's share of the vocabulary
    ops_.cross_entropy_stats(A.ce_stats, A.logits, targets_, layout_.vocab_begin(), layout_.vocab_valid());
    tp_.group->all_gather(A.ce_stats_all, A.ce_stats);
    ops_.cross_entropy_combine(losses_, A.lse, A.ce_stats_all);
  }
  has_loss_ = has_targets_;
  arriving_ = nullptr;  // every range was asked for
  logits_fresh_ = true;
}

double TransformerLM::mean_loss() {
  LLMHPC_CHECK(has_loss_, "mean_loss() needs a forward pass with targets");
  const Tensor& losses = losses_.tensor();
  const int64_t n = losses.numel();
  double sum = 0;
  if (losses.dtype == DType::F64) {
    std::vector<double> h(n);
    device_.copy_to_host(h.data(), losses.data, n * sizeof(double));
    for (double v : h) sum += v;
  } else {
    std::vector<float> h(n);
    device_.copy_to_host(h.data(), losses.data, n * sizeof(float));
    for (float v : h) sum += v;
  }
  return sum / double(n);
}

std::vector<std::pair<std::string, DType>> TransformerLM::storage_dtypes() const {
  // The dtypes take_activations() and set_batch() allocate with: the activations exist only
  // from a forward to the end of its backward.
  const DType pd = param_dtype(precision_), cd = compute_dtype(precision_);
  const DType sd = pd;  // the statistics' dtype
  // What attention keeps for backward: the softmax's probabilities (naive; PyTorch's autocast
  // keeps them in fp32) or each row's logsumexp (flash).
  const DType attention_saved =
      ops_.attention_saved({1, 1, config_.num_heads, config_.head_dim(), true, attention_}, cd).dtype;
  return {{"parameters (master weights)", pd},
          // bf16: the copy, or the cast windows (the copy may be let go between steps).
          {"weights as the matrix products read them", cd},
          {"embedding output, residual stream", pd},
          {"RMSNorm output (ln1, ln2, ln_final)", cd},
          {"RMSNorm statistics (rstd)", sd},
          {"attention q, k, v projections", cd},
          {attention_ == AttentionKind::Naive ? "attention probabilities (softmax output, kept for backward)"
                                              : "attention logsumexp (kept for backward)",
           attention_saved},
          {"attention output (before output_proj)", cd},
          {"attention block output (output_proj)", cd},
          {"FFN W1 x, W3 x", cd},
          {"FFN SwiGLU product", cd},
          {"FFN block output (W2)", cd},
          {"logits (LM head output)", cd},
          {"loss", sd},
          {"parameter gradients", grad_dtype_}};
}

void TransformerLM::backward(ParallelHooks* listener, bool accumulate) {
  LLMHPC_CHECK(act_ != nullptr && has_targets_ && logits_fresh_, "backward() needs its own forward pass with targets");
  // Sharded storage accumulates where the hooks keep each unit's gradients across backward passes.
  LLMHPC_CHECK(!accumulate || !grads_.empty() || storage_ == ParameterStorage::Sharded,
               "accumulating gradients needs GradientStorage::Whole");
  logits_fresh_ = false;
  NvtxRange range("backward");
  Activations& A = *act_;
  Allocator& a = device_.allocator();
  // This rank's heads, features and rows of the residual stream (tensor parallelism).
  const int64_t B = batch_, T = seq_, N = B * T, R = stream_rows(), C = config_.d_model, Cl = C / tp_.size,
                F = config_.d_ff / tp_.size, H = config_.num_heads / tp_.size;
  const DType pd = param_dtype(precision_), cd = compute_dtype(precision_);
  A.d_resid = Buffer(a, pd, {R, C}, "gradients.resid");
  A.d_branch = Buffer(a, cd, {R, C}, "gradients.branch");
  A.d_norm = Buffer(a, cd, {N, C}, "gradients.norm_out");
  A.d_qkv = Buffer(a, cd, {B, T, 3 * Cl}, "gradients.qkv");
  A.d_attn = Buffer(a, cd, {B, T, Cl}, "gradients.attn_out");
  A.d_h13 = Buffer(a, cd, {B, T, 2 * F}, "gradients.h13");
  A.d_gated = Buffer(a, cd, {B, T, F}, "gradients.gated");
  const AttentionDims dims{B, T, H, config_.head_dim(), true, attention_};
  const bool norm_acc = norm_accumulate(accumulate);
  auto ready = [&](int64_t begin, int64_t end) {
    if (listener) listener->gradients_final(begin, end);
  };
  // The residual gradient as the next products read it: under bf16 each norm's backward also
  // writes its bf16 copy into d_branch (no conversion pass); in fp32 it is d_resid itself.
  const bool copies_dy = A.d_resid.tensor().dtype != cd;
  const Tensor dy_copy = copies_dy ? A.d_branch.tensor() : Tensor();
  const Tensor dy = copies_dy ? A.d_branch.tensor() : A.d_resid.tensor();

  // Units as forward's, asked for in reverse order; the embedding's weights are not read.
  const int L = int(config_.num_layers);
  std::fill(unit_params_.begin(), unit_params_.end(), UnitView{});
  std::fill(unit_grads_.begin(), unit_grads_.end(), UnitView{});
  // Loss -> logits -> LM head -> final norm. dlogits overwrite the logits.
  need_unit(L + 1, L);
  open_unit_gradients(L + 1, listener);
  if (!tp_.active()) ops_.cross_entropy_backward(A.logits, A.logits, targets_, loss_weight_ / double(N));
  else
    ops_.cross_entropy_backward_lse(A.logits, A.logits, targets_, A.lse, loss_weight_ / double(N),
                                    layout_.vocab_begin(), layout_.vocab_valid());
  const Tensor d_lnf = column_parallel_backward(A.d_norm, grad("lm_head.weight"), A.logits, A.lnf_out,
                                                weight("lm_head.weight"), accumulate);
  device_.fill_zero(A.d_resid.tensor().data, A.d_resid.tensor().bytes());
  ops_.rmsnorm_backward(A.d_resid, grad("ln_final.weight"), d_lnf, A.resid_final, gain("ln_final.weight"), A.lnf_rstd,
                        norm_acc, dy_copy);
  sum_norm_gradients({"ln_final.weight"});
  ready(layout_.find("ln_final.weight").offset, layout_.total());

  for (int64_t l = config_.num_layers - 1; l >= 0; --l) {
    NvtxRange layer_range("layer " + std::to_string(l));
    const std::string p = "layers." + std::to_string(l) + ".";
    Activations::Layer& X = A.layers[l];
    if (casts_per_layer()) cast_into(layer_window_, layout_.layer_range(int(l)));
    const auto range_l = layout_.layer_range(int(l));
    need_unit(int(l + 1), l > 0 ? int(l) : -1);
    open_unit_gradients(int(l + 1), listener);
    // FFN branch: d_resid is the gradient of its output. Recomputed values are bitwise
    // what forward had: the same arithmetic on the same saved inputs. W2's input gradient
    // comes first, so the SwiGLU backward can recompute the product W2's weight gradient
    // needs in the same pass over h13.
    // Under sequence parallelism the whole gradient (every token's) is gathered for each
    // branch's products, and the norms' outputs again for the weight gradients.
    const Tensor dy_ffn =
        row_parallel_backward(A.d_gated, Tensor(), dy, Tensor(), weight(p + "ffn.w2.weight"), accumulate);
    ops_.swiglu_backward(A.d_h13, A.gated, A.d_gated, X.h13);
    ops_.linear_backward(Tensor(), grad(p + "ffn.w2.weight"), dy_ffn, A.gated, weight(p + "ffn.w2.weight"), accumulate);
    if (X.ln2_out.empty()) ops_.rmsnorm_forward(A.norm_out, X.ln2_rstd, X.resid_mid, gain(p + "ln2.weight"));
    const Tensor d_ln2 = column_parallel_backward(A.d_norm, grad_rows(p + "ffn.w1.weight", 2 * F), A.d_h13,
                                                  A.ln2_out(l), weight_rows(p + "ffn.w1.weight", 2 * F), accumulate);
    ops_.rmsnorm_backward(A.d_resid, grad(p + "ln2.weight"), d_ln2, X.resid_mid, gain(p + "ln2.weight"), X.ln2_rstd,
                          norm_acc, dy_copy);
    // Attention branch.
    row_parallel_backward(A.d_attn, grad(p + "attn.output_proj.weight"), dy, X.attn_out,
                          weight(p + "attn.output_proj.weight"), accumulate);
    ops_.attention_backward(A.d_qkv, A.d_attn, X.attn_out, X.attn_saved, X.qkv, dims);
    ops_.rope_backward(A.d_qkv, H, config_.rope_theta);
    if (X.ln1_out.empty()) ops_.rmsnorm_forward(A.norm_out, X.ln1_rstd, X.resid, gain(p + "ln1.weight"));
    const Tensor d_ln1 =
        column_parallel_backward(A.d_norm, grad_rows(p + "attn.q_proj.weight", 3 * Cl), A.d_qkv, A.ln1_out(l),
                                 weight_rows(p + "attn.q_proj.weight", 3 * Cl), accumulate);
    ops_.rmsnorm_backward(A.d_resid, grad(p + "ln1.weight"), d_ln1, X.resid, gain(p + "ln1.weight"), X.ln1_rstd,
                          norm_acc, l > 0 ? dy_copy : Tensor());  // the embedding reads d_resid
    sum_norm_gradients({p + "ln2.weight", p + "ln1.weight"});
    ready(range_l.first, range_l.second);
  }
  const ParamInfo& emb = layout_.find("token_embeddings.weight");
  open_unit_gradients(0, listener);
  if (!tp_.active()) {
    ops_.embedding_backward(grad(emb.name), A.d_resid, tokens_, accumulate);
  } else {  // each rank's rows of the vocabulary from every token's gradient
    Buffer whole;
    if (tp_.sequence_parallel) {
      whole = Buffer(a, pd, {N, C}, "gradients.embedding");
      tp_.group->all_gather(whole, A.d_resid);
    }
    ops_.embedding_backward(grad(emb.name), tp_.sequence_parallel ? whole.tensor() : A.d_resid.tensor(), tokens_,
                            accumulate, layout_.vocab_begin());
  }
  ready(emb.offset, emb.offset + emb.shape.numel());
  // Every kernel that reads the activations or the scratch is enqueued: they go back to the
  // allocator, and the next forward takes them again (on a GPU from the caching allocator,
  // whose blocks are reused in the compute stream's order: whatever is enqueued on them next
  // runs after these kernels). Nothing on another stream touches them: the gradient and
  // parameter collectives (src/dist) read and write the persistent gradients and parameters.
  act_.reset();
}

}  // namespace llmhpc

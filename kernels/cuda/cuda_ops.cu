// CudaOps (see cuda_ops.h): the same shape checks as the CPU backend, then GEMMs on cuBLAS
// and launches of the kernels in kernels.h. Naive attention is batched GEMMs around a
// softmax kernel, with NVTX ranges "scores", "softmax" and "value_matmul".
#include "kernels/cuda/cuda_ops.h"

#include "kernels/cuda/cuda_check.h"

#include <cmath>

#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/kernels.h"
#include "src/core/nvtx.h"

namespace llmhpc {
namespace {

void expect(bool ok, const char* op, const std::string& what) { LLMHPC_CHECK(ok, std::string(op) + ": " + what); }

// Element `offset` of a tensor, as a raw pointer (for sub-matrices handed to cuBLAS).
const void* at(const Tensor& t, int64_t offset) {
  return static_cast<const char*>(t.data) + offset * int64_t(dtype_size(t.dtype));
}

// FlashAttention-2 (kernels/cuda/flash_attn/): out (B,T,H*D) and the logsumexp L (B,H,T) fp32
// from qkv (B,T,3,H,D); the backward's scratch D = rowsum(dout * out) comes from the device allocator.
void check_flash(const char* op, const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionDims& d) {
  expect(out.numel() == d.batch * d.seq * d.heads * d.head_dim && qkv.numel() == 3 * out.numel() &&
             lse.numel() == d.batch * d.heads * d.seq,
         op, "shapes");
  if (lse.dtype != DType::F32 || out.dtype != qkv.dtype)
    throw UsageError(std::string(op) + ": flash needs the logsumexp in fp32 and out in qkv's dtype");
}

flash::FlashParams flash_params(const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionDims& d) {
  return flash::packed_params(qkv.dtype, qkv.data, out.data, lse.ptr<float>(), d.batch, d.seq, d.heads, d.head_dim,
                              d.causal);
}

}  // namespace

CudaOps::CudaOps(CudaDevice& device, const BackendOptions& options)
    : device_(device), stream_(device.stream()),
      gemm_(device.stream(), device.allocator(), options.tf32, options.gemm_sm_margin, options.gemm_autotune) {}

void CudaOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin) {
  const int64_t C = wte.dim(-1), N = tokens.numel();
  expect(out.numel() == N * C && tokens.dtype == DType::I32, "embedding_forward", "shapes");
  cuda::embedding_forward(out, tokens, wte, N, C, vocab_begin, stream_);
}

void CudaOps::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate, int64_t vocab_begin) {
  const int64_t C = dwte.dim(-1), N = tokens.numel();
  expect(dout.numel() == N * C && tokens.dtype == DType::I32, "embedding_backward", "shapes");
  if (!accumulate) CUDA_CHECK(cudaMemsetAsync(dwte.data, 0, dwte.bytes(), stream_));
  cuda::embedding_backward(dwte, dout, tokens, N, C, vocab_begin, device_.allocator(), stream_);
}

void CudaOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w) {
  const int64_t C = w.numel(), N = x.numel() / C;
  expect(out.numel() == x.numel() && rstd.numel() == N, "rmsnorm_forward", "shapes");
  cuda::rmsnorm_forward(Tensor(), out, rstd, x, Tensor(), w, N, C, stream_);
}

void CudaOps::residual_rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w) {
  const int64_t C = w.numel(), N = x.numel() / C;
  expect(x_out.numel() == x.numel() && delta.numel() == x.numel() && out.numel() == x.numel() && rstd.numel() == N,
         "residual_rmsnorm_forward", "shapes");
  cuda::rmsnorm_forward(x_out, out, rstd, x, delta, w, N, C, stream_);
}

void CudaOps::rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                               Tensor dx_copy) {
  const int64_t C = w.numel(), N = x.numel() / C;
  expect(dx.numel() == x.numel() && dout.numel() == x.numel() && dw.numel() == C && rstd.numel() == N &&
             (dx_copy.empty() || dx_copy.numel() == x.numel()),
         "rmsnorm_backward", "shapes");
  cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, dx_copy, N, C, accumulate, device_.multiprocessors(),
                         device_.allocator(), stream_);
}

// y (N,out) = x (N,in) W^T with W (out,in).
void CudaOps::linear_forward(Tensor y, Tensor x, Tensor w) {
  const int64_t out_f = w.dim(0), in_f = w.dim(1), N = x.numel() / in_f;
  expect(x.numel() == N * in_f && y.numel() == N * out_f, "linear_forward", "shapes");
  gemm_.run(false, true, N, out_f, in_f, 1.f, {x.data, x.dtype, in_f}, {w.data, w.dtype, in_f}, 0.f,
            {y.data, y.dtype, out_f});
}

// dx (N,in) = dy W; dw (out,in) = (or +=) dy^T x; either may be empty (skipped).
void CudaOps::linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) {
  const int64_t out_f = w.dim(0), in_f = w.dim(1), N = dy.numel() / out_f;
  expect(dy.numel() == N * out_f && (dx.empty() || dx.numel() == N * in_f) &&
             (dw.empty() || (dw.numel() == w.numel() && x.numel() == N * in_f)),
         "linear_backward", "shapes");
  if (!dx.empty())
    gemm_.run(false, false, N, in_f, out_f, 1.f, {dy.data, dy.dtype, out_f}, {w.data, w.dtype, in_f}, 0.f,
              {dx.data, dx.dtype, in_f});
  if (!dw.empty())
    gemm_.run(true, false, out_f, in_f, N, 1.f, {dy.data, dy.dtype, out_f}, {x.data, x.dtype, in_f},
              accumulate ? 1.f : 0.f, {dw.data, dw.dtype, in_f});
}

void CudaOps::rope_forward(Tensor qkv, int64_t heads, double theta) { rope(qkv, heads, theta, +1.0); }
void CudaOps::rope_backward(Tensor dqkv, int64_t heads, double theta) { rope(dqkv, heads, theta, -1.0); }

void CudaOps::rope(Tensor qkv, int64_t heads, double theta, double sign) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.numel() / (B * T * 3 * heads);
  expect(qkv.numel() == B * T * 3 * heads * D && D % 2 == 0, "rope", "qkv must be (B,T,3,H,D) with D even");
  if (T > rope_positions_ || D != rope_head_dim_ || theta != rope_theta_) {
    rope_positions_ = 0;     // stays "no table" if the allocation below runs out of memory
    rope_table_ = Buffer();  // free the old table first
    rope_table_ = Buffer(device_.allocator(), DType::F32, {T, D}, "rope.table");
    cuda::rope_table(rope_table_, T, D, theta, stream_);
    rope_positions_ = T;
    rope_head_dim_ = D;
    rope_theta_ = theta;
  }
  cuda::rope(qkv, rope_table_, B, T, heads, D, sign, stream_);
}

SavedSpec CudaOps::attention_saved(const AttentionDims& d, DType compute) const {
  if (d.kind == AttentionKind::Flash) return {Shape{d.batch, d.heads, d.seq}, DType::F32};  // logsumexp
  return {Shape{d.batch, d.heads, d.seq, d.seq}, compute};
}

// Per batch element b, the H heads are one strided batch: head h of q starts h*D into the
// (T, 3HD) rows of qkv, so consecutive heads are D elements apart.
void CudaOps::attention_forward(Tensor out, Tensor saved, Tensor qkv, const AttentionDims& d) {
  if (d.kind == AttentionKind::Flash) {
    check_flash("attention_forward", out, saved, qkv, d);
    NvtxRange range("flash_attention");
    flash::flash_attention_forward(flash_params(out, saved, qkv, d), stream_);
    return;
  }
  const int64_t B = d.batch, T = d.seq, H = d.heads, D = d.head_dim, row = 3 * H * D;
  expect(out.numel() == B * T * H * D && qkv.numel() == 3 * out.numel() && saved.numel() == B * H * T * T,
         "attention_forward", "shapes");
  if (saved.dtype != qkv.dtype || out.dtype != qkv.dtype)
    throw UsageError("attention_forward: out, saved probabilities and qkv must share a dtype on the CUDA backend");
  const DType cd = qkv.dtype;
  const float scale = float(1.0 / std::sqrt(double(D)));
  {
    NvtxRange range("scores");  // S = Q K^T / sqrt(D), (T,T) per head
    for (int64_t b = 0; b < B; ++b)
      gemm_.run(false, true, T, T, D, scale, {at(qkv, b * T * row), cd, row, D},
                {at(qkv, b * T * row + H * D), cd, row, D}, 0.f, {at(saved, b * H * T * T), cd, T, T * T}, H);
  }
  {
    NvtxRange range("softmax");
    cuda::attention_softmax_forward(saved, B * H * T, T, d.causal, stream_);
  }
  {
    NvtxRange range("value_matmul");  // O = P V, written head by head into (T, HD) rows
    for (int64_t b = 0; b < B; ++b)
      gemm_.run(false, false, T, D, T, 1.f, {at(saved, b * H * T * T), cd, T, T * T},
                {at(qkv, b * T * row + 2 * H * D), cd, row, D}, 0.f, {at(out, b * T * H * D), cd, H * D, D}, H);
  }
}

// dP = dO V^T, dV = P^T dO, dS = P (dP - rowsum(dP P)), dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D).
// One batch element at a time, so dP needs (H,T,T) of scratch rather than (B,H,T,T).
void CudaOps::attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor saved, Tensor qkv,
                                 const AttentionDims& d) {
  if (d.kind == AttentionKind::Flash) {
    check_flash("attention_backward", out, saved, qkv, d);
    expect(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention_backward", "shapes");
    if (dout.dtype != qkv.dtype || dqkv.dtype != qkv.dtype)
      throw UsageError("attention_backward: flash needs dout, dqkv and qkv in one dtype");
    NvtxRange range("flash_attention_backward");
    flash::FlashParams p = flash_params(out, saved, qkv, d);
    Buffer scratch(device_.allocator(), DType::F32, {int64_t(flash::flash_backward_scratch_bytes(p) / sizeof(float))},
                   "attention.flash_scratch");
    flash::set_packed_backward(p, dout.data, dqkv.data, scratch.tensor().ptr<float>());
    flash::flash_attention_backward(p, stream_);
    return;
  }
  const int64_t B = d.batch, T = d.seq, H = d.heads, D = d.head_dim, row = 3 * H * D;
  expect(dout.numel() == B * T * H * D && qkv.numel() == 3 * dout.numel() && dqkv.numel() == qkv.numel() &&
             saved.numel() == B * H * T * T,
         "attention_backward", "shapes");
  const DType cd = qkv.dtype;
  if (saved.dtype != cd || dout.dtype != cd || dqkv.dtype != cd)
    throw UsageError(
        "attention_backward: dqkv, dout, saved probabilities and qkv must share a dtype on the CUDA backend");
  const float scale = float(1.0 / std::sqrt(double(D)));
  Buffer dprobs(device_.allocator(), cd, {H, T, T}, "attention.dprobs");
  const Tensor dP = dprobs.tensor();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = b * T * row, k = q + H * D, v = q + 2 * H * D, o = b * T * H * D, p = b * H * T * T;
    {
      NvtxRange range("value_matmul");
      gemm_.run(false, true, T, T, D, 1.f, {at(dout, o), cd, H * D, D}, {at(qkv, v), cd, row, D}, 0.f,
                {dP.data, cd, T, T * T}, H);
      gemm_.run(true, false, T, D, T, 1.f, {at(saved, p), cd, T, T * T}, {at(dout, o), cd, H * D, D}, 0.f,
                {at(dqkv, v), cd, row, D}, H);
    }
    {
      NvtxRange range("softmax");
      cuda::attention_softmax_backward(dP, saved.slice(p, {H * T, T}), H * T, T, d.causal, stream_);
    }
    {
      NvtxRange range("scores");
      gemm_.run(false, false, T, D, T, scale, {dP.data, cd, T, T * T}, {at(qkv, k), cd, row, D}, 0.f,
                {at(dqkv, q), cd, row, D}, H);
      gemm_.run(true, false, T, D, T, scale, {dP.data, cd, T, T * T}, {at(qkv, q), cd, row, D}, 0.f,
                {at(dqkv, k), cd, row, D}, H);
    }
  }
}

void CudaOps::swiglu_forward(Tensor out, Tensor h) {
  const int64_t F = out.dim(-1), N = out.numel() / F;
  expect(h.numel() == 2 * N * F, "swiglu_forward", "shapes");
  cuda::swiglu_forward(out, h, N, F, stream_);
}

void CudaOps::swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h) {
  const int64_t F = dout.dim(-1), N = dout.numel() / F;
  expect(h.numel() == 2 * N * F && dh.numel() == h.numel() && (out.empty() || out.numel() == N * F), "swiglu_backward",
         "shapes");
  cuda::swiglu_backward(dh, out, dout, h, N, F, stream_);
}

void CudaOps::cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  expect(losses.numel() == N && targets.numel() == N && targets.dtype == DType::I32, "cross_entropy_forward", "shapes");
  cuda::cross_entropy_forward(losses, logits, targets, N, V, stream_);
}

void CudaOps::cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  expect(dlogits.numel() == logits.numel() && targets.numel() == N && targets.dtype == DType::I32,
         "cross_entropy_backward", "shapes");
  cuda::cross_entropy_backward(dlogits, logits, targets, scale, N, V, stream_);
}

void CudaOps::cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_begin,
                                  int64_t vocab_valid) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  expect(stats.numel() == 3 * N && targets.numel() == N && targets.dtype == DType::I32 && vocab_valid >= 0 &&
             vocab_valid <= V,
         "cross_entropy_stats", "shapes");
  cuda::cross_entropy_stats(stats, logits, targets, N, V, vocab_begin, vocab_valid, stream_);
}

void CudaOps::cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats) {
  const int64_t N = losses.numel(), R = N > 0 ? stats.numel() / (3 * N) : 0;
  expect(lse.numel() == N && (N == 0 || (R >= 1 && stats.numel() == 3 * N * R)), "cross_entropy_combine", "shapes");
  cuda::cross_entropy_combine(losses, lse, stats, N, R, stream_);
}

void CudaOps::cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale,
                                         int64_t vocab_begin, int64_t vocab_valid) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  expect(dlogits.numel() == logits.numel() && targets.numel() == N && targets.dtype == DType::I32 && lse.numel() == N &&
             vocab_valid >= 0 && vocab_valid <= V,
         "cross_entropy_backward_lse", "shapes");
  cuda::cross_entropy_backward_lse(dlogits, logits, targets, lse, scale, N, V, vocab_begin, vocab_valid, stream_);
}

void CudaOps::adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp,
                         const std::vector<AdamWSlice>& slices, const AdamWHyper& h, int64_t step) {
  check_adamw_slices(param, grad, m, v, param_lowp, slices);
  cuda::adamw_step(param, grad, m, v, param_lowp, slices, h, step, stream_);
}

void CudaOps::sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) {
  check_sum_of_squares(out, x, spans);
  cuda::sum_of_squares(out, x, spans, device_.allocator(), stream_);
}

void CudaOps::convert(Tensor dst, Tensor src) {
  expect(dst.numel() == src.numel(), "convert", "element counts differ");
  cuda::convert(dst, src, stream_);
}

void CudaOps::scale(Tensor x, double factor) { cuda::scale(x, factor, stream_); }

void CudaOps::random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound) {
  cuda::random_normal(dst, seed, stream, std, bound, stream_);
}

void CudaOps::accumulation_experiment(Tensor out, double value, int64_t n) {
  expect(out.numel() == 4 && out.dtype == DType::F32, "accumulation_experiment", "out must be 4 fp32");
  cuda::accumulation_experiment(out.ptr<float>(), value, n, stream_);
}

// Flash: flash::flash_variant of the params attention_forward/backward build, with the
// process's settings (LLMHPC_FLASH_*). The choice reads the tensors' addresses only for their
// alignment: placeholders aligned like the device allocator's buffers (cudaMalloc's 256 bytes)
// stand for them. The forward's and the backward's kernel family are the same for these packed
// tensors (aligned alike), so it is recorded once; their head dims differ where the fused
// backward runs in a wider kernel (80 in 96).
std::vector<std::pair<std::string, std::string>> CudaOps::attention_variant(const AttentionDims& d,
                                                                            DType compute) const {
  if (d.kind != AttentionKind::Flash) return {{"attention_kernel", "naive (cuBLAS + softmax kernel)"}};
  void* const aligned = reinterpret_cast<void*>(256);
  flash::FlashParams p = flash::packed_params(compute, aligned, aligned, static_cast<float*>(aligned), d.batch, d.seq,
                                              d.heads, d.head_dim, d.causal);
  flash::set_packed_backward(p, aligned, aligned, aligned);
  const flash::FlashVariant v = flash::flash_variant(p);
  auto chunk = [](int tiles) { return tiles ? std::to_string(tiles) : std::string("off"); };
  const char* dq = v.dq_sum == flash::DqSum::Atomic ? "atomic" : v.dq_sum == flash::DqSum::Ordered ? "ordered" : "none";
  return {
      {"attention_kernel", "flash"},
      {"flash_impl", flash::flash_impl_name(v.fwd.impl)},
      {"flash_head_dim", std::to_string(v.fwd.head_dim)},
      {"flash_fwd_rows", std::to_string(v.fwd.rows)},
      {"flash_fwd_streamed", std::to_string(v.fwd.streamed)},
      {"flash_bwd", v.dq_sum == flash::DqSum::None ? "split" : "fused"},
      {"flash_bwd_head_dim", std::to_string(v.bwd.head_dim)},
      {"flash_bwd_rows", std::to_string(v.bwd.rows)},
      {"flash_bwd_streamed", std::to_string(v.bwd.streamed)},
      {"flash_bwd_chunks", v.kv_chunk || v.q_chunk ? "dkdv " + chunk(v.kv_chunk) + ", dq " + chunk(v.q_chunk) : "off"},
      {"flash_dq", dq}};
}

}  // namespace llmhpc

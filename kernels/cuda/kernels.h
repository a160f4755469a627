// Launchers of the CUDA backend's own kernels (everything that is not a cuBLAS GEMM).
// Each enqueues on `stream`, dispatches on the tensors' dtypes (fp32 or bf16 storage,
// fp32 arithmetic) and checks the launch. CudaOps checks shapes before calling them;
// shapes below use N rows, C channels, F = d_ff, V = vocabulary, T = sequence.
#pragma once
#include <cuda_runtime.h>

#include "kernels/ops.h"

namespace llmhpc::cuda {

// out (N,C) = wte[tokens - vocab_begin]; tokens (N) int32, wte (V,C) the rows [vocab_begin,
// vocab_begin + V) of the table; a token outside them gets a row of zeros.
void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t N, int64_t C, int64_t vocab_begin,
                       cudaStream_t stream);
// dwte (V,C) fp32 or bf16 += rows of dout (N,C) at tokens - vocab_begin, tokens outside [vocab_begin,
// vocab_begin + V) skipped; deterministic (sorted by token).
void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t N, int64_t C, int64_t vocab_begin,
                        Allocator& scratch, cudaStream_t stream);

// out (N,C), rstd (N) fp32 = rmsnorm(x_out), with x_out = x + delta when delta is not
// empty (written to x_out), else x_out = x (x_out unused). w (C) fp32.
void rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w, int64_t N, int64_t C,
                     cudaStream_t stream);
// dx (N,C) += input gradient; dw (C) fp32 or bf16 += weight gradient; dout, x (N,C); rstd (N) fp32;
// dx_copy (N,C) bf16, if not empty, receives the new dx rounded to nearest even.
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, Tensor dx_copy, int64_t N,
                      int64_t C, bool accumulate, int multiprocessors, Allocator& scratch, cudaStream_t stream);

// RoPE angles: table (T, D/2) fp32 (cos, sin) pairs, i.e. at least T * D floats.
void rope_table(Tensor table, int64_t T, int64_t D, double theta, cudaStream_t stream);
// RoPE in place on the q and k parts of qkv (B,T,3,H,D) with a table for at least T
// positions; sign -1 applies the inverse rotation.
void rope(Tensor qkv, Tensor table, int64_t B, int64_t T, int64_t H, int64_t D, double sign, cudaStream_t stream);

// out (N,F) = silu(h[:, :F]) * h[:, F:]; dh (N,2F) from dout (N,F) and h (N,2F), and the
// forward's out again (bitwise) unless that tensor is empty.
void swiglu_forward(Tensor out, Tensor h, int64_t N, int64_t F, cudaStream_t stream);
void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h, int64_t N, int64_t F, cudaStream_t stream);

// Attention rows: `rows` rows of length T, row r is query position r % T of its (b, h).
// Forward: scores -> probabilities in place (causal: key j > query i gets 0).
void attention_softmax_forward(Tensor probs, int64_t rows, int64_t T, bool causal, cudaStream_t stream);
// Backward: dprobs -> dscores in place, dS = P (dP - rowsum(dP P)); probs as saved.
void attention_softmax_backward(Tensor dscores, Tensor probs, int64_t rows, int64_t T, bool causal,
                                cudaStream_t stream);

// losses (N) fp32 = logsumexp(logits[n]) - logits[n, targets[n]]; logits (N,V).
void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets, int64_t N, int64_t V, cudaStream_t stream);
// dlogits (N,V) = (softmax(logits) - onehot(targets)) * scale; may alias logits.
void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale, int64_t N, int64_t V,
                            cudaStream_t stream);
// The vocabulary-parallel cross-entropy (Ops::cross_entropy_stats, _combine, _backward_lse):
// logits (N,V) hold the vocabulary columns [vocab_begin, vocab_begin + V), the first `valid` real.
// stats (N,3) fp32 = max, sum of exp(x - max) over the real columns, the target's logit or 0.
void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t N, int64_t V, int64_t vocab_begin,
                         int64_t valid, cudaStream_t stream);
// losses (N), lse (N) fp32 from stats (R,N,3) fp32, the ranks' stats stacked.
void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats, int64_t N, int64_t R, cudaStream_t stream);
// dlogits (N,V) = (exp(logits - lse) - onehot(targets - vocab_begin)) * scale on the real
// columns, 0 on the padding; lse (N) fp32; may alias logits.
void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale, int64_t N,
                                int64_t V, int64_t vocab_begin, int64_t valid, cudaStream_t stream);

// One fused AdamW pass over slices of fp32 param, grad (fp32 or bf16), m, v; param_lowp (bf16) if not empty.
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp, const std::vector<AdamWSlice>& slices,
                const AdamWHyper& h, int64_t step, cudaStream_t stream);

// out (1, fp64) = sum of x^2 over the spans of x (fp32 or fp64), in a fixed order
// (Ops::sum_of_squares); its partial sums in a block of `scratch`.
void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans, Allocator& scratch, cudaStream_t stream);

// dst = src elementwise (fp32 <-> bf16, or a copy); x *= factor.
void convert(Tensor dst, Tensor src, cudaStream_t stream);
void scale(Tensor x, double factor, cudaStream_t stream);
// Ops::random_normal.
void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound, cudaStream_t cuda_stream);

// The accumulation experiment (Ops::accumulation_experiment): one thread, the device's own
// fp16 and bf16 conversions; out (4) fp32.
void accumulation_experiment(float* out, double value, int64_t n, cudaStream_t stream);

}  // namespace llmhpc::cuda

// The CUDA Ops: shape checks, cuBLAS GEMMs and the launches of the kernels in kernels.h,
// all ordered on the device's compute stream.
#pragma once
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"

namespace llmhpc {

class CudaOps final : public Ops {
 public:
  CudaOps(CudaDevice& device, const BackendOptions& options);

  using Ops::embedding_backward;
  using Ops::embedding_forward;
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin) override;
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate, int64_t vocab_begin) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w) override;
  void residual_rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w) override;
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                        Tensor dx_copy) override;
  void linear_forward(Tensor y, Tensor x, Tensor w) override;
  void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) override;
  void rope_forward(Tensor qkv, int64_t heads, double theta) override;
  void rope_backward(Tensor dqkv, int64_t heads, double theta) override;
  SavedSpec attention_saved(const AttentionDims& d, DType compute) const override;
  void attention_forward(Tensor out, Tensor saved, Tensor qkv, const AttentionDims& d) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor saved, Tensor qkv,
                          const AttentionDims& d) override;
  void swiglu_forward(Tensor out, Tensor h) override;
  void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h) override;
  void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) override;
  void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale) override;
  void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_begin,
                           int64_t vocab_valid) override;
  void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats) override;
  void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale,
                                  int64_t vocab_begin, int64_t vocab_valid) override;
  using Ops::adamw_step;
  void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp,
                  const std::vector<AdamWSlice>& slices, const AdamWHyper& h, int64_t step) override;
  void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) override;
  void convert(Tensor dst, Tensor src) override;
  void scale(Tensor x, double factor) override;
  void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound) override;
  void accumulation_experiment(Tensor out, double value, int64_t n) override;
  std::vector<std::pair<std::string, std::string>> attention_variant(const AttentionDims& d,
                                                                     DType compute) const override;

 private:
  void rope(Tensor qkv, int64_t heads, double theta, double sign);

  CudaDevice& device_;
  cudaStream_t stream_;
  cuda::Gemm gemm_;
  // RoPE angles for positions [0, rope_positions_) at head size rope_head_dim_ and base
  // rope_theta_, kept between calls (every layer, forward and backward, uses the same).
  Buffer rope_table_;
  int64_t rope_positions_ = 0, rope_head_dim_ = 0;
  double rope_theta_ = 0;
};

}  // namespace llmhpc

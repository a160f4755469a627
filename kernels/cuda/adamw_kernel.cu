// The fused AdamW step: one pass over the flat parameters (read p, g, m, v; write p, m, v
// and the bf16 copy), so its time is bounded by bytes over memory bandwidth.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

// Per-step constants, computed in double on the host and rounded to fp32 exactly as the
// CPU reference (kernels/cpu/cpu_kernels.h, adamw_step) does.
struct AdamWConstants {
  float decay, step_size, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps;
};

// torch.optim.AdamW's order of operations, as the CPU reference writes it. The explicit
// round-to-nearest intrinsics stop the compiler from contracting into FMAs, so every code
// path (vector or scalar, any shard boundary) gives bitwise the same result, and it matches
// the CPU backend's fp32 arithmetic.
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWConstants& k) {
  p = __fmul_rn(p, k.decay);
  m = __fadd_rn(m, __fmul_rn(k.one_minus_beta1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps);
  p = __fsub_rn(p, __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
}

// Purpose: AdamW over n elements, writing the bf16 copy too when kLowp.
// Algorithm: grid-stride loop over groups of kPack elements with vector loads and stores
// (16 bytes per fp32 array); the last n % kPack elements one per thread.
// Shapes: p, g, m, v (n) fp32; lowp (n) bf16.
template <int kPack, bool kLowp>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* lowp, AdamWConstants k, int64_t n) {
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t group = first; group < n / kPack; group += stride) {
    const int64_t i = group * kPack;
    Pack<float, kPack> pp = load_pack<kPack>(p + i), mm = load_pack<kPack>(m + i), vv = load_pack<kPack>(v + i);
    const Pack<float, kPack> gg = load_pack<kPack>(g + i);
#pragma unroll
    for (int e = 0; e < kPack; ++e) adamw_update(pp.v[e], gg.v[e], mm.v[e], vv.v[e], k);
    store_pack<kPack>(p + i, pp);
    store_pack<kPack>(m + i, mm);
    store_pack<kPack>(v + i, vv);
    if constexpr (kLowp) {
      Pack<bf16, kPack> lo;
#pragma unroll
      for (int e = 0; e < kPack; ++e) lo.v[e] = __float2bfloat16_rn(pp.v[e]);
      store_pack<kPack>(lowp + i, lo);
    }
  }
  const int64_t i = n / kPack * kPack + first;
  if (i < n) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_update(pi, g[i], mi, vi, k);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kLowp) lowp[i] = __float2bfloat16_rn(pi);
  }
}

template <int kPack, bool kLowp>
void launch(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lowp, const AdamWConstants& k, cudaStream_t stream) {
  const int64_t n = p.numel();
  adamw_kernel<kPack, kLowp><<<blocks_for(n / kPack + 1, 256), 256, 0, stream>>>(
      p.ptr<float>(), g.ptr<float>(), m.ptr<float>(), v.ptr<float>(), kLowp ? lowp.ptr<bf16>() : nullptr, k, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lowp, const AdamWHyper& h, int64_t step,
                cudaStream_t stream) {
  for (const Tensor* t : {&p, &g, &m, &v}) require_dtype("adamw_step", *t, DType::F32, "param, grad, m and v");
  if (p.numel() == 0) return;
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, double(step)));
  const AdamWConstants k{float(1.0 - h.lr * h.weight_decay),
                         float(h.lr / bc1),
                         float(1.0 - h.beta1),
                         float(h.beta2),
                         float(1.0 - h.beta2),
                         float(bc2_sqrt),
                         float(h.eps)};
  const bool fused_lowp = !lowp.empty() && lowp.dtype == DType::BF16;
  const bool vector = aligned_to(16, {p.data, g.data, m.data, v.data}) && (!fused_lowp || aligned_to(8, {lowp.data}));
  if (vector && fused_lowp) launch<4, true>(p, g, m, v, lowp, k, stream);
  else if (vector) launch<4, false>(p, g, m, v, lowp, k, stream);
  else if (fused_lowp) launch<1, true>(p, g, m, v, lowp, k, stream);
  else launch<1, false>(p, g, m, v, lowp, k, stream);
  if (!lowp.empty() && !fused_lowp) convert(lowp, p, stream);
}

}  // namespace llmhpc::cuda

// The fused AdamW step: one pass over the flat parameters (read p, g, m, v; write p, m, v
// and the bf16 copy), so its time is bounded by bytes over memory bandwidth. The gradients
// are fp32, or bf16 (--grad-dtype bf16), widened as they are read.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

// Per-step constants, computed in double on the host and rounded to fp32 exactly as the
// CPU reference (kernels/cpu/cpu_kernels.h, adamw_step) does.
struct AdamWConstants {
  float decay, step_size, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps, grad_scale;
};

// torch.optim.AdamW's order of operations, as the CPU reference writes it. The explicit
// round-to-nearest intrinsics stop the compiler from contracting into FMAs, so every code
// path (vector or scalar, any shard boundary) gives bitwise the same result, and it matches
// the CPU backend's fp32 arithmetic.
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWConstants& k) {
  g = __fmul_rn(g, k.grad_scale);  // clipping's factor (1: none), as the CPU reference applies it
  p = __fmul_rn(p, k.decay);
  m = __fadd_rn(m, __fmul_rn(k.one_minus_beta1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps);
  p = __fsub_rn(p, __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
}

// Up to kMaxSlices slices of one launch, passed by value (kernel parameter space): where each
// starts in p, g and lowp and in m and v, and the packs before each one ends.
constexpr int kMaxSlices = 16;
struct SliceTable {
  int64_t at[kMaxSlices], state_at[kMaxSlices], size[kMaxSlices], packs_end[kMaxSlices];
  int count = 0;
};

// Purpose: AdamW over the slices of a SliceTable, writing the bf16 copy too when kLowp.
// Algorithm: grid-stride loop over the packs of kPack elements of all slices together (one
// launch however many slices: a sharded optimizer's slices of every bucket are small), vector
// loads and stores (16 bytes per fp32 array) for whole packs; a slice's last, partial pack
// element by element. A thread's packs only increase, so it finds each one's slice by moving a
// cursor forward.
// Shapes: p, g, lowp and m, v flat; slices inside them, starts multiples of kPack.
template <class G, int kPack, bool kLowp>
__global__ void adamw_kernel(float* p, const G* g, float* m, float* v, bf16* lowp, AdamWConstants k, SliceTable t) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int s = 0;
  for (int64_t pack = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; pack < t.packs_end[t.count - 1]; pack += stride) {
    while (pack >= t.packs_end[s]) ++s;
    const int64_t first = (pack - (s == 0 ? 0 : t.packs_end[s - 1])) * kPack;
    const int64_t i = t.at[s] + first, j = t.state_at[s] + first;
    if (first + kPack <= t.size[s]) {
      Pack<float, kPack> pp = load_pack<kPack>(p + i), mm = load_pack<kPack>(m + j), vv = load_pack<kPack>(v + j);
      const Pack<G, kPack> gg = load_pack<kPack>(g + i);
#pragma unroll
      for (int e = 0; e < kPack; ++e) adamw_update(pp.v[e], to_float(gg.v[e]), mm.v[e], vv.v[e], k);
      store_pack<kPack>(p + i, pp);
      store_pack<kPack>(m + j, mm);
      store_pack<kPack>(v + j, vv);
      if constexpr (kLowp) {
        Pack<bf16, kPack> lo;
#pragma unroll
        for (int e = 0; e < kPack; ++e) lo.v[e] = __float2bfloat16_rn(pp.v[e]);
        store_pack<kPack>(lowp + i, lo);
      }
    } else {
      for (int64_t e = 0; e < t.size[s] - first; ++e) {
        float pi = p[i + e], mi = m[j + e], vi = v[j + e];
        adamw_update(pi, to_float(g[i + e]), mi, vi, k);
        p[i + e] = pi;
        m[j + e] = mi;
        v[j + e] = vi;
        if constexpr (kLowp) lowp[i + e] = __float2bfloat16_rn(pi);
      }
    }
  }
}

template <class G, int kPack, bool kLowp>
void launch(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lowp, const SliceTable& t, const AdamWConstants& k,
            cudaStream_t stream) {
  adamw_kernel<G, kPack, kLowp><<<blocks_for(t.packs_end[t.count - 1], 256), 256, 0, stream>>>(
      p.ptr<float>(), g.ptr<G>(), m.ptr<float>(), v.ptr<float>(), kLowp ? lowp.ptr<bf16>() : nullptr, k, t);
  CUDA_CHECK_LAUNCH();
}

// The launches of one kPack: kMaxSlices non-empty slices at a time.
template <class G, int kPack, bool kLowp>
void launch_all(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lowp, const std::vector<AdamWSlice>& slices,
                const AdamWConstants& k, cudaStream_t stream) {
  SliceTable t;
  int64_t packs = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const AdamWSlice& s = slices[i];
    if (s.size > 0) {
      t.at[t.count] = s.at;
      t.state_at[t.count] = s.state_at;
      t.size[t.count] = s.size;
      packs += (s.size + kPack - 1) / kPack;
      t.packs_end[t.count++] = packs;
    }
    if (t.count > 0 && (t.count == kMaxSlices || i + 1 == slices.size())) {
      launch<G, kPack, kLowp>(p, g, m, v, lowp, t, k, stream);
      t.count = 0;
      packs = 0;
    }
  }
}

}  // namespace

void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lowp, const std::vector<AdamWSlice>& slices,
                const AdamWHyper& h, int64_t step, cudaStream_t stream) {
  for (const Tensor* t : {&p, &m, &v}) require_dtype("adamw_step", *t, DType::F32, "param, m and v");
  if (g.dtype != DType::BF16) require_dtype("adamw_step", g, DType::F32, "grad (or bf16)");
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, double(step)));
  const AdamWConstants k{float(1.0 - h.lr * h.weight_decay),
                         float(h.lr / bc1),
                         float(1.0 - h.beta1),
                         float(h.beta2),
                         float(1.0 - h.beta2),
                         float(bc2_sqrt),
                         float(h.eps),
                         float(h.grad_scale)};
  const bool fused_lowp = !lowp.empty() && lowp.dtype == DType::BF16;
  bool vector = aligned_to(16, {p.data, g.data, m.data, v.data}) && (!fused_lowp || aligned_to(8, {lowp.data}));
  for (const AdamWSlice& s : slices) vector = vector && s.at % 4 == 0 && s.state_at % 4 == 0;
  dispatch_float("adamw_step", g.dtype, [&](auto gt) {
    using G = decltype(gt);
    if (vector && fused_lowp) launch_all<G, 4, true>(p, g, m, v, lowp, slices, k, stream);
    else if (vector) launch_all<G, 4, false>(p, g, m, v, lowp, slices, k, stream);
    else if (fused_lowp) launch_all<G, 1, true>(p, g, m, v, lowp, slices, k, stream);
    else launch_all<G, 1, false>(p, g, m, v, lowp, slices, k, stream);
  });
  if (!lowp.empty() && !fused_lowp)
    for (const AdamWSlice& s : slices) convert(lowp.slice(s.at, {s.size}), p.slice(s.at, {s.size}), stream);
}

}  // namespace llmhpc::cuda

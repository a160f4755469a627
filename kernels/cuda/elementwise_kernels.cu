// Elementwise kernels: embedding lookup, RoPE, SwiGLU, dtype conversion, scaling and
// counter-based normal values. All but the last are memory-bound: each moves its tensors
// once, with vector accesses where the shapes and pointers allow.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "src/core/random.h"

namespace llmhpc::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t grid_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// ---- embedding -------------------------------------------------------------------------------
// out (N,C) = wte (V,C) [tokens (N) - vocab_begin], zeros for a token outside [vocab_begin,
// vocab_begin + V); one thread per output element.
template <class O, class W>
__global__ void embedding_forward_kernel(O* out, const int32_t* tokens, const W* wte, int64_t N, int64_t V, int64_t C,
                                         int64_t vocab_begin) {
  for (int64_t i = grid_index(); i < N * C; i += grid_stride()) {
    const int64_t n = i / C, c = i % C, row = int64_t(tokens[n]) - vocab_begin;
    out[i] = row >= 0 && row < V ? from_float<O>(to_float(wte[row * C + c])) : from_float<O>(0.f);
  }
}

// ---- RoPE ------------------------------------------------------------------------------------
// Purpose: the rotation of pair i at position t: table (T, D/2) of (cos, sin) of
// t * theta^(-2i/D). Computed in double, as the CPU reference does: in fp32, t * freq
// alone loses ~1e-4 for t ~ 1000.
__global__ void rope_table_kernel(float2* table, int64_t T, int64_t D, double theta) {
  const int64_t half = D / 2;
  for (int64_t idx = grid_index(); idx < T * half; idx += grid_stride()) {
    double s, c;
    sincos(double(idx / half) * pow(theta, -2.0 * double(idx % half) / double(D)), &s, &c);
    table[idx] = make_float2(float(c), float(s));
  }
}

// Purpose: rotate the interleaved pairs (x[2i], x[2i+1]) of q and k at position t by the
// table's angle (sign -1: the inverse rotation, i.e. the backward), in place.
// Algorithm: one block per (b, t); its threads cover the 2H head rows of q and k (adjacent
// in qkv) in groups of kPairs pairs, so consecutive threads touch consecutive memory.
// qkv (B,T,3,H,D), table (T, D/2), (D/2) % kPairs == 0.
template <class E, int kPairs>
__global__ void rope_kernel(E* qkv, const float2* table, int T, int H, int D, float sign) {
  const int groups = D / 2 / kPairs;
  const int64_t bt = blockIdx.x;
  const float2* angle = table + (bt % T) * (D / 2);
  E* row = qkv + bt * 3 * H * D;  // q heads, then k heads: 2H rows of D
  for (int j = threadIdx.x; j < 2 * H * groups; j += blockDim.x) {
    const int head = j / groups, i0 = j % groups * kPairs;
    E* v = row + head * D + 2 * i0;
    Pack<E, 2 * kPairs> x = load_pack<2 * kPairs>(v);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const float2 cs = angle[i0 + k];
      const float c = cs.x, s = sign * cs.y, x0 = to_float(x.v[2 * k]), x1 = to_float(x.v[2 * k + 1]);
      x.v[2 * k] = from_float<E>(x0 * c - x1 * s);
      x.v[2 * k + 1] = from_float<E>(x0 * s + x1 * c);
    }
    store_pack<2 * kPairs>(v, x);
  }
}

// ---- SwiGLU ----------------------------------------------------------------------------------
__device__ __forceinline__ float sigmoid(float a) { return 1.f / (1.f + expf(-a)); }

// out (N,F) = silu(a) * b with h (N,2F) = [a | b]; kPack elements per thread step.
template <class O, class H, int kPack>
__global__ void swiglu_forward_kernel(O* out, const H* h, int64_t N, int64_t F) {
  for (int64_t g = grid_index(); g < N * F / kPack; g += grid_stride()) {
    const int64_t i = g * kPack, n = i / F, f = i % F;
    const Pack<H, kPack> a = load_pack<kPack>(h + n * 2 * F + f), b = load_pack<kPack>(h + n * 2 * F + F + f);
    Pack<O, kPack> o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float x = to_float(a.v[k]);
      o.v[k] = from_float<O>(x * sigmoid(x) * to_float(b.v[k]));
    }
    store_pack<kPack>(out + i, o);
  }
}

// da = g b s (1 + a (1 - s)), db = g a s with s = sigmoid(a); dh (N,2F) = [da | db]. If out
// is not null it gets the forward's a s b (the same float operations as swiglu_forward_kernel).
template <class DH, class G, class H, int kPack>
__global__ void swiglu_backward_kernel(DH* dh, DH* out, const G* dout, const H* h, int64_t N, int64_t F) {
  for (int64_t g = grid_index(); g < N * F / kPack; g += grid_stride()) {
    const int64_t i = g * kPack, n = i / F, f = i % F;
    const Pack<H, kPack> a = load_pack<kPack>(h + n * 2 * F + f), b = load_pack<kPack>(h + n * 2 * F + F + f);
    const Pack<G, kPack> d = load_pack<kPack>(dout + i);
    Pack<DH, kPack> da, db, o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float x = to_float(a.v[k]), y = to_float(b.v[k]), gk = to_float(d.v[k]), s = sigmoid(x);
      da.v[k] = from_float<DH>(gk * y * s * (1.f + x * (1.f - s)));
      db.v[k] = from_float<DH>(gk * x * s);
      o.v[k] = from_float<DH>(x * s * y);
    }
    store_pack<kPack>(dh + n * 2 * F + f, da);
    store_pack<kPack>(dh + n * 2 * F + F + f, db);
    if (out) store_pack<kPack>(out + i, o);
  }
}

// ---- conversion and scaling ------------------------------------------------------------------
// dst (n) = src (n) in dst's dtype; kPack elements per step, the last n % kPack one by one.
template <class D, class S, int kPack>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t g = grid_index(); g < n / kPack; g += grid_stride()) {
    const Pack<S, kPack> x = load_pack<kPack>(src + g * kPack);
    Pack<D, kPack> y;
#pragma unroll
    for (int k = 0; k < kPack; ++k) y.v[k] = from_float<D>(to_float(x.v[k]));
    store_pack<kPack>(dst + g * kPack, y);
  }
  const int64_t tail = n / kPack * kPack;
  if (grid_index() < n - tail) dst[tail + grid_index()] = from_float<D>(to_float(src[tail + grid_index()]));
}

template <class E>
__global__ void scale_kernel(E* x, float factor, int64_t n) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) x[i] = from_float<E>(to_float(x[i]) * factor);
}

// Rounded to the storage type as the host's store_from_double: to fp32 first, bf16 from that.
template <class E>
__global__ void random_normal_kernel(E* dst, int64_t n, uint64_t seed, uint64_t stream, double std, double bound) {
  for (int64_t i = grid_index(); i < n; i += grid_stride())
    dst[i] = from_float<E>(__double2float_rn(exact::mul(std, llmhpc::random_normal(seed, stream, uint64_t(i), bound))));
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t N, int64_t C, int64_t vocab_begin,
                       cudaStream_t stream) {
  dispatch_float("embedding_forward", out.dtype, [&](auto o) {
    dispatch_float("embedding_forward", wte.dtype, [&](auto w) {
      using O = decltype(o);
      using W = decltype(w);
      embedding_forward_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, stream>>>(
          out.ptr<O>(), tokens.ptr<int32_t>(), wte.ptr<W>(), N, wte.dim(0), C, vocab_begin);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void rope_table(Tensor table, int64_t T, int64_t D, double theta, cudaStream_t stream) {
  require_dtype("rope", table, DType::F32, "the angle table");
  LLMHPC_CHECK(table.numel() >= T * D, "rope: angle table too small");
  rope_table_kernel<<<blocks_for(T * (D / 2), kThreads), kThreads, 0, stream>>>(static_cast<float2*>(table.data), T, D,
                                                                                theta);
  CUDA_CHECK_LAUNCH();
}

void rope(Tensor qkv, Tensor table, int64_t B, int64_t T, int64_t H, int64_t D, double sign, cudaStream_t stream) {
  LLMHPC_CHECK(2 * H * D <= INT32_MAX && T <= INT32_MAX, "rope: shape exceeds the kernel's 32-bit indexing");
  dispatch_float("rope", qkv.dtype, [&](auto e) {
    using E = decltype(e);
    const auto angles = static_cast<const float2*>(table.data);
    // 16 bytes of pairs per access when D allows (head rows start at multiples of D).
    constexpr int kPairs = int(16 / (2 * sizeof(E)));
    if (D % (2 * kPairs) == 0 && aligned_to(16, {qkv.data}))
      rope_kernel<E, kPairs><<<int(B * T), threads_for_row(2 * H * D / (2 * kPairs)), 0, stream>>>(
          qkv.ptr<E>(), angles, int(T), int(H), int(D), float(sign));
    else
      rope_kernel<E, 1><<<int(B * T), threads_for_row(H * D), 0, stream>>>(qkv.ptr<E>(), angles, int(T), int(H), int(D),
                                                                           float(sign));
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_forward(Tensor out, Tensor h, int64_t N, int64_t F, cudaStream_t stream) {
  dispatch_float("swiglu_forward", out.dtype, [&](auto o) {
    dispatch_float("swiglu_forward", h.dtype, [&](auto hh) {
      using O = decltype(o);
      using H = decltype(hh);
      if (F % 4 == 0 && aligned_to(4 * sizeof(O), {out.data}) && aligned_to(4 * sizeof(H), {h.data}))
        swiglu_forward_kernel<O, H, 4>
            <<<blocks_for(N * F / 4, kThreads), kThreads, 0, stream>>>(out.ptr<O>(), h.ptr<H>(), N, F);
      else
        swiglu_forward_kernel<O, H, 1>
            <<<blocks_for(N * F, kThreads), kThreads, 0, stream>>>(out.ptr<O>(), h.ptr<H>(), N, F);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h, int64_t N, int64_t F, cudaStream_t stream) {
  if (dout.dtype != dh.dtype || (!out.empty() && out.dtype != dh.dtype))
    throw UsageError("swiglu_backward: dh, out and dout must have one dtype");
  dispatch_float("swiglu_backward", dh.dtype, [&](auto d) {
    dispatch_float("swiglu_backward", h.dtype, [&](auto hh) {
      using DH = decltype(d);
      using H = decltype(hh);
      DH* o = out.empty() ? nullptr : out.ptr<DH>();
      if (F % 4 == 0 && aligned_to(4 * sizeof(DH), {dh.data, dout.data, o}) && aligned_to(4 * sizeof(H), {h.data}))
        swiglu_backward_kernel<DH, DH, H, 4><<<blocks_for(N * F / 4, kThreads), kThreads, 0, stream>>>(
            dh.ptr<DH>(), o, dout.ptr<DH>(), h.ptr<H>(), N, F);
      else
        swiglu_backward_kernel<DH, DH, H, 1>
            <<<blocks_for(N * F, kThreads), kThreads, 0, stream>>>(dh.ptr<DH>(), o, dout.ptr<DH>(), h.ptr<H>(), N, F);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void convert(Tensor dst, Tensor src, cudaStream_t stream) {
  const int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch_float("convert", dst.dtype, [&](auto d) {
    dispatch_float("convert", src.dtype, [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      if (aligned_to(4 * sizeof(D), {dst.data}) && aligned_to(4 * sizeof(S), {src.data}))
        convert_kernel<D, S, 4>
            <<<blocks_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(dst.ptr<D>(), src.ptr<S>(), n);
      else convert_kernel<D, S, 1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst.ptr<D>(), src.ptr<S>(), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound, cudaStream_t cuda_stream) {
  if (dst.numel() == 0) return;
  dispatch_float("random_normal", dst.dtype, [&](auto e) {
    using E = decltype(e);
    random_normal_kernel<<<blocks_for(dst.numel(), kThreads), kThreads, 0, cuda_stream>>>(dst.ptr<E>(), dst.numel(),
                                                                                          seed, stream, std, bound);
    CUDA_CHECK_LAUNCH();
  });
}

void scale(Tensor x, double factor, cudaStream_t stream) {
  if (x.numel() == 0) return;
  dispatch_float("scale", x.dtype, [&](auto e) {
    using E = decltype(e);
    scale_kernel<<<blocks_for(x.numel(), kThreads), kThreads, 0, stream>>>(x.ptr<E>(), float(factor), x.numel());
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace llmhpc::cuda

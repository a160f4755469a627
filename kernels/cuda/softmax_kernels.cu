// Row softmax kernels: attention probabilities (forward and backward) and the
// cross-entropy loss with its gradient. All compute in fp32 whatever the storage dtype.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Purpose: probabilities = softmax over each row of scores, in place; under a causal mask
// row i (query position i) keeps keys j <= i and writes 0 for the rest. The 1/sqrt(D)
// scale was applied by the score GEMM.
// Algorithm: one warp per row (rows are T long and stay in L1): max, sum of exp, write;
// kPack elements per access (16 bytes when T allows); masked packs are not read.
// Shapes: p (rows, T), rows = B*H*T, T % kPack == 0.
template <class E, int kPack>
__global__ void attention_softmax_forward_kernel(E* p, int64_t rows, int64_t T, bool causal) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t len = causal ? row % T + 1 : T;
  E* pr = p + row * T;
  float mx = -INFINITY;
  for (int64_t j = lane * kPack; j < len; j += 32 * kPack) {
    const Pack<E, kPack> s = load_pack<kPack>(pr + j);
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (j + k < len) mx = fmaxf(mx, to_float(s.v[k]));
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t j = lane * kPack; j < len; j += 32 * kPack) {
    const Pack<E, kPack> s = load_pack<kPack>(pr + j);
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (j + k < len) sum += expf(to_float(s.v[k]) - mx);
  }
  const float inv = 1.f / warp_sum(sum);
  for (int64_t j = lane * kPack; j < T; j += 32 * kPack) {
    Pack<E, kPack> out;
    if (j < len) {
      const Pack<E, kPack> s = load_pack<kPack>(pr + j);
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = from_float<E>(j + k < len ? expf(to_float(s.v[k]) - mx) * inv : 0.f);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = from_float<E>(0.f);
    }
    store_pack<kPack>(pr + j, out);
  }
}

// Purpose: the softmax backward dS = P (dP - sum_j dP_j P_j), in place over dP; masked
// entries (P = 0) get 0 without being read.
// Algorithm: one warp per row: a dot product, then one write pass, kPack elements per
// access. Shapes: d, p (rows, T), row r is query position r % T; T % kPack == 0.
template <class E, int kPack>
__global__ void attention_softmax_backward_kernel(E* d, const E* p, int64_t rows, int64_t T, bool causal) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t len = causal ? row % T + 1 : T;
  E* dr = d + row * T;
  const E* pr = p + row * T;
  float dot = 0.f;
  for (int64_t j = lane * kPack; j < len; j += 32 * kPack) {
    const Pack<E, kPack> dv = load_pack<kPack>(dr + j);
    const Pack<E, kPack> pv = load_pack<kPack>(pr + j);
#pragma unroll
    for (int k = 0; k < kPack; ++k) dot += to_float(dv.v[k]) * to_float(pv.v[k]);  // P is 0 past len
  }
  dot = warp_sum(dot);
  for (int64_t j = lane * kPack; j < T; j += 32 * kPack) {
    Pack<E, kPack> out;
    if (j < len) {
      const Pack<E, kPack> dv = load_pack<kPack>(dr + j);
      const Pack<E, kPack> pv = load_pack<kPack>(pr + j);
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = from_float<E>(to_float(pv.v[k]) * (to_float(dv.v[k]) - dot));
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = from_float<E>(0.f);
    }
    store_pack<kPack>(dr + j, out);
  }
}

// Purpose: losses[n] = logsumexp(logits[n, :]) - logits[n, target] (NaN for a target
// outside [0, V), which the CPU backend reports as an error).
// Algorithm: one block per row: block max, block sum of exp(x - max), thread 0 finishes.
// Shapes: losses (N) fp32, logits (N,V), targets (N) int32.
template <class E>
__global__ void cross_entropy_forward_kernel(float* losses, const E* logits, const int32_t* targets, int64_t V) {
  __shared__ float scratch[32];
  const E* x = logits + int64_t(blockIdx.x) * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, to_float(x[i]));
  mx = block_max(mx, scratch);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(to_float(x[i]) - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const int32_t t = targets[blockIdx.x];
    losses[blockIdx.x] = (t >= 0 && t < V) ? logf(sum) + mx - to_float(x[t]) : NAN;
  }
}

// Purpose: dlogits = (softmax(logits) - onehot(target)) * scale, the loss gradient fused
// with the softmax; dlogits may alias logits (each thread reads an element before it
// writes it, and the reductions finish all reads of the row before the write pass).
// Algorithm: one block per row: block max, block sum, then the write pass.
template <class D, class E>
__global__ void cross_entropy_backward_kernel(D* dlogits, const E* logits, const int32_t* targets, float scale,
                                              int64_t V) {
  __shared__ float scratch[32];
  const E* x = logits + int64_t(blockIdx.x) * V;
  D* dx = dlogits + int64_t(blockIdx.x) * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, to_float(x[i]));
  mx = block_max(mx, scratch);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(to_float(x[i]) - mx);
  const float lse = mx + logf(block_sum(sum, scratch));
  const int32_t t = targets[blockIdx.x];
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(to_float(x[i]) - lse);
    dx[i] = from_float<D>((p - (i == t ? 1.f : 0.f)) * scale);
  }
}

}  // namespace

// 16-byte accesses when every row starts 16-byte aligned, else one element at a time.
template <class E>
constexpr int pack_for_16_bytes() {
  return int(16 / sizeof(E));
}

void attention_softmax_forward(Tensor probs, int64_t rows, int64_t T, bool causal, cudaStream_t stream) {
  dispatch_float("attention_forward", probs.dtype, [&](auto e) {
    using E = decltype(e);
    constexpr int kPack = pack_for_16_bytes<E>();
    const dim3 grid(ceil_div(rows, kWarpsPerBlock)), block(32 * kWarpsPerBlock);
    if (T % kPack == 0 && aligned_to(16, {probs.data}))
      attention_softmax_forward_kernel<E, kPack><<<grid, block, 0, stream>>>(probs.ptr<E>(), rows, T, causal);
    else attention_softmax_forward_kernel<E, 1><<<grid, block, 0, stream>>>(probs.ptr<E>(), rows, T, causal);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_softmax_backward(Tensor dscores, Tensor probs, int64_t rows, int64_t T, bool causal,
                                cudaStream_t stream) {
  if (dscores.dtype != probs.dtype)
    throw UsageError("attention_backward: the score gradient and the probabilities must share a dtype");
  dispatch_float("attention_backward", dscores.dtype, [&](auto e) {
    using E = decltype(e);
    constexpr int kPack = pack_for_16_bytes<E>();
    const dim3 grid(ceil_div(rows, kWarpsPerBlock)), block(32 * kWarpsPerBlock);
    if (T % kPack == 0 && aligned_to(16, {dscores.data, probs.data}))
      attention_softmax_backward_kernel<E, kPack>
          <<<grid, block, 0, stream>>>(dscores.ptr<E>(), probs.ptr<E>(), rows, T, causal);
    else
      attention_softmax_backward_kernel<E, 1>
          <<<grid, block, 0, stream>>>(dscores.ptr<E>(), probs.ptr<E>(), rows, T, causal);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets, int64_t N, int64_t V, cudaStream_t stream) {
  require_dtype("cross_entropy_forward", losses, DType::F32, "losses");
  if (N == 0) return;
  dispatch_float("cross_entropy_forward", logits.dtype, [&](auto e) {
    using E = decltype(e);
    cross_entropy_forward_kernel<<<int(N), threads_for_row(V, 512), 0, stream>>>(losses.ptr<float>(), logits.ptr<E>(),
                                                                                 targets.ptr<int32_t>(), V);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale, int64_t N, int64_t V,
                            cudaStream_t stream) {
  if (N == 0) return;
  if (dlogits.data == logits.data && dlogits.dtype != logits.dtype)
    throw UsageError("cross_entropy_backward: in place needs dlogits and logits in one dtype");
  dispatch_float("cross_entropy_backward", dlogits.dtype, [&](auto d) {
    dispatch_float("cross_entropy_backward", logits.dtype, [&](auto e) {
      cross_entropy_backward_kernel<<<int(N), threads_for_row(V, 512), 0, stream>>>(
          dlogits.ptr<decltype(d)>(), logits.ptr<decltype(e)>(), targets.ptr<int32_t>(), float(scale), V);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace llmhpc::cuda

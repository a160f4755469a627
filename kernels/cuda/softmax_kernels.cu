// Row softmax kernels: attention probabilities (forward and backward), the cross-entropy
// loss with its gradient, and the vocabulary-parallel cross-entropy's statistics, combination
// and gradient. All compute in fp32 whatever the storage dtype.
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

// ---- vocabulary-parallel cross-entropy --------------------------------------------------------
// Logits (N,V) hold the vocabulary columns [vocab_begin, vocab_begin + V), the first `valid` of
// them real: the rest (padding) is never read into a result. kPack elements per access: 16
// bytes when V allows and the pointers are aligned (a row's last pack may reach into the
// padding, which is masked), else 1.

// Purpose: stats[n] = (max, sum of exp(x - max), target logit or 0) over the real columns of
// row n: the part of the row's logsumexp this rank holds (Ops::cross_entropy_stats).
// Algorithm: one block per row, the row read once: each thread keeps a running max and a sum
// of exp(x - max) over its packs, rescaling the sum when a pack raises the max (one exp per
// element and one per such pack); then the block max, each thread's sum rescaled to it, the
// block sum; thread 0 reads the target's logit and writes the three values.
// Shapes: stats (N,3) fp32, logits (N,V), targets (N) int32 ids of the whole vocabulary.
template <class E, int kPack>
__global__ void cross_entropy_stats_kernel(float* stats, const E* logits, const int32_t* targets, int64_t V,
                                           int64_t vocab_begin, int64_t valid) {
  __shared__ float scratch[32];
  const E* x = logits + int64_t(blockIdx.x) * V;
  float mx = -INFINITY, sum = 0.f;
  for (int64_t j = int64_t(threadIdx.x) * kPack; j < valid; j += int64_t(blockDim.x) * kPack) {
    const Pack<E, kPack> p = load_pack<kPack>(x + j);
    float v[kPack], pack_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      v[k] = j + k < valid ? to_float(p.v[k]) : -INFINITY;
      pack_max = fmaxf(pack_max, v[k]);
    }
    if (pack_max > mx) {
      sum *= expf(mx - pack_max);  // 0 * exp(-inf) = 0 while nothing was seen
      mx = pack_max;
    }
    const float base = mx == -INFINITY ? 0.f : mx;  // all seen are -inf: each adds exp(-inf) = 0
#pragma unroll
    for (int k = 0; k < kPack; ++k) sum += expf(v[k] - base);
  }
  const float row_max = block_max(mx, scratch);
  const float row_sum = block_sum(mx == -INFINITY ? 0.f : sum * expf(mx - row_max), scratch);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[blockIdx.x]) - vocab_begin;
    float* out = stats + int64_t(blockIdx.x) * 3;
    out[0] = row_max;
    out[1] = row_sum;
    out[2] = t >= 0 && t < valid ? to_float(x[t]) : 0.f;
  }
}

// Purpose: the R ranks' stats of row n (stacked (R,N,3)) into the row's logsumexp and loss:
// M = max_r m_r, lse = M + log(sum_r s_r exp(m_r - M)), loss = lse - sum_r target_r; a rank
// without real columns (m_r = -inf) adds nothing. One thread per row, ranks in order.
__global__ void cross_entropy_combine_kernel(float* losses, float* lse, const float* stats, int64_t N, int64_t R) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    float mx = -INFINITY;
    for (int64_t r = 0; r < R; ++r) mx = fmaxf(mx, stats[(r * N + n) * 3]);
    float sum = 0.f, target = 0.f;
    for (int64_t r = 0; r < R; ++r) {
      const float* s = stats + (r * N + n) * 3;
      if (s[0] != -INFINITY) sum += s[1] * expf(s[0] - mx);
      target += s[2];
    }
    const float l = mx + logf(sum);
    lse[n] = l;
    losses[n] = l - target;
  }
}

// Purpose: dlogits = (exp(logits - lse) - onehot(target - vocab_begin)) * scale on the real
// columns, 0 on the padding: the gradient of the mean loss from the combined logsumexp.
// dlogits may alias logits (each thread reads a pack before it writes it).
// Algorithm: one block per row, kPack elements per access, the row's lse and target read once.
template <class D, class E, int kPack>
__global__ void cross_entropy_backward_lse_kernel(D* dlogits, const E* logits, const int32_t* targets, const float* lse,
                                                  float scale, int64_t V, int64_t vocab_begin, int64_t valid) {
  const E* x = logits + int64_t(blockIdx.x) * V;
  D* dx = dlogits + int64_t(blockIdx.x) * V;
  const float l = lse[blockIdx.x];
  const int64_t t = int64_t(targets[blockIdx.x]) - vocab_begin;
  for (int64_t j = int64_t(threadIdx.x) * kPack; j < V; j += int64_t(blockDim.x) * kPack) {
    Pack<D, kPack> out;
    if (j < valid) {
      const Pack<E, kPack> p = load_pack<kPack>(x + j);
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        out.v[k] = from_float<D>(j + k < valid ? (expf(to_float(p.v[k]) - l) - (j + k == t ? 1.f : 0.f)) * scale : 0.f);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = from_float<D>(0.f);
    }
    store_pack<kPack>(dx + j, out);
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

void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t N, int64_t V, int64_t vocab_begin,
                         int64_t valid, cudaStream_t stream) {
  require_dtype("cross_entropy_stats", stats, DType::F32, "stats");
  if (N == 0) return;
  dispatch_float("cross_entropy_stats", logits.dtype, [&](auto e) {
    using E = decltype(e);
    constexpr int kPack = pack_for_16_bytes<E>();
    if (V % kPack == 0 && aligned_to(16, {logits.data}))
      cross_entropy_stats_kernel<E, kPack><<<int(N), threads_for_row(ceil_div(valid, kPack), 512), 0, stream>>>(
          stats.ptr<float>(), logits.ptr<E>(), targets.ptr<int32_t>(), V, vocab_begin, valid);
    else
      cross_entropy_stats_kernel<E, 1><<<int(N), threads_for_row(valid, 512), 0, stream>>>(
          stats.ptr<float>(), logits.ptr<E>(), targets.ptr<int32_t>(), V, vocab_begin, valid);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats, int64_t N, int64_t R, cudaStream_t stream) {
  require_dtype("cross_entropy_combine", losses, DType::F32, "losses");
  require_dtype("cross_entropy_combine", lse, DType::F32, "lse");
  require_dtype("cross_entropy_combine", stats, DType::F32, "stats");
  if (N == 0) return;
  cross_entropy_combine_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(losses.ptr<float>(), lse.ptr<float>(),
                                                                       stats.ptr<float>(), N, R);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale, int64_t N,
                                int64_t V, int64_t vocab_begin, int64_t valid, cudaStream_t stream) {
  require_dtype("cross_entropy_backward_lse", lse, DType::F32, "lse");
  if (N == 0) return;
  if (dlogits.data == logits.data && dlogits.dtype != logits.dtype)
    throw UsageError("cross_entropy_backward_lse: in place needs dlogits and logits in one dtype");
  dispatch_float("cross_entropy_backward_lse", dlogits.dtype, [&](auto d) {
    dispatch_float("cross_entropy_backward_lse", logits.dtype, [&](auto e) {
      using D = decltype(d);
      using E = decltype(e);
      // Packs of 16 bytes of the wider type: both sides' accesses aligned when both pointers are.
      constexpr int kPack =
          pack_for_16_bytes<D>() < pack_for_16_bytes<E>() ? pack_for_16_bytes<D>() : pack_for_16_bytes<E>();
      if (V % kPack == 0 && aligned_to(16, {dlogits.data, logits.data}))
        cross_entropy_backward_lse_kernel<D, E, kPack><<<int(N), threads_for_row(ceil_div(V, kPack), 512), 0, stream>>>(
            dlogits.ptr<D>(), logits.ptr<E>(), targets.ptr<int32_t>(), lse.ptr<float>(), float(scale), V, vocab_begin,
            valid);
      else
        cross_entropy_backward_lse_kernel<D, E, 1>
            <<<int(N), threads_for_row(V, 512), 0, stream>>>(dlogits.ptr<D>(), logits.ptr<E>(), targets.ptr<int32_t>(),
                                                             lse.ptr<float>(), float(scale), V, vocab_begin, valid);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace llmhpc::cuda

// FlashAttention-2 on CUDA cores: forward, dK/dV and dQ kernels in fp32 arithmetic for fp32
// storage (and bf16 storage, as a fallback of the tensor-core path). Same algorithm and the
// same split of the backward as the tensor-core kernels (flash_fwd_kernel.cuh,
// flash_bwd_kernel.cuh), with 32 x 32 tiles held in shared memory as fp32.
//
// Thread layout (128 threads): ty = tid / 8 in [0, 16), tx = tid % 8. A thread owns rows ty
// and ty + 16 of the stationary tile and, of a 32-wide score tile, columns tx + 8c (c < 4);
// of a kHeadDim-wide output tile, columns tx + 8c (c < kHeadDim / 8). The eight threads that
// share rows are eight consecutive lanes of one warp: row reductions are three shuffles, and
// a score tile written to shared memory is read back by the same warp (__syncwarp).
#pragma once
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/kernel_traits.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

// Rows [row0, row0 + kBlock) x columns [0, kHeadDim) of a (seq x head_dim) matrix into fp32
// shared memory rows `smem_row` apart; zeros past the sequence and past the head dim.
template <class Tr, class E>
__device__ __forceinline__ void simt_load_tile(float* smem, int smem_row, const E* gmem, int64_t row_stride, int row0,
                                               int seq, int head_dim) {
  for (int i = threadIdx.x; i < Tr::kBlock * Tr::kHeadDim; i += Tr::kThreads) {
    const int r = i / Tr::kHeadDim, d = i % Tr::kHeadDim;
    smem[r * smem_row + d] =
        (row0 + r < seq && d < head_dim) ? to_float(gmem[int64_t(row0 + r) * row_stride + d]) : 0.f;
  }
}

// Max and sum over the eight lanes that share a row.
__device__ __forceinline__ float octet_max(float x) {
#pragma unroll
  for (int offset = 1; offset < 8; offset <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float octet_sum(float x) {
#pragma unroll
  for (int offset = 1; offset < 8; offset <<= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// s[r][c] = sum_d A[rows ty + 16r][d] * B[rows tx + 8c][d]: a 32 x 32 tile of dot products
// of the rows of two padded shared-memory tiles.
template <class Tr>
__device__ __forceinline__ void simt_dots(float (&s)[2][4], const float* a, const float* b, int ty, int tx) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) s[r][c] = 0.f;
#pragma unroll 8
  for (int d = 0; d < Tr::kHeadDim; ++d) {
    const float a0 = a[ty * Tr::kRowPad + d], a1 = a[(ty + 16) * Tr::kRowPad + d];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float bv = b[(tx + 8 * c) * Tr::kRowPad + d];
      s[0][c] += a0 * bv;
      s[1][c] += a1 * bv;
    }
  }
}

// acc[r][c] += sum_j W[ty + 16r][j] * B[j][tx + 8c]: weights of a 32 x 32 score tile in
// shared memory (rows Tr::kScoreRow apart) times a 32-row tile (rows `b_row` apart).
template <class Tr>
__device__ __forceinline__ void simt_weighted_rows(float (&acc)[2][Tr::kColsPerThread], const float* w,
                                                   const float* bm, int b_row, int ty, int tx) {
#pragma unroll 4
  for (int j = 0; j < Tr::kBlock; ++j) {
    const float w0 = w[ty * Tr::kScoreRow + j], w1 = w[(ty + 16) * Tr::kScoreRow + j];
#pragma unroll
    for (int c = 0; c < Tr::kColsPerThread; ++c) {
      const float bv = bm[j * b_row + tx + 8 * c];
      acc[0][c] += w0 * bv;
      acc[1][c] += w1 * bv;
    }
  }
}

template <class E>
__device__ __forceinline__ const E* head_ptr(const void* base, const Strides& s, int b, int h) {
  return static_cast<const E*>(base) + b * s.batch + h * s.head;
}

// Purpose: O and L for a tile of 32 queries of one (batch, head), on CUDA cores.
// Grid: (query tiles, B*H), heaviest (causal) first; 128 threads.
// Algorithm: per visible key tile of 32: S = Q K^T * scale (masked), online softmax with the
// running max m and sum l of each row, O = c O + P V; finally O / l and L = m + log l.
template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads) flash_fwd_simt_kernel(const FlashParams p) {
  constexpr int kB = Tr::kBlock, kD = Tr::kHeadDim, kC = Tr::kColsPerThread;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);  // (kB, kRowPad)
  float* sK = sQ + kB * Tr::kRowPad;           // (kB, kRowPad)
  float* sV = sK + kB * Tr::kRowPad;           // (kB, kD)
  float* sP = sV + kB * kD;                    // (kB, kScoreRow)

  const int T = p.seq, D = p.head_dim;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kB;
  const int b = int(blockIdx.y) / p.heads, h = int(blockIdx.y) % p.heads;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const E* q = head_ptr<E>(p.q, p.q_strides, b, h);
  const E* k = head_ptr<E>(p.k, p.k_strides, b, h);
  const E* v = head_ptr<E>(p.v, p.v_strides, b, h);

  simt_load_tile<Tr>(sQ, Tr::kRowPad, q, p.q_strides.row, q0, T, D);
  const int row[2] = {q0 + ty, q0 + ty + 16};
  float acc[2][kC] = {}, row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // log2 units
  const float scale_log2 = p.scale * kLog2e;
  const int key_end = p.causal ? min(q0 + kB, T) : T;

  for (int k0 = 0; k0 < key_end; k0 += kB) {
    __syncthreads();  // the previous tile is no longer read
    simt_load_tile<Tr>(sK, Tr::kRowPad, k, p.k_strides.row, k0, T, D);
    simt_load_tile<Tr>(sV, kD, v, p.v_strides.row, k0, T, D);
    __syncthreads();

    float s[2][4];
    simt_dots<Tr>(s, sQ, sK, ty, tx);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = k0 + tx + 8 * c;
        s[r][c] = (key >= T || (p.causal && key > row[r])) ? -INFINITY : s[r][c] * scale_log2;
        tile_max = fmaxf(tile_max, s[r][c]);
      }
      const float m_new = fmaxf(row_max[r], octet_max(tile_max));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float correction = exp2f(row_max[r] - m_use);
      row_max[r] = m_new;
      row_sum[r] *= correction;
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[r][c] *= correction;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float pv = exp2f(s[r][c] - m_use);
        row_sum[r] += pv;
        sP[(ty + 16 * r) * Tr::kScoreRow + tx + 8 * c] = pv;
      }
    }
    __syncwarp();  // the eight lanes of a row wrote it; the same lanes read it
    simt_weighted_rows<Tr>(acc, sP, sV, kD, ty, tx);  // O += P V
    __syncwarp();  // (sP is rewritten only after the next __syncthreads)
  }

  E* o = static_cast<E*>(p.o) + b * p.o_strides.batch + h * p.o_strides.head;
  float* lse = p.lse + (int64_t(b) * p.heads + h) * T;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = octet_sum(row_sum[r]);
    if (row[r] >= T) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = tx + 8 * c;
      if (d < D) o[int64_t(row[r]) * p.o_strides.row + d] = from_float<E>(acc[r][c] * inv);
    }
    if (tx == 0) lse[row[r]] = l > 0.f ? row_max[r] * 0.6931471805599453f + logf(l) : INFINITY;
  }
}

// Purpose: dK, dV of a tile of 32 keys of one (batch, head), on CUDA cores.
// Grid: (key tiles, B*H); 128 threads; rows ty, ty + 16 are keys, score columns are queries.
// Algorithm: per query tile of 32 that can see the keys: S^T = K Q^T, P^T = exp(S^T scale - L),
// dP^T = V dO^T, dS^T = P^T (dP^T - D); dV += P^T dO, dK += dS^T Q; finally dK *= scale.
template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dkdv_simt_kernel(const FlashParams p) {
  constexpr int kB = Tr::kBlock, kC = Tr::kColsPerThread, kPad = Tr::kRowPad;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sK = reinterpret_cast<float*>(smem);  // (kB, kPad) each
  float* sV = sK + kB * kPad;
  float* sQ = sV + kB * kPad;
  float* sdO = sQ + kB * kPad;
  float* sP = sdO + kB * kPad;          // (kB, kScoreRow): P^T
  float* sdS = sP + kB * Tr::kScoreRow;  // (kB, kScoreRow): dS^T
  float* sL = sdS + kB * Tr::kScoreRow;  // (kB): L * log2(e) of the query tile
  float* sDelta = sL + kB;               // (kB)

  const int T = p.seq, D = p.head_dim;
  const int k0 = int(blockIdx.x) * kB;
  const int b = int(blockIdx.y) / p.heads, h = int(blockIdx.y) % p.heads;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const E* q = head_ptr<E>(p.q, p.q_strides, b, h);
  const E* dout = head_ptr<E>(p.dout, p.dout_strides, b, h);
  const float* lse = p.lse + (int64_t(b) * p.heads + h) * T;
  const float* delta = p.delta + (int64_t(b) * p.heads + h) * T;

  simt_load_tile<Tr>(sK, kPad, head_ptr<E>(p.k, p.k_strides, b, h), p.k_strides.row, k0, T, D);
  simt_load_tile<Tr>(sV, kPad, head_ptr<E>(p.v, p.v_strides, b, h), p.v_strides.row, k0, T, D);
  const int key[2] = {k0 + ty, k0 + ty + 16};
  float dk[2][kC] = {}, dv[2][kC] = {};
  const float scale_log2 = p.scale * kLog2e;

  for (int m0 = p.causal ? k0 : 0; m0 < T; m0 += kB) {  // causal: earlier queries see none of these keys
    __syncthreads();
    simt_load_tile<Tr>(sQ, kPad, q, p.q_strides.row, m0, T, D);
    simt_load_tile<Tr>(sdO, kPad, dout, p.dout_strides.row, m0, T, D);
    for (int i = threadIdx.x; i < kB; i += Tr::kThreads) {
      sL[i] = m0 + i < T ? lse[m0 + i] * kLog2e : 0.f;
      sDelta[i] = m0 + i < T ? delta[m0 + i] : 0.f;
    }
    __syncthreads();

    float s[2][4], dp[2][4];
    simt_dots<Tr>(s, sK, sQ, ty, tx);
    simt_dots<Tr>(dp, sV, sdO, ty, tx);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = tx + 8 * c, query = m0 + col;
        const bool masked = query >= T || key[r] >= T || (p.causal && key[r] > query);
        const float pv = masked ? 0.f : exp2f(s[r][c] * scale_log2 - sL[col]);
        sP[(ty + 16 * r) * Tr::kScoreRow + col] = pv;
        sdS[(ty + 16 * r) * Tr::kScoreRow + col] = pv * (dp[r][c] - sDelta[col]);
      }
    __syncwarp();
    simt_weighted_rows<Tr>(dv, sP, sdO, kPad, ty, tx);   // dV += P^T dO
    simt_weighted_rows<Tr>(dk, sdS, sQ, kPad, ty, tx);   // dK += dS^T Q
  }

  E* dk_out = static_cast<E*>(p.dk) + b * p.dk_strides.batch + h * p.dk_strides.head;
  E* dv_out = static_cast<E*>(p.dv) + b * p.dv_strides.batch + h * p.dv_strides.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= T) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = tx + 8 * c;
      if (d >= D) continue;
      dk_out[int64_t(key[r]) * p.dk_strides.row + d] = from_float<E>(dk[r][c] * p.scale);
      dv_out[int64_t(key[r]) * p.dv_strides.row + d] = from_float<E>(dv[r][c]);
    }
  }
}

// Purpose: dQ of a tile of 32 queries of one (batch, head), on CUDA cores.
// Grid: (query tiles, B*H), heaviest first; 128 threads; rows ty, ty + 16 are queries.
// Algorithm: per visible key tile of 32: S = Q K^T, P = exp(S scale - L), dP = dO V^T,
// dS = P (dP - D), dQ += dS K; finally dQ *= scale.
template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dq_simt_kernel(const FlashParams p) {
  constexpr int kB = Tr::kBlock, kC = Tr::kColsPerThread, kPad = Tr::kRowPad;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);  // (kB, kPad) each
  float* sdO = sQ + kB * kPad;
  float* sK = sdO + kB * kPad;
  float* sV = sK + kB * kPad;
  float* sdS = sV + kB * kPad;  // (kB, kScoreRow)

  const int T = p.seq, D = p.head_dim;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kB;
  const int b = int(blockIdx.y) / p.heads, h = int(blockIdx.y) % p.heads;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const E* k = head_ptr<E>(p.k, p.k_strides, b, h);
  const E* v = head_ptr<E>(p.v, p.v_strides, b, h);
  const float* lse = p.lse + (int64_t(b) * p.heads + h) * T;
  const float* delta = p.delta + (int64_t(b) * p.heads + h) * T;

  simt_load_tile<Tr>(sQ, kPad, head_ptr<E>(p.q, p.q_strides, b, h), p.q_strides.row, q0, T, D);
  simt_load_tile<Tr>(sdO, kPad, head_ptr<E>(p.dout, p.dout_strides, b, h), p.dout_strides.row, q0, T, D);
  const int row[2] = {q0 + ty, q0 + ty + 16};
  float row_lse[2], row_delta[2], dq[2][kC] = {};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_lse[r] = row[r] < T ? lse[row[r]] * kLog2e : 0.f;
    row_delta[r] = row[r] < T ? delta[row[r]] : 0.f;
  }
  const float scale_log2 = p.scale * kLog2e;
  const int key_end = p.causal ? min(q0 + kB, T) : T;

  for (int k0 = 0; k0 < key_end; k0 += kB) {
    __syncthreads();
    simt_load_tile<Tr>(sK, kPad, k, p.k_strides.row, k0, T, D);
    simt_load_tile<Tr>(sV, kPad, v, p.v_strides.row, k0, T, D);
    __syncthreads();

    float s[2][4], dp[2][4];
    simt_dots<Tr>(s, sQ, sK, ty, tx);
    simt_dots<Tr>(dp, sdO, sV, ty, tx);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = k0 + tx + 8 * c;
        const bool masked = key >= T || (p.causal && key > row[r]);
        const float pv = masked ? 0.f : exp2f(s[r][c] * scale_log2 - row_lse[r]);
        sdS[(ty + 16 * r) * Tr::kScoreRow + tx + 8 * c] = pv * (dp[r][c] - row_delta[r]);
      }
    __syncwarp();
    simt_weighted_rows<Tr>(dq, sdS, sK, kPad, ty, tx);  // dQ += dS K
  }

  E* dq_out = static_cast<E*>(p.dq) + b * p.dq_strides.batch + h * p.dq_strides.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= T) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = tx + 8 * c;
      if (d < D) dq_out[int64_t(row[r]) * p.dq_strides.row + d] = from_float<E>(dq[r][c] * p.scale);
    }
  }
}

}  // namespace llmhpc::flash

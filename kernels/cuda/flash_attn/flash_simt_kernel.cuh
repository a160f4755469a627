// FlashAttention-2 on CUDA cores: forward, dK/dV and dQ kernels in fp32 arithmetic for fp32
// storage (and bf16 storage, as a fallback of the tensor-core path). Same algorithm and the
// same split of the backward as the tensor-core kernels (flash_fwd_kernel.cuh,
// flash_bwd_kernel.cuh), with the tiles held in shared memory as fp32.
//
// Classic SGEMM register tiling (SimtTraits): 256 threads, ty = tid / 16 in [0, 16), tx =
// tid % 16. A thread owns the stationary rows ty + 16 i (i < 4), the score columns tx + 16 j
// (j < kBlockN / 16) and the output columns dim_col(c) (float4 groups 4 tx .. 4 tx + 3, 64
// apart). Every operand is row-major in shared memory along the summed index, so the inner
// loops read float4: a dot product step (S = A B^T) reads 4 + kScoreCols float4 for
// 16 kScoreCols FMAs, a weighted-rows step (C += W B) 4 + 4 kDimCols / 4 float4 for
// 16 kDimCols FMAs, where 2 x 4 scalar tiles need six loads per eight FMAs.
// The 16 threads that share rows are one half-warp: row reductions are four shuffles, and a
// score row written to shared memory is read back by the same half-warp (__syncwarp).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda/flash_attn/block_info.cuh"
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/kernel_traits.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float comp(const float4& v, int u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

// Rows [row0, row0 + kRows) x columns [0, kHeadDim) of a (seq x head_dim) matrix into fp32
// shared memory rows Tr::kRow apart; zeros past the sequence and past the head dim. fp32
// storage with 16-byte aligned rows and a head dim that is a multiple of 4 reads float4 (the
// models' heads, 80 in 128 included). Loads go to registers in batches before any store: the
// compiler may not move a global load above a shared-memory store (a generic pointer could
// alias it), so a load-store loop would wait out the global latency once per element.
template <class Tr, int kRows, class E>
__device__ __forceinline__ void simt_load_tile(float* smem, const E* gmem, int64_t row_stride, int row0, int seq,
                                               int head_dim) {
  constexpr int kD = Tr::kHeadDim;
  if constexpr (std::is_same_v<E, float>) {
    if (head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(gmem) % 16 == 0 && row_stride % 4 == 0) {
      constexpr int kIters = kRows * kD / 4 / Tr::kThreads, kBatch = kIters < 4 ? kIters : 4;
      static_assert(kRows * kD / 4 % Tr::kThreads == 0 && kIters % kBatch == 0, "whole batches");
#pragma unroll 1  // one batch of registers at a time
      for (int it = 0; it < kIters; it += kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = threadIdx.x + (it + u) * Tr::kThreads, r = i / (kD / 4), d = 4 * (i % (kD / 4));
          v[u] = row0 + r < seq && d < head_dim ? ld4(gmem + int64_t(row0 + r) * row_stride + d)
                                                : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = threadIdx.x + (it + u) * Tr::kThreads, r = i / (kD / 4), d = 4 * (i % (kD / 4));
          *reinterpret_cast<float4*>(smem + r * Tr::kRow + d) = v[u];
        }
      }
      return;
    }
  }
  constexpr int kIters = kRows * kD / Tr::kThreads, kBatch = 8;
  static_assert(kRows * kD % Tr::kThreads == 0 && kIters % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int it = 0; it < kIters; it += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = threadIdx.x + (it + u) * Tr::kThreads, r = i / kD, d = i % kD;
      v[u] = row0 + r < seq && d < head_dim ? to_float(gmem[int64_t(row0 + r) * row_stride + d]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = threadIdx.x + (it + u) * Tr::kThreads;
      smem[(i / kD) * Tr::kRow + i % kD] = v[u];
    }
  }
}

// simt_load_tile through cp.async where it can (fp32 storage, rows of whole 16-byte chunks):
// the copies land when a later cp_async_wait covers the caller's cp_async_commit, and cost no
// registers meanwhile. Elsewhere (bf16, unaligned rows) it loads synchronously.
template <class Tr, int kRows, class E>
__device__ __forceinline__ void simt_load_tile_async(float* smem, const E* gmem, int64_t row_stride, int row0, int seq,
                                                     int head_dim) {
  if constexpr (std::is_same_v<E, float>) {
    constexpr int kD = Tr::kHeadDim;
    if (head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(gmem) % 16 == 0 && row_stride % 4 == 0) {
      static_assert(kRows * kD / 4 % Tr::kThreads == 0, "whole chunks per thread");
#pragma unroll
      for (int it = 0; it < kRows * kD / 4 / Tr::kThreads; ++it) {
        const int i = threadIdx.x + it * Tr::kThreads, r = i / (kD / 4), d = 4 * (i % (kD / 4));
        const bool valid = row0 + r < seq && d < head_dim;
        cp_async_16(smem + r * Tr::kRow + d, valid ? gmem + int64_t(row0 + r) * row_stride + d : gmem, valid ? 16 : 0);
      }
      return;
    }
  }
  simt_load_tile<Tr, kRows>(smem, gmem, row_stride, row0, seq, head_dim);
}

// Max and sum over the sixteen lanes (a half-warp) that share a row.
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
  for (int offset = 1; offset < 16; offset <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int offset = 1; offset < 16; offset <<= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Column c (< kDimCols) of a kHeadDim-wide row owned by thread tx: float4 groups (head dims
// 64, 128: 16 lanes read 256 contiguous bytes), or pairs for head dim 32.
template <class Tr>
__device__ __forceinline__ int dim_col(int c, int tx) {
  if constexpr (Tr::kDimCols >= 4) return 64 * (c / 4) + 4 * tx + c % 4;
  else return 2 * tx + c;
}

template <class Tr>
__device__ __forceinline__ void load_dim_cols(float (&x)[Tr::kDimCols], const float* row, int tx) {
  if constexpr (Tr::kDimCols >= 4) {
#pragma unroll
    for (int g = 0; g < Tr::kDimCols / 4; ++g) {
      const float4 v = ld4(row + 64 * g + 4 * tx);
      x[4 * g] = v.x, x[4 * g + 1] = v.y, x[4 * g + 2] = v.z, x[4 * g + 3] = v.w;
    }
  } else {
    static_assert(Tr::kDimCols == 2, "head dim 32");
    const float2 v = *reinterpret_cast<const float2*>(row + 2 * tx);
    x[0] = v.x, x[1] = v.y;
  }
}

// s[i][j] = sum_d A[ty + 16 i][d] * B[tx + 16 j][d]: a kBlockM x kBlockN tile of dot products
// of the rows of two shared-memory tiles (rows Tr::kRow apart), four d per step as float4.
template <class Tr>
__device__ __forceinline__ void simt_dots(float (&s)[Tr::kRowsPerThread][Tr::kScoreCols], const float* a,
                                          const float* b, int ty, int tx) {
  constexpr int kR = Tr::kRowsPerThread, kS = Tr::kScoreCols;
#pragma unroll
  for (int i = 0; i < kR; ++i)
#pragma unroll
    for (int j = 0; j < kS; ++j) s[i][j] = 0.f;
#pragma unroll 2
  for (int d = 0; d < Tr::kHeadDim; d += 4) {
    float4 av[kR], bv[kS];
#pragma unroll
    for (int i = 0; i < kR; ++i) av[i] = ld4(a + (ty + 16 * i) * Tr::kRow + d);
#pragma unroll
    for (int j = 0; j < kS; ++j) bv[j] = ld4(b + (tx + 16 * j) * Tr::kRow + d);
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        s[i][j] += av[i].x * bv[j].x;
        s[i][j] += av[i].y * bv[j].y;
        s[i][j] += av[i].z * bv[j].z;
        s[i][j] += av[i].w * bv[j].w;
      }
  }
}

// acc[i][c] += sum_n W[ty + 16 i][n] * B[n][dim_col(c)]: weights of a kBlockM x kBlockN score
// tile (rows Tr::kScoreRow apart, read four n at a time as float4) times a kBlockN-row tile
// (rows Tr::kRow apart).
template <class Tr>
__device__ __forceinline__ void simt_weighted_rows(float (&acc)[Tr::kRowsPerThread][Tr::kDimCols], const float* w,
                                                   const float* bm, int ty, int tx) {
  constexpr int kR = Tr::kRowsPerThread;
#pragma unroll 2
  for (int n = 0; n < Tr::kBlockN; n += 4) {
    float4 wv[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) wv[i] = ld4(w + (ty + 16 * i) * Tr::kScoreRow + n);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float bv[Tr::kDimCols];
      load_dim_cols<Tr>(bv, bm + (n + u) * Tr::kRow, tx);
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const float wi = comp(wv[i], u);
#pragma unroll
        for (int c = 0; c < Tr::kDimCols; ++c) acc[i][c] += wi * bv[c];
      }
    }
  }
}

// ---- the fused dQ (flash_bwd_dkdv_simt_kernel<Tr, E, true>) --------------------------------
// Its hand-offs: wait_turn, release_turn, store_cg, add_to (utils.cuh).

// dQ[m0 + q] (unscaled) += the sum over the kBlockM keys of dS^T[key][q] K[key] for the kBlockN
// queries q of one tile (dS^T and K in shared memory), handed into p.dq_accum in turn order:
// key blocks from the first (key block 0 sees every tile) to the last. Thread (ty, tx) owns
// queries kQ ty .. kQ ty + kQ - 1 (one float4 or float2 of a dS^T row) and columns
// dim_col(c, tx). Ends with a __syncthreads (shared memory may be refilled after it).
template <class Tr>
__device__ __forceinline__ void simt_hand_off_dq(const FlashParams& p, const float* sdS, const float* sK, int m0,
                                                 int n_block, int ty, int tx) {
  constexpr int kQ = Tr::kBlockN / 16, kC = Tr::kDimCols, kD = Tr::kHeadDim;
  static_assert(kQ == 2 || kQ == 4, "a float2 or float4 of queries");
  float acc[kQ][kC] = {};
#pragma unroll 4
  for (int n = 0; n < Tr::kBlockM; ++n) {
    float w[kQ], bv[kC];
    if constexpr (kQ == 4) {
      const float4 v = ld4(sdS + n * Tr::kScoreRow + 4 * ty);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(sdS + n * Tr::kScoreRow + 2 * ty);
      w[0] = v.x, w[1] = v.y;
    }
    load_dim_cols<Tr>(bv, sK + n * Tr::kRow, tx);
#pragma unroll
    for (int u = 0; u < kQ; ++u)
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[u][c] += w[u] * bv[c];
  }

  const int turn = n_block;
  int* counter = p.dq_counters + int64_t(blockIdx.x) * p.dq_counter_stride + m0 / Tr::kBlockN;
  if (threadIdx.x == 0) wait_turn(counter, turn);
  __syncthreads();
  float* rows = p.dq_accum + (int64_t(blockIdx.x) * p.dq_accum_rows + m0 + kQ * ty) * kD;
#pragma unroll
  for (int u = 0; u < kQ; ++u) {
    if constexpr (kC >= 4) {
#pragma unroll
      for (int g = 0; g < kC / 4; ++g) {
        float4* a = reinterpret_cast<float4*>(rows + u * kD + 64 * g + 4 * tx);
        const float4 v = make_float4(acc[u][4 * g], acc[u][4 * g + 1], acc[u][4 * g + 2], acc[u][4 * g + 3]);
        if (turn > 0) add_to(a, v);
        else store_cg(a, v);
      }
    } else {
      float2* a = reinterpret_cast<float2*>(rows + u * kD + 2 * tx);
      const float2 v = make_float2(acc[u][0], acc[u][1]);
      if (turn > 0) add_to(a, v);
      else store_cg(a, v);
    }
  }
  __syncthreads();  // every thread's writes are issued
  if (threadIdx.x == 0) release_turn(counter, turn + 1);
}

// Purpose: O and L for a tile of kBlockM queries of one (batch, head), on CUDA cores.
// Grid: (B*H, query tiles), causal: the heaviest tile of every head first (blockIdx.y 0 is
// the last query tile), so the light ones, not the heavy, are left for the tail; 256 threads.
// Algorithm: per visible key tile of kBlockN: S = Q K^T * scale (masked), online softmax with
// the running max m and sum l of each row, O = c O + P V; finally O / l and L = m + log l.
template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_fwd_simt_kernel(const FlashParams p) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kR = Tr::kRowsPerThread, kS = Tr::kScoreCols, kC = Tr::kDimCols;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);  // (kM, kRow)
  float* sKV = sQ + kM * Tr::kRow;             // 2 stages of K, V: (kN, kRow) each
  float* sP = sKV + 4 * kN * Tr::kRow;         // (kM, kScoreRow)

  const int T = p.seq, D = p.head_dim;
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kM;
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const E* q = static_cast<const E*>(p.q) + head.offset(p.q_strides);
  const E* k = static_cast<const E*>(p.k) + head.offset(p.k_strides);
  const E* v = static_cast<const E*>(p.v) + head.offset(p.v_strides);

  const int key_end = p.causal ? min(q0 + kM, T) : T;
  // Stage s holds K at sKV + 2 s kN kRow and V right after it.
  auto load_kv = [&](int stage, int k0) {
    simt_load_tile_async<Tr, kN>(sKV + 2 * stage * kN * Tr::kRow, k, p.k_strides.row, k0, T, D);
    simt_load_tile_async<Tr, kN>(sKV + (2 * stage + 1) * kN * Tr::kRow, v, p.v_strides.row, k0, T, D);
  };
  simt_load_tile_async<Tr, kM>(sQ, q, p.q_strides.row, q0, T, D);
  load_kv(0, 0);
  cp_async_commit();
  int row[kR];
  float acc[kR][kC] = {}, row_max[kR], row_sum[kR];  // max in log2 units
#pragma unroll
  for (int i = 0; i < kR; ++i) row[i] = q0 + ty + 16 * i, row_max[i] = -INFINITY, row_sum[i] = 0.f;
  const float scale_log2 = p.scale * kLog2e;

  // Two stages: K and V of the next tile load while this one is computed.
  for (int k0 = 0, stage = 0; k0 < key_end; k0 += kN, stage ^= 1) {
    __syncthreads();  // the previous tile (the other stage) is no longer read
    if (k0 + kN < key_end) load_kv(stage ^ 1, k0 + kN);
    cp_async_commit();
    cp_async_wait<1>();  // this tile has landed
    __syncthreads();
    const float* sK = sKV + 2 * stage * kN * Tr::kRow;
    const float* sV = sK + kN * Tr::kRow;

    float s[kR][kS];
    simt_dots<Tr>(s, sQ, sK, ty, tx);
    const bool mask = k0 + kN > T || (p.causal && k0 + kN - 1 > q0);  // the tile crosses the end or diagonal
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        const int key = k0 + tx + 16 * j;
        s[i][j] = (mask && (key >= T || (p.causal && key > row[i]))) ? -INFINITY : s[i][j] * scale_log2;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float m_new = fmaxf(row_max[i], row_max16(tile_max));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float correction = exp2f(row_max[i] - m_use);
      row_max[i] = m_new;
      row_sum[i] *= correction;
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[i][c] *= correction;
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        const float pv = exp2f(s[i][j] - m_use);
        row_sum[i] += pv;
        sP[(ty + 16 * i) * Tr::kScoreRow + tx + 16 * j] = pv;
      }
    }
    __syncwarp();                                 // the sixteen lanes of a row wrote it; the same lanes read it
    simt_weighted_rows<Tr>(acc, sP, sV, ty, tx);  // O += P V
    __syncwarp();                                 // (sP is rewritten only after the next __syncthreads)
  }

  E* o = static_cast<E*>(p.o) + head.offset(p.o_strides);
  float* lse = p.lse + head.stats_offset(p.heads, T);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const float l = row_sum16(row_sum[i]);
    if (row[i] >= T) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = dim_col<Tr>(c, tx);
      if (d < D) o[int64_t(row[i]) * p.o_strides.row + d] = from_float<E>(acc[i][c] * inv);
    }
    if (tx == 0) lse[row[i]] = l > 0.f ? row_max[i] * 0.6931471805599453f + logf(l) : INFINITY;
  }
}

// Purpose: dK, dV of a tile of kBlockM keys of one (batch, head), on CUDA cores.
// Grid: (B*H, key tiles): key block blockIdx.y, the first (heaviest, causal) of every head
// first; 256 threads; stationary rows are keys, score columns are queries.
// Algorithm: per query tile of kBlockN that can see the keys, from the last: S^T = K Q^T,
// P^T = exp(S^T scale - L), dP^T = V dO^T, dS^T = P^T (dP^T - D); dV += P^T dO,
// dK += dS^T Q; finally dK *= scale. The next query tile (Q, dO, L, D) loads while the dQ
// part runs (one stage: a second would leave shared memory for one CTA per SM).
// kFusedDq (FlashAttention-2's five products instead of seven, deterministic): also
// dQ_tile += dS K, added into p.dq_accum (fp32) in a fixed order per query tile (turns): key
// blocks from the first to the last, i.e. the head's CTAs in blockIdx.y order, so a CTA only
// waits for CTAs dispatched before it (no deadlock); the first turn writes instead of adding.
// Every CTA walks the query tiles from the last, so the key blocks of a head reach a tile at
// the same step and wait only for each other's hand-offs. p.dq_counters must be zero.
template <class Tr, class E, bool kFusedDq = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kBwdKvMinBlocks) flash_bwd_dkdv_simt_kernel(const FlashParams p) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kR = Tr::kRowsPerThread, kS = Tr::kScoreCols, kC = Tr::kDimCols;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sK = reinterpret_cast<float*>(smem);  // (kM, kRow) each
  float* sV = sK + kM * Tr::kRow;
  float* sQ = sV + kM * Tr::kRow;  // (kN, kRow) each
  float* sdO = sQ + kN * Tr::kRow;
  float* sP = sdO + kN * Tr::kRow;       // (kM, kScoreRow): P^T
  float* sdS = sP + kM * Tr::kScoreRow;  // (kM, kScoreRow): dS^T
  float* sL = sdS + kM * Tr::kScoreRow;  // (kN): L of the query tile
  float* sDelta = sL + kN;               // (kN)

  const int T = p.seq, D = p.head_dim;
  const int n_block = int(blockIdx.y), k0 = n_block * kM;
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const E* q = static_cast<const E*>(p.q) + head.offset(p.q_strides);
  const E* dout = static_cast<const E*>(p.dout) + head.offset(p.dout_strides);
  const float* lse = p.lse + head.stats_offset(p.heads, T);
  const float* delta = p.delta + head.stats_offset(p.heads, T);

  // Causal: earlier queries see none of these keys (k0 is a multiple of kN).
  const int m_last = (T - 1) / kN * kN, m_first = p.causal ? k0 : 0;
  // L and D by cp.async too where the head's rows are 16-byte aligned: one warp, a chunk of four
  // queries per lane, zero-filled past T; the chunk that T cuts goes by element (a 16-byte copy
  // of fewer source bytes reads only those, but compute-sanitizer's memcheck counts all 16).
  const bool rows_aligned = reinterpret_cast<uintptr_t>(lse) % 16 == 0 && reinterpret_cast<uintptr_t>(delta) % 16 == 0;
  auto load_tile = [&](int m0) {  // Q, dO, L and D of the query tile at m0
    simt_load_tile_async<Tr, kN>(sQ, q, p.q_strides.row, m0, T, D);
    simt_load_tile_async<Tr, kN>(sdO, dout, p.dout_strides.row, m0, T, D);
    if (rows_aligned) {
      static_assert(kN / 2 <= Tr::kThreads, "one chunk per thread");
      if (threadIdx.x < kN / 2) {
        const int c = 4 * (threadIdx.x % (kN / 4)), left = T - m0 - c, bytes = left > 0 ? 4 * min(4, left) : 0;
        const float* src = threadIdx.x < kN / 4 ? lse : delta;
        float* dst = (threadIdx.x < kN / 4 ? sL : sDelta) + c;
        if (bytes == 16 || bytes == 0) {
          cp_async_16(dst, bytes > 0 ? src + m0 + c : src, bytes);
        } else {
          for (int e = 0; e < 4; ++e)
            cp_async_4(dst + e, 4 * e < bytes ? src + m0 + c + e : src, 4 * e < bytes ? 4 : 0);
        }
      }
    } else {
      for (int i = threadIdx.x; i < kN; i += Tr::kThreads) {
        sL[i] = m0 + i < T ? lse[m0 + i] : 0.f;
        sDelta[i] = m0 + i < T ? delta[m0 + i] : 0.f;
      }
    }
  };
  simt_load_tile_async<Tr, kM>(sK, static_cast<const E*>(p.k) + head.offset(p.k_strides), p.k_strides.row, k0, T, D);
  simt_load_tile_async<Tr, kM>(sV, static_cast<const E*>(p.v) + head.offset(p.v_strides), p.v_strides.row, k0, T, D);
  load_tile(m_last);
  cp_async_commit();
  int key[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) key[i] = k0 + ty + 16 * i;
  float dk[kR][kC] = {}, dv[kR][kC] = {};
  const float scale_log2 = p.scale * kLog2e;

  for (int m0 = m_last; m0 >= m_first; m0 -= kN) {
    cp_async_wait<0>();  // this query tile
    __syncthreads();

    float s[kR][kS], dp[kR][kS];
    simt_dots<Tr>(s, sK, sQ, ty, tx);
    simt_dots<Tr>(dp, sV, sdO, ty, tx);
    const bool mask = m0 + kN > T || k0 + kM > T || (p.causal && k0 + kM - 1 > m0);
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        const int col = tx + 16 * j, query = m0 + col;
        const bool masked = mask && (query >= T || key[i] >= T || (p.causal && key[i] > query));
        const float pv = masked ? 0.f : exp2f(s[i][j] * scale_log2 - sL[col] * kLog2e);
        sP[(ty + 16 * i) * Tr::kScoreRow + col] = pv;
        sdS[(ty + 16 * i) * Tr::kScoreRow + col] = pv * (dp[i][j] - sDelta[col]);
      }
    if constexpr (kFusedDq) __syncthreads();  // the dQ part reads every key's dS^T row
    else __syncwarp();
    simt_weighted_rows<Tr>(dv, sP, sdO, ty, tx);  // dV += P^T dO
    simt_weighted_rows<Tr>(dk, sdS, sQ, ty, tx);  // dK += dS^T Q
    __syncthreads();  // the query tile is no longer read: the next one's load overlaps the dQ part
    if (m0 - kN >= m_first) load_tile(m0 - kN);
    cp_async_commit();
    if constexpr (kFusedDq) simt_hand_off_dq<Tr>(p, sdS, sK, m0, n_block, ty, tx);  // dQ += dS K
  }

  E* dk_out = static_cast<E*>(p.dk) + head.offset(p.dk_strides);
  E* dv_out = static_cast<E*>(p.dv) + head.offset(p.dv_strides);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    if (key[i] >= T) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = dim_col<Tr>(c, tx);
      if (d >= D) continue;
      dk_out[int64_t(key[i]) * p.dk_strides.row + d] = from_float<E>(dk[i][c] * p.scale);
      dv_out[int64_t(key[i]) * p.dv_strides.row + d] = from_float<E>(dv[i][c]);
    }
  }
}

// Purpose: dQ of a tile of kBlockM queries of one (batch, head), on CUDA cores.
// Grid: (B*H, query tiles), heaviest first (as the forward); 256 threads; stationary rows are
// queries.
// Algorithm: per visible key tile of kBlockN: S = Q K^T, P = exp(S scale - L), dP = dO V^T,
// dS = P (dP - D), dQ += dS K; finally dQ *= scale.
template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_bwd_dq_simt_kernel(const FlashParams p) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kR = Tr::kRowsPerThread, kS = Tr::kScoreCols, kC = Tr::kDimCols;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);  // (kM, kRow) each
  float* sdO = sQ + kM * Tr::kRow;
  float* sK = sdO + kM * Tr::kRow;  // (kN, kRow) each
  float* sV = sK + kN * Tr::kRow;
  float* sdS = sV + kN * Tr::kRow;  // (kM, kScoreRow)

  const int T = p.seq, D = p.head_dim;
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kM;
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const E* k = static_cast<const E*>(p.k) + head.offset(p.k_strides);
  const E* v = static_cast<const E*>(p.v) + head.offset(p.v_strides);
  const float* lse = p.lse + head.stats_offset(p.heads, T);
  const float* delta = p.delta + head.stats_offset(p.heads, T);

  simt_load_tile<Tr, kM>(sQ, static_cast<const E*>(p.q) + head.offset(p.q_strides), p.q_strides.row, q0, T, D);
  simt_load_tile<Tr, kM>(sdO, static_cast<const E*>(p.dout) + head.offset(p.dout_strides), p.dout_strides.row, q0, T,
                         D);
  int row[kR];
  float row_lse[kR], row_delta[kR], dq[kR][kC] = {};
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    row[i] = q0 + ty + 16 * i;
    row_lse[i] = row[i] < T ? lse[row[i]] * kLog2e : 0.f;
    row_delta[i] = row[i] < T ? delta[row[i]] : 0.f;
  }
  const float scale_log2 = p.scale * kLog2e;
  const int key_end = p.causal ? min(q0 + kM, T) : T;

  for (int k0 = 0; k0 < key_end; k0 += kN) {
    __syncthreads();
    simt_load_tile<Tr, kN>(sK, k, p.k_strides.row, k0, T, D);
    simt_load_tile<Tr, kN>(sV, v, p.v_strides.row, k0, T, D);
    __syncthreads();

    float s[kR][kS], dp[kR][kS];
    simt_dots<Tr>(s, sQ, sK, ty, tx);
    simt_dots<Tr>(dp, sdO, sV, ty, tx);
    const bool mask = k0 + kN > T || (p.causal && k0 + kN - 1 > q0);
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        const int key = k0 + tx + 16 * j;
        const bool masked = mask && (key >= T || (p.causal && key > row[i]));
        const float pv = masked ? 0.f : exp2f(s[i][j] * scale_log2 - row_lse[i]);
        sdS[(ty + 16 * i) * Tr::kScoreRow + tx + 16 * j] = pv * (dp[i][j] - row_delta[i]);
      }
    __syncwarp();
    simt_weighted_rows<Tr>(dq, sdS, sK, ty, tx);  // dQ += dS K
  }

  E* dq_out = static_cast<E*>(p.dq) + head.offset(p.dq_strides);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    if (row[i] >= T) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = dim_col<Tr>(c, tx);
      if (d < D) dq_out[int64_t(row[i]) * p.dq_strides.row + d] = from_float<E>(dq[i][c] * p.scale);
    }
  }
}

// Purpose: dQ (B,T,H,D) = scale * the fp32 accumulator (B*H, p.dq_accum_rows, kHeadDim) that
// flash_bwd_dkdv_simt_kernel<Tr, E, true> summed. Grid (float4s of a head / blockDim.x, B*H):
// one thread per four elements, read as a float4 (and written as one: fp32 rows of whole
// float4s).
template <class Tr, class E>
__global__ void flash_bwd_dq_convert_simt_kernel(const FlashParams p) {
  constexpr int kGroups = Tr::kHeadDim / 4;  // float4s per accumulator row
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x), t = i / kGroups, d = 4 * (i % kGroups);
  if (t >= p.seq || d >= p.head_dim) return;
  const HeadOffsets head = head_offsets(int(blockIdx.y), p.heads);
  const float4 v = ld4(p.dq_accum + (int64_t(blockIdx.y) * p.dq_accum_rows + t) * Tr::kHeadDim + d);
  E* dq = static_cast<E*>(p.dq) + head.offset(p.dq_strides, t) + d;
  if constexpr (std::is_same_v<E, float>) {
    if (p.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(dq) % 16 == 0) {
      *reinterpret_cast<float4*>(dq) = make_float4(v.x * p.scale, v.y * p.scale, v.z * p.scale, v.w * p.scale);
      return;
    }
  }
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (d + u < p.head_dim) dq[u] = from_float<E>(comp(v, u) * p.scale);
}

}  // namespace llmhpc::flash

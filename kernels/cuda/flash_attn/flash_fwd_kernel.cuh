// FlashAttention-2 forward on tensor cores (bf16 storage, fp32 accumulation).
#pragma once
#include "kernels/cuda/flash_attn/block_info.cuh"
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/kernel_traits.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

// Purpose: O (B,T,H,D) and L (B,H,T) for one tile of kBlockM queries of one (batch, head).
// Grid: (B*H, query tiles): the heaviest tile of every head first; warp w owns the 16*kMTiles
// queries from q0 + 16 kMTiles w on.
// Algorithm (per key tile of kBlockN, only tiles the causal mask does not hide completely):
//   S = Q K^T                          (tensor cores; Q and K from shared memory)
//   S *= scale * log2(e); masked entries (key >= T, or key > query when causal) = -inf
//   m_new = max(m, rowmax S);  c = 2^(m - m_new);  P = 2^(S - m_new)   (fp32 registers)
//   l = c l + rowsum P;  O = c O + P V  (P rounded to bf16 in registers, V from shared memory)
// then O / l and L = (m + log2 l) ln 2. K of the next tile streams in (cp.async) while P V
// runs; V of a tile streams in while Q K^T runs. Query tiles run heaviest first (causal).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) flash_fwd_mma_kernel(const FlashParams p) {
  constexpr int kD = Tr::kHeadDim, kM = Tr::kBlockM, kN = Tr::kBlockN, kRow = Tr::kSmemRow, kMT = Tr::kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // (kM, kRow)
  bf16* sK = sQ + kM * kRow;                 // (kN, kRow)
  bf16* sV = sK + kN * kRow;                 // (kN, kRow)

  const int T = p.seq, D = p.head_dim;
  const int m_block = int(gridDim.y) - 1 - int(blockIdx.y);
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int q0 = m_block * kM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;  // fragment row group and column pair

  const bf16* q = static_cast<const bf16*>(p.q) + head.offset(p.q_strides);
  const bf16* k = static_cast<const bf16*>(p.k) + head.offset(p.k_strides);
  const bf16* v = static_cast<const bf16*>(p.v) + head.offset(p.v_strides);
  bf16* o = static_cast<bf16*>(p.o) + head.offset(p.o_strides);
  float* lse = p.lse + head.stats_offset(p.heads, T);

  const int key_end = p.causal ? min(q0 + kM, T) : T;  // later keys are hidden from every query here
  const int n_tiles = (key_end + kN - 1) / kN;

  load_tile_async<Tr, kM>(sQ, q, p.q_strides.row, q0, T, D);
  load_tile_async<Tr, kN>(sK, k, p.k_strides.row, 0, T, D);
  cp_async_commit();

  // This thread's rows: g and g + 8 (r = 0, 1) of each of the warp's m tiles t.
  const int warp_q0 = q0 + warp * 16 * kMT;
  float acc_o[kMT][kD / 8][4];  // O: columns 8j + 2c, 8j + 2c + 1 of rows g (0, 1) and g+8 (2, 3)
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) acc_o[t][j][0] = acc_o[t][j][1] = acc_o[t][j][2] = acc_o[t][j][3] = 0.f;
  float row_max[kMT][2], row_sum[kMT][2];  // in log2 units
#pragma unroll
  for (int t = 0; t < kMT; ++t) row_max[t][0] = row_max[t][1] = -INFINITY, row_sum[t][0] = row_sum[t][1] = 0.f;
  const float scale_log2 = p.scale * kLog2e;

  for (int n = 0; n < n_tiles; ++n) {
    const int k0 = n * kN;
    load_tile_async<Tr, kN>(sV, v, p.v_strides.row, k0, T, D);
    cp_async_commit();
    cp_async_wait<1>();  // Q and this K tile have landed (V may still be in flight)
    __syncthreads();

    // Under causal, a warp whose queries all precede this key tile skips its products (with
    // two m tiles per warp, the last key tile is such a tile for the first two warps); its
    // S stays 0, is masked to -inf below, and leaves m, l and O as they are.
    const bool visible = !p.causal || k0 <= warp_q0 + 16 * kMT - 1;
    float s[kMT][kN / 8][4];  // S: columns k0 + 8j + 2c (+1) of rows g (0, 1) and g+8 (2, 3) of m tile t
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.f;
    if (visible) warp_gemm_rows_rows<kD, kMT, kN / 8, kRow>(s, sQ + warp * 16 * kMT * kRow, sK, lane);

    cp_async_wait<0>();  // V has landed
    __syncthreads();     // ... and every warp is done reading sK
    if (n + 1 < n_tiles) {
      load_tile_async<Tr, kN>(sK, k, p.k_strides.row, k0 + kN, T, D);
      cp_async_commit();
    }

    // Scale to log2 units and mask. Only the last tile (keys past T) and, under causal, the
    // tiles crossing this warp's diagonal need the mask.
    const bool need_mask = k0 + kN > T || (p.causal && k0 + kN - 1 > warp_q0);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][j][e] *= scale_log2;
    if (need_mask) {
      int query[kMT][2];
#pragma unroll
      for (int t = 0; t < kMT; ++t) query[t][0] = warp_q0 + 16 * t + g, query[t][1] = query[t][0] + 8;
      mask_keys(s, query, k0, T, p.causal);
    }

    // Online softmax: the four threads of a quad share a row.
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(s[t][j][2 * r], s[t][j][2 * r + 1]));
        tile_max = quad_max(tile_max);
        const float m_new = fmaxf(row_max[t][r], tile_max);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;       // no visible key yet: keep everything 0
        const float correction = fast_exp2(row_max[t][r] - m_use);  // 0 while row_max is -inf
        row_max[t][r] = m_new;
        row_sum[t][r] *= correction;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          acc_o[t][j][2 * r] *= correction;
          acc_o[t][j][2 * r + 1] *= correction;
        }
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          s[t][j][2 * r] = fast_exp2(s[t][j][2 * r] - m_use);
          s[t][j][2 * r + 1] = fast_exp2(s[t][j][2 * r + 1] - m_use);
          row_sum[t][r] += s[t][j][2 * r] + s[t][j][2 * r + 1];  // this thread's part; summed over the quad at the end
        }
      }

    if (visible) warp_gemm_regs_rows<kN / 16, kMT, kD / 8, kRow>(acc_o, s, sV, lane);  // O += P V
    __syncthreads();  // every warp is done reading sV before the next tile overwrites it
  }

  // O = acc / l, stored as bf16 pairs; L = (m + log2 l) * ln 2 by one thread of each quad.
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_q0 + 16 * t + g + 8 * r;
      const float l = quad_sum(row_sum[t][r]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (row >= T) continue;
      bf16* o_row = o + int64_t(row) * p.o_strides.row;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = 8 * j + 2 * c;
        if (col < D)
          *reinterpret_cast<uint32_t*>(o_row + col) = pack_bf16(acc_o[t][j][2 * r] * inv, acc_o[t][j][2 * r + 1] * inv);
      }
      if (c == 0) lse[row] = l > 0.f ? (row_max[t][r] + log2f(l)) * 0.6931471805599453f : INFINITY;
    }
}

}  // namespace llmhpc::flash

// FlashAttention-2 backward on tensor cores (bf16 storage, fp32 accumulation), plus the
// preprocessing kernel shared with the CUDA-core path. Split (seven products, no atomics):
//   1. delta:  D_i = rowsum(dO_i * O_i)                              (B,H,T) fp32
//   2. dK, dV: one CTA per tile of keys, looping over query tiles   (key-stationary)
//   3. dQ:     one CTA per tile of queries, looping over key tiles  (query-stationary)
// Every output element is written once, by one thread, after a fixed-order sum: the
// backward is bitwise deterministic. Fused (five products, FlashAttention-2's kernel and warp
// layouts): 2. is flash_bwd_fused_mma_kernel, which also adds each query tile's share of dQ
// into an fp32 accumulator with atomics, and 3. is a conversion
// (flash_bwd_dq_convert_mma_kernel): faster where the grid fills the GPU, but the order of the
// fp32 additions, so dQ's last bits, vary from run to run.
#pragma once
#include "kernels/cuda/flash_attn/block_info.cuh"
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/kernel_traits.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

// The dot product of eight (bf16) or four (fp32) elements of two rows: one 16-byte load each.
__device__ __forceinline__ float dot16(const float* a, const float* b) {
  const float4 x = *reinterpret_cast<const float4*>(a), y = *reinterpret_cast<const float4*>(b);
  return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}
__device__ __forceinline__ float dot16(const bf16* a, const bf16* b) {
  const uint4 u = *reinterpret_cast<const uint4*>(a), v = *reinterpret_cast<const uint4*>(b);
  const uint32_t x[4] = {u.x, u.y, u.z, u.w}, y[4] = {v.x, v.y, v.z, v.w};
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += bf16_half(x[i / 2], i % 2) * bf16_half(y[i / 2], i % 2);
  return sum;
}
// Elements of E per 16-byte load, and the lanes the delta kernel gives a row: the fewest (a
// power of two, at most 32) whose loads cover the head dim.
template <class E>
constexpr int kDeltaVec = int(16 / sizeof(E));
template <class E>
__host__ __device__ inline int delta_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < 32 && lanes * kDeltaVec<E> < head_dim) lanes *= 2;
  return lanes;
}

// The rows of delta_kernel, kLanes lanes each: a warp takes 32 / kLanes rows per step; lane l
// reads elements kVec l + kVec kLanes i of a row (16 bytes at once where vec), then the row's
// lanes sum by shuffles.
template <class E, int kLanes>
__device__ __forceinline__ void delta_rows(const FlashParams& p, bool vec) {
  constexpr int kVec = kDeltaVec<E>, kRowsPerWarp = 32 / kLanes;
  const int rows = p.seq * p.heads, lane = threadIdx.x % kLanes, b = int(blockIdx.y);
  const int warps = int(gridDim.x) * int(blockDim.x / 32);
  for (int w = int(blockIdx.x) * int(blockDim.x / 32) + int(threadIdx.x / 32); kRowsPerWarp * w < rows; w += warps) {
    const int r = kRowsPerWarp * w + int(threadIdx.x % 32) / kLanes;
    const int t = unsigned(r) / unsigned(p.heads);
    const HeadOffsets head{b, int(unsigned(r) % unsigned(p.heads))};
    const E* o = static_cast<const E*>(p.o) + head.offset(p.o_strides, t);
    const E* dout = static_cast<const E*>(p.dout) + head.offset(p.dout_strides, t);
    const int dims = r < rows ? p.head_dim : 0;
    float sum = 0.f;
    if (vec) {
      for (int d = kVec * lane; d < dims; d += kVec * kLanes) sum += dot16(o + d, dout + d);
    } else {
      for (int d = lane; d < dims; d += kLanes) sum += to_float(o[d]) * to_float(dout[d]);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0 && r < rows) p.delta[head.stats_offset(p.heads, p.seq) + t] = sum;
  }
}

// Purpose: delta (B,H,T) = rowsum(dO * O) in fp32, the term that replaces the row sums of
// dP P in the softmax backward; also zeroes the turn counters of the CUDA-core fused dQ
// (p.dq_counters) and of the tensor-core chunks (p.kv_turns, p.q_turns), and the fused
// tensor-core backward's dQ accumulator (p.dq_atomic), when set, which saves the backward a
// memset (as FlashAttention-2's dot(dO, O) kernel clears its dQ accumulator). Grid: (row
// blocks, B), any number of row blocks; the rows (t, h) of one batch entry, so that 32-bit
// index arithmetic suffices. delta_lanes(head dim) lanes per row (delta_rows): 4 at head dim
// 32 in bf16, 16 at 128, each loading 16 bytes of O and of dO at a time, where the rows are
// 16-byte aligned; element by element where they are not.
template <class E>
__global__ void flash_bwd_delta_kernel(const FlashParams p) {
  constexpr int kAlign = 16, kVec = kDeltaVec<E>;
  const bool vec = p.head_dim % kVec == 0 && reinterpret_cast<uintptr_t>(p.o) % kAlign == 0 &&
                   reinterpret_cast<uintptr_t>(p.dout) % kAlign == 0 && p.o_strides.batch % kVec == 0 &&
                   p.o_strides.row % kVec == 0 && p.o_strides.head % kVec == 0 && p.dout_strides.batch % kVec == 0 &&
                   p.dout_strides.row % kVec == 0 && p.dout_strides.head % kVec == 0;
  switch (delta_lanes<E>(p.head_dim)) {
    case 1: delta_rows<E, 1>(p, vec); break;
    case 2: delta_rows<E, 2>(p, vec); break;
    case 4: delta_rows<E, 4>(p, vec); break;
    case 8: delta_rows<E, 8>(p, vec); break;
    case 16: delta_rows<E, 16>(p, vec); break;
    default: delta_rows<E, 32>(p, vec); break;
  }
  // The counters of the hand-offs that follow (fused dQ, chunks), when there are.
  const int64_t threads = int64_t(gridDim.x) * gridDim.y * blockDim.x;
  const int64_t first = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.dq_counters)
    for (int64_t i = first, n = int64_t(p.batch) * p.heads * p.dq_counter_stride; i < n; i += threads)
      p.dq_counters[i] = 0;
  if (int* turns = p.kv_turns ? p.kv_turns : p.q_turns)  // q_turns follow kv_turns
    for (int64_t i = first; i < p.turn_count; i += threads) turns[i] = 0;
  if (p.dq_atomic)  // whole tiles of float4s, 16-byte aligned (flash_api.cu's scratch)
    for (int64_t i = first, n = p.dq_atomic_floats / 4; i < n; i += threads)
      reinterpret_cast<float4*>(p.dq_accum)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// The fused backward's dQ: a query tile's share dS K of a CTA's 128 keys is
// split over the 8 warps, kDqWarpsQ along the queries x the rest along the head dim; warp w
// holds the 16 kDqMTiles queries from dq_share(w).query and the kDqDims dims from .dim in
// accumulator fragments, and adds them to the tile's fp32 accumulator as float4s by `red` (no
// return value; atomicAdd compiles to ATOM, 1.12x slower: docs/results/attention.md), float4 (t, j) of
// thread x at (t kDqDims / 8 + j) kThreads + x (one warp's additions cover 512 contiguous
// bytes); the conversion kernel reads them back the same way.
struct DqShare {
  int query, dim;
};
template <class Tr>
__device__ __forceinline__ DqShare dq_share(int warp) {
  return {16 * Tr::kDqMTiles * (warp % Tr::kDqWarpsQ), Tr::kDqDims * (warp / Tr::kDqWarpsQ)};
}
// Query tile `query_tile` of head `bh` (b * heads + h) in the accumulator: tiles of
// kBlockN x kHeadDim floats, a head's ceil(T / kBlockN) of them after another.
template <class Tr>
__device__ __forceinline__ float4* dq_accum_tile(const FlashParams& p, int bh, int query_tile) {
  const int64_t tiles = (p.seq + Tr::kBlockN - 1) / Tr::kBlockN;
  return reinterpret_cast<float4*>(p.dq_accum) + (bh * tiles + query_tile) * (Tr::kBlockN * Tr::kHeadDim / 4);
}

// The dK/dV kernels' shared memory: K and V of the CTA's kBlockM keys, two stages of Q, dO
// (kBlockN rows each), L and D, then what the kernel adds (`rest`).
struct KvSmem {
  bf16 *k, *v, *q, *dout;
  float *lse, *delta;
  unsigned char* rest;
};
template <class Tr>
__device__ __forceinline__ KvSmem kv_smem(unsigned char* smem) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kRow = Tr::kSmemRow;
  KvSmem s;
  s.k = reinterpret_cast<bf16*>(smem);                       // (kM, kRow)
  s.v = s.k + kM * kRow;                                     // (kM, kRow)
  s.q = s.v + kM * kRow;                                     // 2 stages of (kN, kRow)
  s.dout = s.q + 2 * kN * kRow;                              // 2 stages of (kN, kRow)
  s.lse = reinterpret_cast<float*>(s.dout + 2 * kN * kRow);  // 2 stages of kN
  s.delta = s.lse + 2 * kN;                                  // 2 stages of kN
  s.rest = reinterpret_cast<unsigned char*>(s.delta + 2 * kN);
  return s;
}

// The dK/dV kernels' streamed stage: Q and dO rows [m0, m0 + kN) into sQ, sdO (kN rows of
// Tr::kSmemRow) and their L and D into sL, sDelta (0 past T), all by cp.async.
template <class Tr, int kN>
__device__ __forceinline__ void load_query_stage(bf16* sQ, bf16* sdO, float* sL, float* sDelta,
                                                 const HeadInputs<bf16>& in, const FlashParams& p, int m0) {
  static_assert(kN <= Tr::kThreads, "a thread copies one row's L and D");
  load_tile_async<Tr, kN>(sQ, in.q, p.q_strides.row, m0, p.seq, p.head_dim);
  load_tile_async<Tr, kN>(sdO, in.dout, p.dout_strides.row, m0, p.seq, p.head_dim);
  if (const int i = threadIdx.x; i < kN) {
    const bool valid = m0 + i < p.seq;
    cp_async_4(sL + i, valid ? in.lse + m0 + i : in.lse, valid ? 4 : 0);
    cp_async_4(sDelta + i, valid ? in.delta + m0 + i : in.delta, valid ? 4 : 0);
  }
}

// The dK/dV kernels' epilogue: dK (times the softmax scale) and dV from a warp's accumulator
// fragments, m tile t holding keys key0 + 16t + g (+8), n tile j dims dim0 + 8j + 2c (+1);
// keys past T and dims past the head dim are not stored.
template <int kMT, int kJ>
__device__ __forceinline__ void store_dk_dv(const FlashParams& p, const HeadOffsets& head,
                                            const float (&acc_dk)[kMT][kJ][4], const float (&acc_dv)[kMT][kJ][4],
                                            int key0, int dim0, int lane) {
  const int g = lane / 4, c = lane % 4;
  bf16* dk = static_cast<bf16*>(p.dk) + head.offset(p.dk_strides);
  bf16* dv = static_cast<bf16*>(p.dv) + head.offset(p.dv_strides);
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 16 * t + g + 8 * r;
      if (key >= p.seq) continue;
      bf16* dk_row = dk + int64_t(key) * p.dk_strides.row;
      bf16* dv_row = dv + int64_t(key) * p.dv_strides.row;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int col = dim0 + 8 * j + 2 * c;
        if (col >= p.head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk_row + col) =
            pack_bf16(acc_dk[t][j][2 * r] * p.scale, acc_dk[t][j][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_row + col) = pack_bf16(acc_dv[t][j][2 * r], acc_dv[t][j][2 * r + 1]);
      }
    }
}

// Purpose: dK and dV (B,T,H,D) of one tile of kBlockM keys of one (batch, head).
// Grid: (B*H, key tiles, chunks): the heaviest (first, causal) tile of every head first; warp
// w owns the 16*kMTiles keys from k0 + 16 kMTiles w on. Chunked (p.kv_chunk > 0, grids too
// small to fill the GPU): CTA z takes query tiles [z kv_chunk, (z + 1) kv_chunk) of those the
// keys see, and the chunks' sums meet in p.kv_accum (hand_off_chunk, chunk order).
// Algorithm (per query tile of kBlockN that can see the keys; causal: from the one holding
// query k0 on), everything transposed so that the warp's keys are the rows:
//   S^T = K Q^T;  P^T = 2^(S^T scale log2e - L log2e)  (masked: 0)     P recomputed from L
//   dV += P^T dO                                         (P^T rounded to bf16)
//   dP^T = V dO^T;  dS^T = P^T (dP^T - D)
//   dK += dS^T Q                                         (dS^T rounded to bf16)
// then dK *= scale. Q, dO, L and D of the next query tile stream in (cp.async, two stages)
// while this one is computed.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dkdv_mma_kernel(const FlashParams p) {
  constexpr int kD = Tr::kHeadDim, kM = Tr::kBlockM, kN = Tr::kBlockN, kRow = Tr::kSmemRow, kMT = Tr::kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  const KvSmem sm = kv_smem<Tr>(smem);
  bf16 *sK = sm.k, *sV = sm.v, *sQ = sm.q, *sdO = sm.dout;
  float *sL = sm.lse, *sDelta = sm.delta;

  const int T = p.seq, D = p.head_dim;
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int k0 = int(blockIdx.y) * kM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  const HeadInputs<bf16> in = head_inputs<bf16>(p, head);
  const bf16 *k = in.k, *v = in.v;

  const int m_first = p.causal ? k0 / kN : 0;  // earlier query tiles see none of these keys
  const int m_end = (T + kN - 1) / kN;
  const ChunkRange chunk = chunk_range(m_first, m_end, p.kv_chunk);
  const int m_begin = chunk.begin, m_stop = chunk.stop;
  if (m_begin >= m_stop) return;  // the grid has as many chunks as the heaviest tile

  auto load_stage = [&](int stage, int m0) {  // Q, dO, L and D of query tile m0 / kN
    load_query_stage<Tr, kN>(sQ + stage * kN * kRow, sdO + stage * kN * kRow, sL + stage * kN, sDelta + stage * kN, in,
                             p, m0);
  };

  load_tile_async<Tr, kM>(sK, k, p.k_strides.row, k0, T, D);
  load_tile_async<Tr, kM>(sV, v, p.v_strides.row, k0, T, D);
  load_stage(0, m_begin * kN);
  cp_async_commit();

  float acc[2][kMT][kD / 8][4];  // dK, dV
  auto& acc_dk = acc[0];
  auto& acc_dv = acc[1];
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[t][j][e] = acc_dv[t][j][e] = 0.f;
  int key[kMT][2];  // this thread's keys: rows g, g + 8 of each m tile
#pragma unroll
  for (int t = 0; t < kMT; ++t) key[t][0] = k0 + (warp * kMT + t) * 16 + g, key[t][1] = key[t][0] + 8;
  const float scale_log2 = p.scale * kLog2e;

  for (int m = m_begin; m < m_stop; ++m) {
    const int stage = (m - m_begin) & 1, m0 = m * kN;
    if (m + 1 < m_stop) {  // the stage the previous iteration used is free (barrier after its last read)
      load_stage(stage ^ 1, m0 + kN);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* sQs = sQ + stage * kN * kRow;
    const bf16* sdOs = sdO + stage * kN * kRow;
    const float* sLs = sL + stage * kN;
    const float* sDs = sDelta + stage * kN;

    // P^T (16 keys x kN queries per m tile): columns 8j + 2c (+1) of rows g (0, 1), g+8 (2, 3).
    float pt[kMT][kN / 8][4];
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) pt[t][j][0] = pt[t][j][1] = pt[t][j][2] = pt[t][j][3] = 0.f;
    warp_gemm_rows_rows<kD, kMT, kN / 8, kRow>(pt, sK + warp * 16 * kMT * kRow, sQs, lane);
    const bool need_mask = m0 + kN > T || k0 + kM > T || (p.causal && k0 + kM - 1 > m0);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pt[t][j][e] = pt[t][j][e] * scale_log2 - sLs[8 * j + 2 * c + (e & 1)] * kLog2e;
    if (need_mask) {  // key kk < T is seen by queries [kk, T - 1] (causal) or [0, T - 1]; past T by none
      int lo[kMT][2], hi[kMT][2];
#pragma unroll
      for (int t = 0; t < kMT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          lo[t][r] = p.causal ? key[t][r] - m0 - 2 * c : -kNoColumnLimit;
          hi[t][r] = key[t][r] < T ? T - 1 - m0 - 2 * c : -kNoColumnLimit;
        }
      mask_outside(pt, lo, hi);
    }
    exp2_tile(pt);

    warp_gemm_regs_rows<kN / 16, kMT, kD / 8, kRow>(acc_dv, pt, sdOs, lane);  // dV += P^T dO

    float dst[kMT][kN / 8][4];  // dP^T, then dS^T
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) dst[t][j][0] = dst[t][j][1] = dst[t][j][2] = dst[t][j][3] = 0.f;
    warp_gemm_rows_rows<kD, kMT, kN / 8, kRow>(dst, sV + warp * 16 * kMT * kRow, sdOs, lane);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[t][j][e] = pt[t][j][e] * (dst[t][j][e] - sDs[8 * j + 2 * c + (e & 1)]);

    warp_gemm_regs_rows<kN / 16, kMT, kD / 8, kRow>(acc_dk, dst, sQs, lane);  // dK += dS^T Q
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  if (chunk.count > 1 && !hand_off_chunk(acc, p.kv_accum, p.kv_turns, chunk)) return;
  store_dk_dv(p, head, acc_dk, acc_dv, k0 + warp * kMT * 16, 0, lane);
}

// Purpose: dQ (B,T,H,D) of one tile of kBlockM queries of one (batch, head).
// Grid: (B*H, query tiles, chunks): the heaviest tile of every head first; warp w owns the
// 16*kMTiles queries from q0 + 16 kMTiles w on. Chunked (p.q_chunk > 0): CTA z takes key tiles
// [z q_chunk, (z + 1) q_chunk) of those the queries see; sums meet in p.q_accum, as in dK/dV.
// Algorithm (per key tile of kBlockN the queries can see):
//   S = Q K^T;  P = 2^(S scale log2e - L log2e)  (masked: 0)
//   dP = dO V^T;  dS = P (dP - D);  dQ += dS K    (dS rounded to bf16)
// then dQ *= scale. K and V of the next key tile stream in while this one is computed.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dq_mma_kernel(const FlashParams p) {
  constexpr int kD = Tr::kHeadDim, kM = Tr::kBlockM, kN = Tr::kBlockN, kRow = Tr::kSmemRow, kMT = Tr::kMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // (kM, kRow)
  bf16* sdO = sQ + kM * kRow;                // (kM, kRow)
  bf16* sK = sdO + kM * kRow;                // 2 stages of (kN, kRow)
  bf16* sV = sK + 2 * kN * kRow;             // 2 stages of (kN, kRow)

  const int T = p.seq, D = p.head_dim;
  const int m_block = int(gridDim.y) - 1 - int(blockIdx.y);
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int q0 = m_block * kM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  const HeadInputs<bf16> in = head_inputs<bf16>(p, head);
  const bf16 *q = in.q, *k = in.k, *v = in.v, *dout = in.dout;
  const float *lse = in.lse, *delta = in.delta;

  const int key_end = p.causal ? min(q0 + kM, T) : T;
  const int n_tiles = (key_end + kN - 1) / kN;
  const ChunkRange chunk = chunk_range(0, n_tiles, p.q_chunk);
  const int n_begin = chunk.begin, n_stop = chunk.stop;
  if (n_begin >= n_stop) return;  // the grid has as many chunks as the heaviest tile

  load_tile_async<Tr, kM>(sQ, q, p.q_strides.row, q0, T, D);
  load_tile_async<Tr, kM>(sdO, dout, p.dout_strides.row, q0, T, D);
  cp_async_commit();
  load_tile_async<Tr, kN>(sK, k, p.k_strides.row, n_begin * kN, T, D);
  load_tile_async<Tr, kN>(sV, v, p.v_strides.row, n_begin * kN, T, D);
  cp_async_commit();

  int row[kMT][2];                           // this thread's queries: rows g, g + 8 of each m tile
  float row_lse[kMT][2], row_delta[kMT][2];  // L * log2(e) and D of these rows (0 past T)
#pragma unroll
  for (int t = 0; t < kMT; ++t) row[t][0] = q0 + (warp * kMT + t) * 16 + g, row[t][1] = row[t][0] + 8;
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_lse[t][r] = row[t][r] < T ? lse[row[t][r]] * kLog2e : 0.f;
      row_delta[t][r] = row[t][r] < T ? delta[row[t][r]] : 0.f;
    }
  float acc_dq[kMT][kD / 8][4];
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) acc_dq[t][j][0] = acc_dq[t][j][1] = acc_dq[t][j][2] = acc_dq[t][j][3] = 0.f;
  const float scale_log2 = p.scale * kLog2e;

  // The warp's rows of Q and dO as A fragments, read from shared memory once: S = Q K^T and
  // dP = dO V^T then read only K and V there (a quarter fewer ldmatrix per key tile).
  cp_async_wait<1>();
  __syncthreads();
  uint32_t q_frag[kD / 16][kMT][4], do_frag[kD / 16][kMT][4];
  load_a_fragments<kD, kMT, kRow>(q_frag, sQ + warp * 16 * kMT * kRow, lane);
  load_a_fragments<kD, kMT, kRow>(do_frag, sdO + warp * 16 * kMT * kRow, lane);

  for (int n = n_begin; n < n_stop; ++n) {
    const int stage = (n - n_begin) & 1, k0 = n * kN;
    if (n + 1 < n_stop) {
      load_tile_async<Tr, kN>(sK + (stage ^ 1) * kN * kRow, k, p.k_strides.row, k0 + kN, T, D);
      load_tile_async<Tr, kN>(sV + (stage ^ 1) * kN * kRow, v, p.v_strides.row, k0 + kN, T, D);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* sKs = sK + stage * kN * kRow;
    const bf16* sVs = sV + stage * kN * kRow;

    float pr[kMT][kN / 8][4];  // P: columns k0 + 8j + 2c (+1) of rows g (0, 1), g+8 (2, 3) of m tile t
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) pr[t][j][0] = pr[t][j][1] = pr[t][j][2] = pr[t][j][3] = 0.f;
    warp_gemm_frag_rows<kD, kMT, kN / 8, kRow>(pr, q_frag, sKs, lane);
    const bool need_mask = k0 + kN > T || (p.causal && k0 + kN - 1 > q0);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[t][j][e] = pr[t][j][e] * scale_log2 - row_lse[t][e / 2];
    if (need_mask) mask_keys(pr, row, k0, T, p.causal);
    exp2_tile(pr);

    float ds[kMT][kN / 8][4];  // dP, then dS
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) ds[t][j][0] = ds[t][j][1] = ds[t][j][2] = ds[t][j][3] = 0.f;
    warp_gemm_frag_rows<kD, kMT, kN / 8, kRow>(ds, do_frag, sVs, lane);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[t][j][e] = pr[t][j][e] * (ds[t][j][e] - row_delta[t][e / 2]);

    warp_gemm_regs_rows<kN / 16, kMT, kD / 8, kRow>(acc_dq, ds, sKs, lane);  // dQ += dS K
    __syncthreads();
  }

  if (chunk.count > 1 && !hand_off_chunk(acc_dq, p.q_accum, p.q_turns, chunk)) return;
  bf16* dq = static_cast<bf16*>(p.dq) + head.offset(p.dq_strides);
#pragma unroll
  for (int t = 0; t < kMT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (row[t][r] >= T) continue;
      bf16* dq_row = dq + int64_t(row[t][r]) * p.dq_strides.row;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = 8 * j + 2 * c;
        if (col < D)
          *reinterpret_cast<uint32_t*>(dq_row + col) =
              pack_bf16(acc_dq[t][j][2 * r] * p.scale, acc_dq[t][j][2 * r + 1] * p.scale);
      }
    }
}

// Purpose: dK and dV (B,T,H,D) of one tile of kBlockM (128) keys of one (batch, head), and
// each query tile's share of dQ, added into its tile of p.dq_accum (zeroed before) with fp32
// atomics in the layout of dq_share() (flash_bwd_dq_convert_mma_kernel stores dQ from it).
// FlashAttention-2's fused backward and its warp layouts (BwdFusedTraits). Grid: (B*H, key
// tiles); without a causal mask the key tiles of a head start at different query tiles
// (rotated), so that they do not all add into one dQ tile at once.
// Algorithm, per query tile of kBlockN (128 or 64) that can see the keys (causal: from the one
// holding key k0 on); Q, dO, L and D of the next one stream in (cp.async) while it is computed:
//   S = Q K^T;  P = 2^(S scale log2e - L log2e)  (masked: 0)   warp: kBlockN / 2 queries x 32 keys
//   dP = dO V^T;  dS = P (dP - D)                              the same
//   P, dS -> shared memory (bf16, query-major)
//   dV += P^T dO;  dK += dS^T Q                                warp: 32 keys x kHeadDim / 2
//   dQ share = dS K -> p.dq_accum                              warp: dq_share()
// then dK *= scale. A warp whose scores lie above the causal diagonal skips its products (P,
// dS = 0), and one whose 32 keys no query of the tile sees skips dV and dK.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_bwd_fused_mma_kernel(const FlashParams p) {
  constexpr int kD = Tr::kHeadDim, kM = Tr::kBlockM, kN = Tr::kBlockN, kRow = Tr::kSmemRow, kSRow = Tr::kScoreRow;
  constexpr int kSQ = kN / Tr::kSWarpsQ / 16;    // S, dP: m tiles (queries) per warp
  constexpr int kSK = kM / Tr::kSWarpsK / 8;     // and n tiles (keys)
  constexpr int kKvM = kM / Tr::kKvWarpsK / 16;  // dK, dV: m tiles (keys) per warp
  constexpr int kKvD = Tr::kKvDims / 8;          // and n tiles (dims)
  constexpr int kDqD = Tr::kDqDims / 8;          // dQ share: n tiles (dims)
  extern __shared__ __align__(16) unsigned char smem[];
  const KvSmem sm = kv_smem<Tr>(smem);
  bf16 *sK = sm.k, *sV = sm.v, *sQ = sm.q, *sdO = sm.dout;
  float *sL = sm.lse, *sDelta = sm.delta;
  bf16* sP = reinterpret_cast<bf16*>(sm.rest);  // (kN, kSRow)
  bf16* sdS = sP + kN * kSRow;                  // (kN, kSRow)

  const int T = p.seq, D = p.head_dim;
  const HeadOffsets head = head_offsets(int(blockIdx.x), p.heads);
  const int k0 = int(blockIdx.y) * kM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  const HeadInputs<bf16> in = head_inputs<bf16>(p, head);
  const bf16 *k = in.k, *v = in.v;

  const int m_first = p.causal ? k0 / kN : 0;  // earlier query tiles see none of these keys
  const int n_visits = (T + kN - 1) / kN - m_first;
  const int rotation = p.causal ? 0 : int(blockIdx.y) * (kM / kN) % n_visits;
  auto visit = [&](int i) { return m_first + (i + rotation < n_visits ? i + rotation : i + rotation - n_visits); };

  auto load_stage = [&](int stage, int m0) {  // Q, dO, L and D of query tile m0 / kN
    load_query_stage<Tr, kN>(sQ + stage * kN * kRow, sdO + stage * kN * kRow, sL + stage * kN, sDelta + stage * kN, in,
                             p, m0);
  };
  load_tile_async<Tr, kM>(sK, k, p.k_strides.row, k0, T, D);
  load_tile_async<Tr, kM>(sV, v, p.v_strides.row, k0, T, D);
  load_stage(0, visit(0) * kN);
  cp_async_commit();

  // This warp's place in each product.
  const int s_query = kSQ * 16 * (warp % Tr::kSWarpsQ), s_key = kSK * 8 * (warp / Tr::kSWarpsQ);  // S, dP
  const int kv_key = kKvM * 16 * (warp % Tr::kKvWarpsK), kv_dim = Tr::kKvDims * (warp / Tr::kKvWarpsK);
  const DqShare share = dq_share<Tr>(warp);

  float acc[2][kKvM][kKvD][4];  // dK, dV
  auto& acc_dk = acc[0];
  auto& acc_dv = acc[1];
#pragma unroll
  for (int t = 0; t < kKvM; ++t)
#pragma unroll
    for (int j = 0; j < kKvD; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[t][j][e] = acc_dv[t][j][e] = 0.f;
  const float scale_log2 = p.scale * kLog2e;

  for (int i = 0; i < n_visits; ++i) {
    const int stage = i & 1, m0 = visit(i) * kN;
    cp_async_wait<0>();
    __syncthreads();  // this stage has landed, and every warp is done with the last one and sP, sdS
    if (i + 1 < n_visits) {
      load_stage(stage ^ 1, visit(i + 1) * kN);
      cp_async_commit();
    }
    const bf16* sQs = sQ + stage * kN * kRow;
    const bf16* sdOs = sdO + stage * kN * kRow;
    const float* sLs = sL + stage * kN;
    const float* sDs = sDelta + stage * kN;

    // P, then dS: rows s_query + 16t + g (+8) of the tile, keys s_key + 8j + 2c (+1).
    float s[kSQ][kSK][4], ds[kSQ][kSK][4];
#pragma unroll
    for (int t = 0; t < kSQ; ++t)
#pragma unroll
      for (int j = 0; j < kSK; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][j][e] = ds[t][j][e] = 0.f;
    if (!p.causal || k0 + s_key <= m0 + s_query + kSQ * 16 - 1) {  // else above the diagonal: P = dS = 0
      int query[kSQ][2];
#pragma unroll
      for (int t = 0; t < kSQ; ++t) query[t][0] = m0 + s_query + 16 * t + g, query[t][1] = query[t][0] + 8;
      warp_gemm_rows_rows<kD, kSQ, kSK, kRow>(s, sQs + s_query * kRow, sK + s_key * kRow, lane);
#pragma unroll
      for (int t = 0; t < kSQ; ++t)
#pragma unroll
        for (int j = 0; j < kSK; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[t][j][e] = s[t][j][e] * scale_log2 - sLs[s_query + 16 * t + g + 8 * (e / 2)] * kLog2e;
      if (k0 + s_key + kSK * 8 > T || (p.causal && k0 + s_key + kSK * 8 - 1 > m0 + s_query))
        mask_keys(s, query, k0 + s_key, T, p.causal);
      exp2_tile(s);
      warp_gemm_rows_rows<kD, kSQ, kSK, kRow>(ds, sdOs + s_query * kRow, sV + s_key * kRow, lane);
#pragma unroll
      for (int t = 0; t < kSQ; ++t)
#pragma unroll
        for (int j = 0; j < kSK; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            ds[t][j][e] = s[t][j][e] * (ds[t][j][e] - sDs[s_query + 16 * t + g + 8 * (e / 2)]);
    }
#pragma unroll
    for (int t = 0; t < kSQ; ++t)
#pragma unroll
      for (int j = 0; j < kSK; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int at = (s_query + 16 * t + g + 8 * r) * kSRow + s_key + 8 * j + 2 * c;
          *reinterpret_cast<uint32_t*>(sP + at) = pack_bf16(s[t][j][2 * r], s[t][j][2 * r + 1]);
          *reinterpret_cast<uint32_t*>(sdS + at) = pack_bf16(ds[t][j][2 * r], ds[t][j][2 * r + 1]);
        }
    __syncthreads();

    if (!p.causal || k0 + kv_key <= m0 + kN - 1) {  // else no query of the tile sees these keys
      warp_gemm_trans_rows<kN / 16, kKvM, kKvD, kSRow, kRow>(acc_dv, sP + kv_key, sdOs + kv_dim, lane);
      warp_gemm_trans_rows<kN / 16, kKvM, kKvD, kSRow, kRow>(acc_dk, sdS + kv_key, sQs + kv_dim, lane);
    }
    float dq[Tr::kDqMTiles][kDqD][4];
#pragma unroll
    for (int t = 0; t < Tr::kDqMTiles; ++t)
#pragma unroll
      for (int j = 0; j < kDqD; ++j) dq[t][j][0] = dq[t][j][1] = dq[t][j][2] = dq[t][j][3] = 0.f;
    warp_gemm_rows_trans<kM / 16, Tr::kDqMTiles, kDqD, kSRow, kRow>(dq, sdS + share.query * kSRow, sK + share.dim,
                                                                    lane);
    float4* tile = dq_accum_tile<Tr>(p, int(blockIdx.x), m0 / kN) + threadIdx.x;
#pragma unroll
    for (int t = 0; t < Tr::kDqMTiles; ++t)
#pragma unroll
      for (int j = 0; j < kDqD; ++j)
        add_to(tile + (t * kDqD + j) * Tr::kThreads, make_float4(dq[t][j][0], dq[t][j][1], dq[t][j][2], dq[t][j][3]));
  }

  store_dk_dv(p, head, acc_dk, acc_dv, k0 + kv_key, kv_dim, lane);
}

// Purpose: dQ (B,T,H,D) = scale * the fused backward's fp32 accumulator (dq_share layout).
// Grid: (query tiles of kBlockN, B*H), Tr::kThreads threads, Tr::kConvertSmemBytes of shared
// memory. Thread x reads its float4s of one tile (coalesced) and puts them, scaled to bf16,
// where its fragments lie in a row-major tile in shared memory (rows padded by 8: the 8 rows
// of a fragment fall in distinct banks); then the tile's rows go out 16 bytes a thread (a
// thread storing each fragment's pairs of 4 bytes itself half-fills every 32-byte sector: twice
// the time, docs/results/attention.md).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dq_convert_mma_kernel(const FlashParams p) {
  constexpr int kJ = Tr::kDqDims / 8, kRow = Tr::kSmemRow;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sdq = reinterpret_cast<bf16*>(smem);  // (kBlockN, kRow)
  const int m = int(blockIdx.x), warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const HeadOffsets head = head_offsets(int(blockIdx.y), p.heads);
  const float4* tile = dq_accum_tile<Tr>(p, int(blockIdx.y), m) + threadIdx.x;
  const DqShare share = dq_share<Tr>(warp);
#pragma unroll
  for (int t = 0; t < Tr::kDqMTiles; ++t)
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const float4 v = tile[(t * kJ + j) * Tr::kThreads];
      bf16* at = sdq + (share.query + 16 * t + g) * kRow + share.dim + 8 * j + 2 * c;
      *reinterpret_cast<uint32_t*>(at) = pack_bf16(v.x * p.scale, v.y * p.scale);
      *reinterpret_cast<uint32_t*>(at + 8 * kRow) = pack_bf16(v.z * p.scale, v.w * p.scale);
    }
  __syncthreads();
  bf16* dq = static_cast<bf16*>(p.dq) + head.offset(p.dq_strides);
  const int chunks = p.head_dim / 8;  // 16 bytes each (tensor cores: head dim a multiple of 8, rows 16-byte aligned)
  const int rows = min(Tr::kBlockN, p.seq - m * Tr::kBlockN);
  for (int i = threadIdx.x; i < rows * chunks; i += Tr::kThreads) {
    const int r = i / chunks, col = 8 * (i % chunks);
    *reinterpret_cast<uint4*>(dq + int64_t(m * Tr::kBlockN + r) * p.dq_strides.row + col) =
        *reinterpret_cast<const uint4*>(sdq + r * kRow + col);
  }
}

}  // namespace llmhpc::flash

// Device helpers of the FlashAttention-2 kernels: element conversions,
// the PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16 bf16) and the two warp-level
// matrix products every tensor-core kernel is built from.
//
// Fragment layout of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 (group) and c = lane % 4 (thread in group):
//   A (16x16, row-major), 4 registers of 2 bf16: a0 = A[g][2c..2c+1], a1 = A[g+8][2c..],
//     a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
//   B (16x8, "col"), 2 registers: b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   C, D (16x8 fp32): d0, d1 = D[g][2c], D[g][2c+1]; d2, d3 = D[g+8][2c], D[g+8][2c+1]
// So the accumulators of two adjacent 16x8 tiles, rounded to bf16 pairwise, are exactly the
// A fragment of one 16x16 tile: P = softmax(Q K^T) feeds P V without leaving registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/convert.cuh"
#include "src/core/cuda/check.h"
#ifdef LLMHPC_FLASH_EMULATE
#include "kernels/cuda/flash_attn/emulate.h"  // host versions of the PTX wrappers below
#endif

namespace llmhpc::flash {

using cuda::bf16;
using cuda::from_float;
using cuda::to_float;

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))

#ifndef LLMHPC_FLASH_EMULATE
// ---- asynchronous copies --------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without going through registers. With src_bytes = 0 nothing is
// read and the 16 bytes are zero-filled (rows past the sequence, columns past the head dim).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// 4 bytes (one fp32) global -> shared, zero-filled with src_bytes = 0.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // LLMHPC_FLASH_EMULATE

// Rows [row0, row0 + kRows) x columns [0, Tr::kHeadDim) of a (seq x head_dim) bf16 matrix
// whose rows are `row_stride` elements apart, into shared memory rows Tr::kSmemRow elements
// apart, by the Tr::kThreads threads of a CTA. Rows >= seq and columns >= head_dim become
// zeros. 16 bytes per cp.async: the caller guarantees 16-byte aligned rows and head_dim % 8 == 0.
// A thread copies one 16-byte column chunk of every kRowsPerPass-th row through one pointer
// that it advances (threads past the last whole row of a pass idle: head dim 96 copies with
// 120 of 128 threads): fewer instructions and registers than an address computed per copy
// (up to a quarter of the backward's instructions at head dim 128).
template <class Tr, int kRows>
__device__ __forceinline__ void load_tile_async(bf16* smem, const bf16* gmem, int64_t row_stride, int row0, int seq,
                                                int head_dim) {
  constexpr int kThreads = Tr::kThreads, kSmemRow = Tr::kSmemRow, kChunksPerRow = Tr::kHeadDim / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  const int r0 = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * 8;
  if (kThreads % kChunksPerRow != 0 && r0 >= kRowsPerPass) return;
  const bf16* src = gmem + int64_t(row0 + r0) * row_stride + col;
#pragma unroll
  for (int it = 0; it < (kRows + kRowsPerPass - 1) / kRowsPerPass; ++it, src += kRowsPerPass * row_stride) {
    const int r = r0 + it * kRowsPerPass;
    if (kRows % kRowsPerPass != 0 && r >= kRows) break;
    const bool valid = row0 + r < seq && col < head_dim;
    cp_async_16(smem + r * kSmemRow + col, valid ? src : gmem, valid ? 16 : 0);
  }
}

// ---- tensor cores ---------------------------------------------------------------------------
#ifndef LLMHPC_FLASH_EMULATE
// Four 8x8 bf16 matrices from shared memory; lane i gives the address of row i % 8 of matrix
// i / 8, and register j receives matrix j in the fragment layout (row lane/4, columns
// 2*(lane%4)..+1), or its transpose with .trans.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

// d (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // LLMHPC_FLASH_EMULATE

// 2^x on the special-function unit (ex2.approx.ftz: a relative error near 2^-22, results
// below 2^-126 flushed to 0, 2^-inf = 0): what exp2f becomes under --use_fast_math. The exact
// exp2f adds four instructions per score for subnormal results, which bf16 P cannot hold anyway.
#ifndef LLMHPC_FLASH_EMULATE
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

// Two floats as a bf16 pair, `lo` in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// The bf16 in the low (half 0) or high (half 1) 16 bits of `word`, as a float (exact: its bits
// are a float's upper half). Bits, not a bf16 pointer into the word, which the emulator's host
// compiler may read before the word is written (strict aliasing).
#ifndef LLMHPC_FLASH_EMULATE
__device__ __forceinline__ float bf16_half(uint32_t word, int half) {
  return __uint_as_float(half ? word & 0xffff0000u : word << 16);
}
#else
inline float bf16_half(uint32_t word, int half) { return emu_half(word, half); }
#endif

// One 16-wide k step of acc (16*kMTiles x 8*kNTiles) += A B^T for one warp: A's fragments
// given (a[t]: rows 16t..), B the first 8*kNTiles rows of a shared-memory tile (b_rows: at the
// step's first column; rows kSmemRow apart). Each B fragment feeds kMTiles mma pairs.
template <int kMTiles, int kNTiles, int kSmemRow>
__device__ __forceinline__ void warp_mma_step_rows(float (&acc)[kMTiles][kNTiles][4], const uint32_t (&a)[kMTiles][4],
                                                   const bf16* b_rows, int lane) {
  static_assert(kNTiles % 2 == 0, "n tiles come in pairs");
#pragma unroll
  for (int np = 0; np < kNTiles / 2; ++np) {
    uint32_t b[4];
    // Matrices: (rows +0, cols +0), (rows +0, cols +8), (rows +8, cols +0), (rows +8, cols +8):
    // b0, b1 of n tile 2np, then b0, b1 of n tile 2np+1.
    ldmatrix_x4(b, b_rows + (np * 16 + lane % 8 + (lane / 16) * 8) * kSmemRow + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      mma_16816(acc[t][2 * np], a[t], b[0], b[1]);
      mma_16816(acc[t][2 * np + 1], a[t], b[2], b[3]);
    }
  }
}

// The A fragments of one 16-wide k step (columns from a_rows on) of 16*kMTiles rows of a
// shared-memory tile: matrices rows 0-7 / 8-15 (lanes 0-15), at columns +0 / +8 (lane / 16).
template <int kMTiles, int kSmemRow>
__device__ __forceinline__ void load_a_step(uint32_t (&a)[kMTiles][4], const bf16* a_rows, int lane) {
#pragma unroll
  for (int t = 0; t < kMTiles; ++t) ldmatrix_x4(a[t], a_rows + (16 * t + lane % 16) * kSmemRow + (lane / 16) * 8);
}

// acc (16*kMTiles x 8*kNTiles) += A B^T for one warp, where A is 16*kMTiles rows of a
// shared-memory tile (a_rows: its first row) and B is the first 8*kNTiles rows of another
// (b_rows); both are row-major with kHeadDim columns (kSmemRow apart) and the product runs over
// those columns: acc[t][j] is the 16x8 tile of rows 16t.. and columns 8j.., acc[i][n] +=
// sum_d A[i][d] B[n][d]. Q K^T, K Q^T, dO V^T and V dO^T are all this. Each B fragment read
// from shared memory feeds 2*kMTiles mma: more m tiles, fewer shared-memory bytes per mma.
template <int kHeadDim, int kMTiles, int kNTiles, int kSmemRow>
__device__ __forceinline__ void warp_gemm_rows_rows(float (&acc)[kMTiles][kNTiles][4], const bf16* a_rows,
                                                    const bf16* b_rows, int lane) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t a[kMTiles][4];
    load_a_step<kMTiles, kSmemRow>(a, a_rows + kk * 16, lane);
    warp_mma_step_rows<kMTiles, kNTiles, kSmemRow>(acc, a, b_rows + kk * 16, lane);
  }
}

// The A fragments of all kHeadDim columns of 16*kMTiles rows: a stationary operand, read from
// shared memory once instead of at every product (warp_gemm_frag_rows).
template <int kHeadDim, int kMTiles, int kSmemRow>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[kHeadDim / 16][kMTiles][4], const bf16* a_rows,
                                                 int lane) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) load_a_step<kMTiles, kSmemRow>(a[kk], a_rows + kk * 16, lane);
}

// warp_gemm_rows_rows with A already in registers (load_a_fragments).
template <int kHeadDim, int kMTiles, int kNTiles, int kSmemRow>
__device__ __forceinline__ void warp_gemm_frag_rows(float (&acc)[kMTiles][kNTiles][4],
                                                    const uint32_t (&a)[kHeadDim / 16][kMTiles][4], const bf16* b_rows,
                                                    int lane) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
    warp_mma_step_rows<kMTiles, kNTiles, kSmemRow>(acc, a[kk], b_rows + kk * 16, lane);
}

// One 16-wide k step of acc (16*kMTiles x 8*kNTiles) += A B for one warp: A's fragments given,
// B rows [k, k + 16) of a row-major shared-memory tile with 8*kNTiles used columns (b_rows:
// its row k), read transposed by ldmatrix.trans.
template <int kMTiles, int kNTiles, int kSmemRow>
__device__ __forceinline__ void warp_mma_step_trans(float (&acc)[kMTiles][kNTiles][4], const uint32_t (&a)[kMTiles][4],
                                                    const bf16* b_rows, int lane) {
  static_assert(kNTiles % 2 == 0, "n tiles come in pairs");
#pragma unroll
  for (int np = 0; np < kNTiles / 2; ++np) {
    uint32_t b[4];
    // Transposed matrices: (rows +0, cols +0), (rows +8, cols +0), (rows +0, cols +8),
    // (rows +8, cols +8): b0, b1 of n tile 2np, then of n tile 2np+1.
    ldmatrix_x4_trans(b, b_rows + (lane % 8 + ((lane / 8) % 2) * 8) * kSmemRow + np * 16 + (lane / 16) * 8);
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      mma_16816(acc[t][2 * np], a[t], b[0], b[1]);
      mma_16816(acc[t][2 * np + 1], a[t], b[2], b[3]);
    }
  }
}

// acc (16*kMTiles x 8*kNTiles) += P B for one warp, where P (16*kMTiles x 16*kKSteps) is held
// in registers as the accumulators of a previous product (p[t][2k], p[t][2k+1] are rows 16t..
// and columns 16k..16k+15; rounded to bf16 here) and B is the first 16*kKSteps rows of a
// shared-memory tile, row-major with 8*kNTiles used columns: acc[i][n] += sum_j P[i][j] B[j][n].
// P V, P^T dO, dS^T Q and dS K.
template <int kKSteps, int kMTiles, int kNTiles, int kSmemRow>
__device__ __forceinline__ void warp_gemm_regs_rows(float (&acc)[kMTiles][kNTiles][4],
                                                    const float (&p)[kMTiles][2 * kKSteps][4], const bf16* b_rows,
                                                    int lane) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      a[t][0] = pack_bf16(p[t][2 * kk][0], p[t][2 * kk][1]);
      a[t][1] = pack_bf16(p[t][2 * kk][2], p[t][2 * kk][3]);
      a[t][2] = pack_bf16(p[t][2 * kk + 1][0], p[t][2 * kk + 1][1]);
      a[t][3] = pack_bf16(p[t][2 * kk + 1][2], p[t][2 * kk + 1][3]);
    }
    warp_mma_step_trans<kMTiles, kNTiles, kSmemRow>(acc, a, b_rows + kk * 16 * kSmemRow, lane);
  }
}

// acc (16*kMTiles x 8*kNTiles) += A B for one warp, where A (16*kMTiles x 16*kKSteps) is stored
// transposed in shared memory (a_cols: row k of A^T = column k of A, at A's first row; rows
// kARow apart) and B as in warp_gemm_regs_rows. The fused backward's dQ share = dS K, from the
// dS^T its warps wrote.
template <int kKSteps, int kMTiles, int kNTiles, int kARow, int kBRow>
__device__ __forceinline__ void warp_gemm_trans_rows(float (&acc)[kMTiles][kNTiles][4], const bf16* a_cols,
                                                     const bf16* b_rows, int lane) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMTiles][4];
    // a0..a3 = A (rows +0, k +0), (rows +8, k +0), (rows +0, k +8), (rows +8, k +8): the
    // transposes of the A^T matrices at (k, rows) = (+0, +0), (+0, +8), (+8, +0), (+8, +8).
#pragma unroll
    for (int t = 0; t < kMTiles; ++t)
      ldmatrix_x4_trans(a[t], a_cols + (kk * 16 + lane % 8 + (lane / 16) * 8) * kARow + 16 * t + ((lane / 8) % 2) * 8);
    warp_mma_step_trans<kMTiles, kNTiles, kBRow>(acc, a, b_rows + kk * 16 * kBRow, lane);
  }
}

// acc (16*kMTiles x 8*kNTiles) += A B for one warp, where A (16*kMTiles x 16*kKSteps) is rows
// of a row-major shared-memory tile (a_rows: its first row, at A's first column; rows kARow
// apart) and B as in warp_gemm_regs_rows. The fused backward's dQ share = dS K, from the dS its
// warps wrote.
template <int kKSteps, int kMTiles, int kNTiles, int kARow, int kBRow>
__device__ __forceinline__ void warp_gemm_rows_trans(float (&acc)[kMTiles][kNTiles][4], const bf16* a_rows,
                                                     const bf16* b_rows, int lane) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a[kMTiles][4];
    load_a_step<kMTiles, kARow>(a, a_rows + kk * 16, lane);
    warp_mma_step_trans<kMTiles, kNTiles, kBRow>(acc, a, b_rows + kk * 16 * kBRow, lane);
  }
}

// ---- cross-CTA hand-off of fp32 partial sums ---------------------------------------------
// The CTA whose turn it is writes (first turn) or adds (in L2, fire and forget) its part into
// an fp32 accumulator tile, then releases the tile's counter to the next turn. One fp32
// addition per element per turn, in turn order: bitwise deterministic. Used by the CUDA-core
// backward's fused dQ and by the chunked tensor-core backward.
#ifndef LLMHPC_FLASH_EMULATE
// Spins (one thread) until *counter == turn; acquire, so the previous turn's writes are seen.
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  } while (v != turn);
}
// One thread, after a __syncthreads that follows every thread's writes: the fence is
// cumulative over what the barrier ordered before it (CUTLASS's semaphore does the same).
__device__ __forceinline__ void release_turn(int* counter, int value) {
  asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}
__device__ __forceinline__ void store_cg(float4* p, float4 v) { __stcg(p, v); }
__device__ __forceinline__ void store_cg(float2* p, float2 v) { __stcg(p, v); }
__device__ __forceinline__ float4 load_cg(const float4* p) { return __ldcg(p); }
__device__ __forceinline__ void add_to(float4* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  // red (no return), not atomicAdd's ATOM: nothing waits for the old value.
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
#else
  atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y), atomicAdd(&p->z, v.z), atomicAdd(&p->w, v.w);
#endif
}
__device__ __forceinline__ void add_to(float2* p, float2 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(p, v);
#else
  atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y);
#endif
}
#else
// The emulator runs blocks one by one in launch order, so the turn must have come already.
inline void wait_turn(const int* counter, int turn) {
  if (*counter != turn) throw std::runtime_error("flash hand-off: a CTA would wait on a later one");
}
inline void release_turn(int* counter, int value) { *counter = value; }
template <class V>
inline void store_cg(V* p, V v) {
  *p = v;
}
inline float4 load_cg(const float4* p) { return *p; }
inline void add_to(float4* p, float4 v) { p->x += v.x, p->y += v.y, p->z += v.z, p->w += v.w; }
inline void add_to(float2* p, float2 v) { p->x += v.x, p->y += v.y; }
#endif

// The chunked tensor-core backward (FlashParams::kv_chunk, q_chunk). A stationary tile streams
// tiles [first, end); in chunks of chunk_tiles (0: not chunked), CTA blockIdx.z takes
// [begin, stop), one of `count`.
struct ChunkRange {
  int begin, stop, count;
};
__device__ __forceinline__ ChunkRange chunk_range(int first, int end, int chunk_tiles) {
  if (chunk_tiles == 0) return {first, end, 1};
  const int begin = first + int(blockIdx.z) * chunk_tiles;
  return {begin, min(end, begin + chunk_tiles), (end - first + chunk_tiles - 1) / chunk_tiles};
}

// Its epilogue: the CTA of grid (B*H, stationary tiles, chunks) hands this thread's
// accumulators (an fp32 array of whole float4s) to its stationary tile's fp32 accumulator in
// chunk order (the tile's blockDim.x arrays from accum_base, float4 i of thread x at i *
// blockDim.x + x; its turn counter in turns). The last chunk gets back in `acc` the sum of every
// chunk's part, added in chunk order, and returns true: it stores the tile. The others return
// false.
template <class Acc>
__device__ __forceinline__ bool hand_off_chunk(Acc& accumulators, float* accum_base, int* turns, const ChunkRange& r) {
  constexpr int kFloats = int(sizeof(Acc) / sizeof(float));
  static_assert(kFloats % 4 == 0, "float4s");
  float* acc = reinterpret_cast<float*>(&accumulators);
  const int64_t tile = int64_t(blockIdx.x) * gridDim.y + blockIdx.y;
  float4* accum = reinterpret_cast<float4*>(accum_base) + tile * (kFloats / 4) * blockDim.x;
  int* turn = turns + tile;
  const int chunk = int(blockIdx.z), n_chunks = r.count;
  if (threadIdx.x == 0) wait_turn(turn, chunk);
  __syncthreads();
  const bool last = chunk == n_chunks - 1;
#pragma unroll
  for (int i = 0; i < kFloats / 4; ++i) {
    float4* a = accum + i * int(blockDim.x) + int(threadIdx.x);
    float* v = acc + 4 * i;
    if (last) {
      const float4 sum = load_cg(a);  // the earlier chunks' sum, then + this one
      v[0] = sum.x + v[0], v[1] = sum.y + v[1], v[2] = sum.z + v[2], v[3] = sum.w + v[3];
    } else if (chunk == 0) {
      store_cg(a, make_float4(v[0], v[1], v[2], v[3]));
    } else {
      add_to(a, make_float4(v[0], v[1], v[2], v[3]));
    }
  }
  if (last) return true;
  __syncthreads();  // every thread's writes are issued
  if (threadIdx.x == 0) release_turn(turn, chunk + 1);
  return false;
}

// Sets to -inf the scores of an accumulator tile (C layout: element e of n tile j of m tile t
// is row 16t + g + 8(e / 2), column 8j + 2c + (e % 2)) that lie outside the visible columns
// [lo, hi] of their row; lo[t][r] and hi[t][r] are counted from this thread's column 2c (so
// that the per-element offsets 8j + e % 2 are constants). Called on the tiles that cross the
// causal diagonal or the end of the sequence only.
constexpr int kNoColumnLimit = 1 << 30;
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_outside(float (&s)[kMTiles][kNTiles][4], const int (&lo)[kMTiles][2],
                                             const int (&hi)[kMTiles][2]) {
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + (e & 1);
        if (col < lo[t][e / 2] || col > hi[t][e / 2]) s[t][j][e] = -INFINITY;
      }
}

// Query-major score tiles (forward, dQ): query q sees keys [0, min(q, T - 1)] (causal) or
// [0, T - 1]; query[t][r] is the query of this thread's row g + 8r of m tile t, k0 the tile's
// first key.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_keys(float (&s)[kMTiles][kNTiles][4], const int (&query)[kMTiles][2], int k0,
                                          int seq, bool causal) {
  const int c = int(threadIdx.x) % 4;
  int lo[kMTiles][2], hi[kMTiles][2];
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lo[t][r] = -kNoColumnLimit;
      hi[t][r] = (causal ? min(query[t][r], seq - 1) : seq - 1) - k0 - 2 * c;
    }
  mask_outside(s, lo, hi);
}

// s = 2^s, element by element (scores in log2 units, -inf where masked).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void exp2_tile(float (&s)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][j][e] = fast_exp2(s[t][j][e]);
}

// Max and sum over the four threads of a quad (they hold one row of an accumulator tile).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace llmhpc::flash

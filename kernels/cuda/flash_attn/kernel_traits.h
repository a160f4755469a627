// Compile-time tile sizes of the FlashAttention-2 kernels. Runtime choices (dtype, head dim)
// become these template parameters only in the launchers (flash_launch.cuh).
//
// Tensor-core kernels: 4 warps; each warp owns 16*kMTiles rows of the CTA's stationary tile
// (queries in forward and dQ, keys in dK/dV), so the stationary tile is 64*kMTiles rows. The
// streamed tile (keys in forward and dQ, queries in dK/dV) is kBlockN rows; it shrinks to 32
// in the backward kernels for head dims above 64 or two m tiles (registers). Each B fragment a warp reads from shared memory feeds 2*kMTiles mma, so two m
// tiles halve the shared-memory reads per mma; the forward uses them on long sequences with
// enough CTAs (flash_fwd_mma.cu), where they were up to 1.3x faster on an H100, and 64-row
// tiles elsewhere (128 rows halve the CTAs: up to 1.7x slower at batch 1, one head, T <= 16384).
// The backward takes two m tiles at head dim 64 on long sequences with enough CTAs
// (flash_bwd_mma.cu): once its instruction count was cut (session 4) it became bound by
// shared memory, and they were up to 1.38x faster; at head dim 128 the dK, dV accumulators
// leave no registers for them. Shared memory rows are padded by 8 bf16 (16
// bytes), which makes ldmatrix's eight row reads of a 8x8 matrix fall into distinct banks.
//
// CUDA-core kernels: 256 threads, 64 stationary rows x 64 streamed rows (32 above head dim
// 64, for shared memory and registers); SGEMM-style register tiles: a thread owns 4 rows x
// kBlockN/16 columns of a score tile and 4 rows x kHeadDim/16 columns of an output tile,
// with operands read from shared memory as float4.
#pragma once
#include <cstddef>

namespace llmhpc::flash {

// The head dims the kernels are compiled for; a smaller head dim runs zero-padded.
constexpr int kTensorCoreHeadDims[] = {16, 32, 64, 80, 96, 128};
constexpr int kSimtHeadDims[] = {32, 64, 128};
constexpr int kMaxHeadDim = 128;

template <int kHeadDim_, int kBlockN_, int kMTiles_, int kNWarps_ = 4>
struct TensorCoreTraits {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim, a multiple of 16
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kMTiles = kMTiles_;                    // m16 tiles per warp
  static constexpr int kBlockM = 16 * kMTiles * kNWarps;      // rows of the stationary tile
  static constexpr int kBlockN = kBlockN_;                    // rows of the streamed tile
  static constexpr int kSmemRow = kHeadDim + 8;               // bf16 elements between shared-memory rows
  static constexpr size_t kTileBytes = size_t(kSmemRow) * 2;  // per row of a tile
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "mma tiles are 16 wide");
};

// Forward: sQ (kBlockM rows), sK and sV (kBlockN rows each); K of the next tile is loaded
// while P V of this one runs. Key tiles of 128 at head dims up to 32, as FlashAttention-2:
// there a tile's products are short, and 64-key tiles paid a tile's barriers, waits and
// softmax rescaling twice as often. On an H100 (session 21), against 64-key tiles of 64 query
// rows, the choice before: 0.84-0.86x of the time at head dim 32 (with 128 rows: batch 8,
// T 4096-16384; causal, batch 1, T 65536), 0.83-0.86x with 64 rows (causal, batch 1, T 4096-16384);
// at head dim 16 (64 rows) 0.89-0.92x at batch 8, T 4096-16384, 0.77-0.80x causal, batch 1,
// T 4096-16384, 1.00x at T 65536.
constexpr int fwd_key_tile(int head_dim) { return head_dim <= 32 ? 128 : 64; }
template <int kHeadDim, int kMTiles, int kKeyTile = fwd_key_tile(kHeadDim)>
struct FwdTraits : TensorCoreTraits<kHeadDim, kKeyTile, kMTiles> {
  using Base = TensorCoreTraits<kHeadDim, kKeyTile, kMTiles>;
  static constexpr size_t kSmemBytes = (Base::kBlockM + 2 * Base::kBlockN) * Base::kTileBytes;
};

// The split backward's streamed tiles (queries in dK/dV, keys in dQ): 32 rows above head dim
// 64 or with two m tiles (registers), else 64.
constexpr int split_bwd_streamed_tile(int head_dim, int m_tiles) { return head_dim > 64 || m_tiles > 1 ? 32 : 64; }

// dK/dV: sK, sV (kBlockM keys) stay; two stages of sQ, sdO (kBlockN queries each) and of L
// and D (kBlockN floats each) stream.
template <int kHeadDim, int kMTiles = 1>
struct BwdKvTraits : TensorCoreTraits<kHeadDim, split_bwd_streamed_tile(kHeadDim, kMTiles), kMTiles> {
  using Base = TensorCoreTraits<kHeadDim, split_bwd_streamed_tile(kHeadDim, kMTiles), kMTiles>;
  static constexpr size_t kSmemBytes =
      (2 * Base::kBlockM + 4 * Base::kBlockN) * Base::kTileBytes + 4 * Base::kBlockN * sizeof(float);
};

// dQ: sQ, sdO (kBlockM queries) stay; two stages of sK, sV (kBlockN keys each) stream.
template <int kHeadDim, int kMTiles = 1>
struct BwdQTraits : TensorCoreTraits<kHeadDim, split_bwd_streamed_tile(kHeadDim, kMTiles), kMTiles> {
  using Base = TensorCoreTraits<kHeadDim, split_bwd_streamed_tile(kHeadDim, kMTiles), kMTiles>;
  static constexpr size_t kSmemBytes = (2 * Base::kBlockM + 4 * Base::kBlockN) * Base::kTileBytes;
};

// Fused backward (five products, dQ added with atomics; flash_bwd_mma.cu decides where):
// flash_bwd_fused_mma_kernel in FlashAttention-2's warp layouts. 8 warps, 128 keys per CTA (one
// fp32 atomic addition per score, as FlashAttention-2; 64 would make two) against query tiles
// of kQueryTile: 128 at head dims up to 64, 64 above (registers), as FlashAttention-2.
//   S = Q K^T, dP = dO V^T: 2 x 4 warps (queries x keys: kQueryTile / 2 x 32 each); P and dS go
//     to shared memory (bf16, query-major)
//   dV += P^T dO, dK += dS^T Q: 4 x 2 warps (32 keys x half the head dim each)
//   dQ's share dS K: kDqWarpsQ warps along the queries (32 each where the rest split the head
//     dim into whole pairs of n tiles, else 16) x the rest along the head dim
// A warp reads a quarter to a half of the Q and dO tiles per product. It replaced (session 15)
// a dK/dV kernel in which each warp owned 16 keys and read all of them, keeping P^T and dS^T in
// registers: on an H100 1.09-1.11x faster at head dim 128, 1.08-1.09x at 96, 1.11-1.18x at 64
// (two calls), 0.98-1.00x at 32. 175 KB of shared memory at head dim 128: one CTA per SM.
// kMinBlocks: CTAs per SM the kernel is compiled for (two: at most 128 registers a thread).
template <int kHeadDim, int kQueryTile = (kHeadDim <= 64 ? 128 : 64), int kMinBlocks_ = 1>
struct BwdFusedTraits : TensorCoreTraits<kHeadDim, kQueryTile, 1, 8> {
  using Base = TensorCoreTraits<kHeadDim, kQueryTile, 1, 8>;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kScoreRow = Base::kBlockM + 8;  // bf16 elements between rows of sP, sdS
  static constexpr int kSWarpsQ = 2;                   // S, dP: warps along the queries
  static constexpr int kSWarpsK = 4;                   // and along the keys (32 each)
  static constexpr int kKvWarpsK = 4;                  // dK, dV: warps along the keys (32 each)
  static constexpr int kKvDims = kHeadDim / 2;         // and a warp's dims
  static constexpr int kDqWarpsQ =                     // dQ share: warps along the queries
      kHeadDim / (Base::kNWarps / (Base::kBlockN / 32)) % 16 == 0 ? Base::kBlockN / 32 : Base::kBlockN / 16;
  static constexpr int kDqMTiles = Base::kBlockN / kDqWarpsQ / 16;
  static constexpr int kDqDims = kHeadDim / (Base::kNWarps / kDqWarpsQ);
  static constexpr size_t kSmemBytes = (2 * Base::kBlockM + 4 * Base::kBlockN) * Base::kTileBytes +
                                       4 * Base::kBlockN * sizeof(float) + 2 * Base::kBlockN * kScoreRow * 2;
  static constexpr size_t kConvertSmemBytes = Base::kBlockN * Base::kTileBytes;  // dQ's conversion: one bf16 tile
  static_assert(kKvDims % 16 == 0 && kDqDims % 16 == 0, "n tiles come in pairs");
};
// The head dim the fused backward runs a (compiled, padded) head dim at: BwdFusedTraits needs a
// warp's half of it to be whole pairs of n tiles, so 80 runs zero-padded in 96 (as PyTorch's
// FlashAttention-2 does); 0 at 16, which has none.
constexpr int fused_head_dim(int head_dim) { return head_dim <= 16 ? 0 : (head_dim + 31) / 32 * 32; }
// Calls run(Traits{}) with the fused backward's traits for a compiled fused head dim and mask:
// FlashAttention-2's tiles, but at head dim 32 without a causal mask query tiles of 64 and two
// CTAs per SM (75 KB of shared memory each, 128 registers, no spill): on an H100 (session 15)
// 0.95-0.97x of the time of one CTA of 128-query tiles at batch 8, no mask, T 8192-16384, but
// 1.07-1.45x under a causal mask.
template <int kHeadDim, class Run>
auto with_fused_traits(bool causal, Run&& run) {
  if constexpr (kHeadDim == 32) {
    if (!causal) return run(BwdFusedTraits<32, 64, 2>{});
  }
  return run(BwdFusedTraits<kHeadDim>{});
}

constexpr int simt_streamed_tile(int head_dim) { return head_dim > 64 ? 32 : 64; }
template <int kHeadDim_>
struct SimtTraits {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim: 32, 64 or 128
  static constexpr int kThreads = 256;
  static constexpr int kBlockM = 64;                            // stationary rows per CTA
  static constexpr int kBlockN = simt_streamed_tile(kHeadDim);  // streamed rows per tile (smem)
  static constexpr int kRowsPerThread = kBlockM / 16;           // rows ty + 16 i
  static constexpr int kScoreCols = kBlockN / 16;               // score columns tx + 16 j
  static constexpr int kDimCols = kHeadDim / 16;                // output columns (float4 groups)
  // Row pitches in floats: multiples of 4 (float4 reads), and 4 banks apart from row to row,
  // so the 8 lanes of a 128-bit load phase that read 8 different rows hit distinct banks.
  static constexpr int kRow = kHeadDim + 4;
  static constexpr int kScoreRow = kBlockN + 4;
  static constexpr size_t kStationaryBytes = sizeof(float) * kBlockM * kRow;
  static constexpr size_t kStreamedBytes = sizeof(float) * kBlockN * kRow;
  static constexpr size_t kScoreBytes = sizeof(float) * kBlockM * kScoreRow;
  // Forward: sQ; two stages of sK, sV; sP.
  static constexpr size_t kFwdSmemBytes = kStationaryBytes + 4 * kStreamedBytes + kScoreBytes;
  // dK/dV: sK, sV; sQ, sdO; sP^T, sdS^T; L and D of the query tile.
  static constexpr size_t kBwdKvSmemBytes =
      2 * kStationaryBytes + 2 * kStreamedBytes + 2 * kScoreBytes + 2 * sizeof(float) * kBlockN;
  // dQ: sQ, sdO; sK, sV; sdS.
  static constexpr size_t kBwdQSmemBytes = 2 * kStationaryBytes + 2 * kStreamedBytes + kScoreBytes;
  // CTAs per SM the kernels are compiled for (__launch_bounds__: at most 128 registers for
  // two, a few bytes of spill): a second CTA computes while the first loads its tiles. dK/dV
  // above head dim 64 fits shared memory for one only, and keeps its accumulators in registers.
  static constexpr int kMinBlocks = 2;
  static constexpr int kBwdKvMinBlocks = kHeadDim > 64 ? 1 : 2;
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128, "compiled head dims");
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "16 threads share a row");
};

}  // namespace llmhpc::flash

// Compile-time tile sizes of the FlashAttention-2 kernels. Runtime choices (dtype, head dim)
// become these template parameters only in the launchers (flash_launch.cuh).
//
// Tensor-core kernels: 4 warps; each warp owns 16*kMTiles rows of the CTA's stationary tile
// (queries in forward and dQ, keys in dK/dV), so the stationary tile is 64*kMTiles rows. The
// streamed tile (keys in forward and dQ, queries in dK/dV) is kBlockN rows; it shrinks to 32
// in the backward kernels for head dims above 64 or two m tiles (registers). Each B fragment a
// warp reads from shared memory feeds 2*kMTiles mma, so two m tiles halve the shared-memory reads
// per mma, and halve the CTAs: the forward takes them where the grid still fills the GPU
// (flash_fwd_mma.cu), the shared-memory-bound split backward at head dim 64 on long sequences
// (flash_bwd_mma.cu); at head dim 128 the dK, dV accumulators leave no registers for them.
// Shared memory rows are padded by 8 bf16 (16 bytes), which makes ldmatrix's eight row reads of
// a 8x8 matrix fall into distinct banks.
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
// while P V of this one runs. Rule: key tiles of 128 at head dims up to 32, as FlashAttention-2
// (a tile's products are short there, and 64-key tiles pay a tile's barriers, waits and softmax
// rescaling twice as often: on an H100 128 keys take 0.77-0.92x of the time,
// docs/results/attention.md); 64 above, where 128 gained nothing.
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
// A warp reads a quarter to a half of the Q and dO tiles per product (warps that each own 16 keys
// and read all of them were up to 1.18x slower on an H100: docs/results/attention.md). 175 KB of
// shared memory at head dim 128: one CTA per SM.
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
// CTAs per SM (75 KB of shared memory each, 128 registers, no spill), which take 0.96x of the time
// of one CTA of 128-query tiles on an H100 without the mask but are slower under it
// (docs/results/attention.md).
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

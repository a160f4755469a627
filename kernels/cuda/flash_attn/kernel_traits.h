// Compile-time tile sizes of the FlashAttention-2 kernels. Runtime choices (dtype, head dim)
// become these template parameters only in the launchers (flash_launch.cuh).
//
// Tensor-core kernels: 4 warps; each warp owns 16 rows of the CTA's stationary tile (queries
// in forward and dQ, keys in dK/dV), so the stationary tile is 64 rows. The streamed tile
// (keys in forward and dQ, queries in dK/dV) is kBlockN rows; it shrinks to 32 for head dims
// above 64 in the backward kernels, where two T x D accumulators live in registers. Shared
// memory rows are padded by 8 bf16 (16 bytes), which makes ldmatrix's eight row reads of a
// 8x8 matrix fall into distinct banks.
//
// CUDA-core kernels: 128 threads, tiles of 32 queries x 32 keys; a thread owns 2 rows x 4
// columns of a score tile and 2 rows x kHeadDim/8 columns of an output tile.
#pragma once
#include <cstddef>

namespace llmhpc::flash {

// The head dims the kernels are compiled for; a smaller head dim runs zero-padded.
constexpr int kTensorCoreHeadDims[] = {16, 32, 64, 96, 128};
constexpr int kSimtHeadDims[] = {32, 64, 128};
constexpr int kMaxHeadDim = 128;

template <int kHeadDim_, int kBlockN_>
struct TensorCoreTraits {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim, a multiple of 16
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kBlockM = 16 * kNWarps;  // rows of the stationary tile
  static constexpr int kBlockN = kBlockN_;      // rows of the streamed tile
  static constexpr int kSmemRow = kHeadDim + 8;  // bf16 elements between shared-memory rows
  static constexpr size_t kTileBytes = size_t(kSmemRow) * 2;  // per row of a tile
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "mma tiles are 16 wide");
};

// Forward: sQ (kBlockM rows), sK and sV (kBlockN rows each); K of the next tile is loaded
// while P V of this one runs.
template <int kHeadDim>
struct FwdTraits : TensorCoreTraits<kHeadDim, 64> {
  using Base = TensorCoreTraits<kHeadDim, 64>;
  static constexpr size_t kSmemBytes = (Base::kBlockM + 2 * Base::kBlockN) * Base::kTileBytes;
};

// dK/dV: sK, sV (kBlockM keys) stay; two stages of sQ, sdO (kBlockN queries each) and of L
// and D (kBlockN floats each) stream.
template <int kHeadDim>
struct BwdKvTraits : TensorCoreTraits<kHeadDim, (kHeadDim > 64 ? 32 : 64)> {
  using Base = TensorCoreTraits<kHeadDim, (kHeadDim > 64 ? 32 : 64)>;
  static constexpr size_t kSmemBytes =
      (2 * Base::kBlockM + 4 * Base::kBlockN) * Base::kTileBytes + 4 * Base::kBlockN * sizeof(float);
};

// dQ: sQ, sdO (kBlockM queries) stay; two stages of sK, sV (kBlockN keys each) stream.
template <int kHeadDim>
struct BwdQTraits : TensorCoreTraits<kHeadDim, (kHeadDim > 64 ? 32 : 64)> {
  using Base = TensorCoreTraits<kHeadDim, (kHeadDim > 64 ? 32 : 64)>;
  static constexpr size_t kSmemBytes = (2 * Base::kBlockM + 4 * Base::kBlockN) * Base::kTileBytes;
};

template <int kHeadDim_>
struct SimtTraits {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim, a multiple of 8
  static constexpr int kThreads = 128;
  static constexpr int kBlock = 32;            // queries and keys per tile
  static constexpr int kRowPad = kHeadDim + 1;  // floats between rows read across threads
  static constexpr int kScoreRow = kBlock + 1;  // floats between rows of a score tile
  static constexpr int kColsPerThread = kHeadDim / 8;
  // Forward: sQ, sK (padded rows), sV, sP.
  static constexpr size_t kFwdSmemBytes =
      sizeof(float) * (2 * kBlock * kRowPad + kBlock * kHeadDim + kBlock * kScoreRow);
  // dK/dV: sK, sV, sQ, sdO (padded rows), sP, sdS, L and D of the query tile.
  static constexpr size_t kBwdKvSmemBytes =
      sizeof(float) * (4 * kBlock * kRowPad + 2 * kBlock * kScoreRow + 2 * kBlock);
  // dQ: sQ, sdO, sK, sV (padded rows), sdS.
  static constexpr size_t kBwdQSmemBytes = sizeof(float) * (4 * kBlock * kRowPad + kBlock * kScoreRow);
  static_assert(kHeadDim % 8 == 0, "eight threads share a row");
};

}  // namespace llmhpc::flash

// Launchers of the tensor-core backward (split: dK/dV, then dQ; fused: dK/dV with dQ by
// atomics, then dQ's conversion) and their plan: one instantiation per compiled head dim.
// delta must be computed before (flash_api.cu).
#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/flash_attn/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {
namespace {

constexpr int kMinChunkTiles = 8;  // below this a chunk's hand-off outweighs what it spreads

// Rule: two m tiles per warp at head dim 64 (dK/dV: 128 keys x 32 queries; dQ: 128 queries x 32
// keys) for T >= 2048 where the grid has a CTA of 128 rows for every SM; else one. Each Q, dO
// (dK/dV) or K, V (dQ) fragment read from shared memory then feeds twice the mma, and the
// backward is bound by shared memory; with short key loops or few CTAs they lose. On an H100 up
// to 1.38x faster (docs/results/attention.md). LLMHPC_FLASH_BWD_ROWS=64|128 (settings.bwd_rows)
// forces one (the tests compare the two).
int bwd_m_tiles(const FlashParams& p) {
  if (padded_head_dim(p.head_dim, true) != 64) return 1;
  if (const int rows = p.settings.bwd_rows) return rows == 128 ? 2 : 1;
  return p.seq >= 2048 && int64_t(ceil_div(p.seq, 128)) * p.batch * p.heads >= sm_count() ? 2 : 1;
}
constexpr int kMTileRows = BwdKvTraits<64, 1>::kBlockM;  // rows per CTA of one m tile per warp (any head dim)

// CTAs of `kernel` that fit on one SM.
int ctas_per_sm(FlashKernel kernel, int threads, size_t smem_bytes) {
  int per_sm = 0;
  if (smem_bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  return std::max(1, per_sm);
}

// Streamed tiles per chunk for a kernel whose n_tiles stationary tiles (per head, bh heads)
// stream work(i) tiles each, on `sms` SMs of `per_sm` CTAs: the grid's total work per resident
// CTA, at least kMinChunkTiles; 0 (not chunked) where no tile is longer than one and a half
// chunks, or, for tiles of equal work (non-causal), where they cover every SM already (cut,
// they make a second, partial wave: 12% slower, docs/results/attention.md).
template <class Work>
int chunk_tiles(int n_tiles, int64_t bh, int sms, int per_sm, bool equal_work, Work work) {
  if (equal_work && bh * n_tiles >= sms) return 0;
  int64_t total = 0;
  int longest = 0;
  for (int i = 0; i < n_tiles; ++i) total += work(i), longest = std::max(longest, work(i));
  const int64_t resident = int64_t(sms) * per_sm;
  const int64_t chunk = std::max<int64_t>(kMinChunkTiles, (total * bh + resident - 1) / resident);
  return 2 * int64_t(longest) > 3 * chunk ? int(chunk) : 0;
}

// Floats of the fused backward's dQ accumulator: B*H x ceil(T / kBlockN) tiles of
// kBlockN x kHeadDim, for the traits p's mask takes (kernel_traits.h).
template <int kHeadDim>
int64_t fused_accum_floats(const FlashParams& p) {
  return with_fused_traits<kHeadDim>(p.causal, [&](auto traits) {
    using F = decltype(traits);
    return int64_t(p.batch) * p.heads * ceil_div(p.seq, F::kBlockN) * F::kBlockN * kHeadDim;
  });
}

// The fused backward (five products, dQ by atomics): FlashAttention-2's kernel, 128 keys per
// CTA (kernel_traits.h), at fused_head_dim(kHeadDim) (80 runs in 96). Rule (auto): take it on
// sequences of at least 2048 (4096 at head dim 80, 8192 at 64) whose grid of 128-key tiles
// covers every SM, where saving the split backward's recomputation pays (on an H100 up to 1.49x
// faster; docs/results/attention.md). Shorter sequences, grids smaller than the GPU (where the
// split backward's chunks spread the causal work) and head dim 64 on many heads (the split
// kernels' two m tiles) stay split. Head dim 16 has no fused kernel.
template <int kHeadDim>
bool fused_backward(const FlashParams& p) {
  switch (p.settings.bwd) {
    case FlashBwd::Split: return false;
    case FlashBwd::Fused: return true;
    case FlashBwd::Auto: break;
  }
  const int min_seq = kHeadDim == 64 ? 8192 : kHeadDim == 80 ? 4096 : 2048;
  return p.seq >= min_seq &&
         int64_t(ceil_div(p.seq, BwdFusedTraits<fused_head_dim(kHeadDim)>::kBlockM)) * p.batch * p.heads >= sm_count();
}

template <int kHeadDim, int kMTiles>
BwdPlan plan_bwd(const FlashParams& p) {
  using Kv = BwdKvTraits<kHeadDim, kMTiles>;
  using Q = BwdQTraits<kHeadDim, kMTiles>;
  BwdPlan plan;
  if constexpr (fused_head_dim(kHeadDim) != 0) {
    if (fused_backward<kHeadDim>(p)) {
      plan.dq_atomic = true;
      plan.dq_accum_floats = fused_accum_floats<fused_head_dim(kHeadDim)>(p);
      return plan;
    }
  }
  const int setting = p.settings.bwd_chunk;
  if (setting == 0) return plan;
  const int64_t bh = int64_t(p.batch) * p.heads;
  const int T = p.seq, n_kv = int(ceil_div(T, Kv::kBlockM)), n_q = int(ceil_div(T, Q::kBlockM));
  const int kv_streamed = int(ceil_div(T, Kv::kBlockN)), q_streamed = int(ceil_div(T, Q::kBlockN));
  auto kv_work = [&](int i) { return kv_streamed - (p.causal ? i * Kv::kBlockM / Kv::kBlockN : 0); };
  auto q_work = [&](int i) {
    return p.causal ? int(ceil_div(std::min((i + 1) * Q::kBlockM, T), Q::kBlockN)) : q_streamed;
  };
  if (setting > 0) {
    plan.kv_chunk = setting < kv_streamed ? setting : 0;
    plan.q_chunk = setting < q_streamed ? setting : 0;
  } else {
    static const int sms = sm_count();
    static const int kv_per_sm = ctas_per_sm(flash_bwd_dkdv_mma_kernel<Kv>, Kv::kThreads, Kv::kSmemBytes);
    static const int q_per_sm = ctas_per_sm(flash_bwd_dq_mma_kernel<Q>, Q::kThreads, Q::kSmemBytes);
    plan.kv_chunk = chunk_tiles(n_kv, bh, sms, kv_per_sm, !p.causal, kv_work);
    plan.q_chunk = chunk_tiles(n_q, bh, sms, q_per_sm, !p.causal, q_work);
  }
  if (plan.kv_chunk) plan.kv_accum_floats = bh * n_kv * 2 * Kv::kBlockM * kHeadDim, plan.kv_turns = bh * n_kv;
  if (plan.q_chunk) plan.q_accum_floats = bh * n_q * Q::kBlockM * kHeadDim, plan.q_turns = bh * n_q;
  return plan;
}

// The delta kernel, which runs before, zeroed the accumulator.
template <int kHeadDim>
void run_bwd_fused(const FlashParams& p, cudaStream_t stream) {
  if (!p.dq_accum || p.dq_atomic_floats != fused_accum_floats<kHeadDim>(p) || p.kv_chunk || p.q_chunk)
    LLMHPC_FATAL("flash backward: fused without its accumulator (of its traits' size), or chunked "
                 "(set_packed_backward sets the plan)");
  const unsigned bh = unsigned(p.batch * p.heads);
  with_fused_traits<kHeadDim>(p.causal, [&](auto traits) {
    using F = decltype(traits);
    launch_kernel(flash_bwd_fused_mma_kernel<F>, dim3(bh, ceil_div(p.seq, F::kBlockM)), F::kThreads, F::kSmemBytes,
                  stream, p);
    launch_kernel(flash_bwd_dq_convert_mma_kernel<F>, dim3(ceil_div(p.seq, F::kBlockN), bh), F::kThreads,
                  F::kConvertSmemBytes, stream, p);
  });
}

template <int kHeadDim, int kMTiles>
void run_bwd(const FlashParams& p, cudaStream_t stream) {
  using Kv = BwdKvTraits<kHeadDim, kMTiles>;
  using Q = BwdQTraits<kHeadDim, kMTiles>;
  const unsigned bh = unsigned(p.batch * p.heads);
  if ((p.kv_chunk && !(p.kv_accum && p.kv_turns)) || (p.q_chunk && !(p.q_accum && p.q_turns)))
    LLMHPC_FATAL("flash backward: chunks without their scratch (set_packed_backward sets both)");
  // Grid z: the chunks of the longest tile (key tile 0, and the last query tile under causal).
  auto chunks = [&](int chunk, int block_n) { return chunk ? ceil_div(ceil_div(p.seq, block_n), chunk) : 1u; };
  launch_kernel(flash_bwd_dkdv_mma_kernel<Kv>, dim3(bh, ceil_div(p.seq, Kv::kBlockM), chunks(p.kv_chunk, Kv::kBlockN)),
                Kv::kThreads, Kv::kSmemBytes, stream, p);
  launch_kernel(flash_bwd_dq_mma_kernel<Q>, dim3(bh, ceil_div(p.seq, Q::kBlockM), chunks(p.q_chunk, Q::kBlockN)),
                Q::kThreads, Q::kSmemBytes, stream, p);
}

// A compiled head dim and m tiles per warp, as constants for `run`.
template <int kHeadDim_, int kMTiles_>
struct Tiles {
  static constexpr int kHeadDim = kHeadDim_, kMTiles = kMTiles_;
};
template <class Run>
auto by_tiles(int head_dim, int m_tiles, Run run) {
  switch (head_dim) {
    case 16: return run(Tiles<16, 1>{});
    case 32: return run(Tiles<32, 1>{});
    case 64: return m_tiles == 2 ? run(Tiles<64, 2>{}) : run(Tiles<64, 1>{});
    case 80: return run(Tiles<80, 1>{});
    case 96: return run(Tiles<96, 1>{});
    case 128: return run(Tiles<128, 1>{});
  }
  LLMHPC_FATAL("flash backward: no tensor-core kernel for head dim " + std::to_string(head_dim));
}
// The same for the fused backward's compiled head dims (fused_head_dim's).
template <class Run>
auto by_fused_head_dim(int head_dim, Run run) {
  switch (head_dim) {
    case 32: return run(Tiles<32, 1>{});
    case 64: return run(Tiles<64, 1>{});
    case 96: return run(Tiles<96, 1>{});
    case 128: return run(Tiles<128, 1>{});
  }
  LLMHPC_FATAL("flash backward: no fused kernel for head dim " + std::to_string(head_dim));
}

}  // namespace

BwdPlan plan_bwd_tensor_core(const FlashParams& p) {
  return by_tiles(padded_head_dim(p.head_dim, true), bwd_m_tiles(p),
                  [&](auto t) { return plan_bwd<decltype(t)::kHeadDim, decltype(t)::kMTiles>(p); });
}

int bwd_tensor_core_rows(const FlashParams& p) {
  return p.dq_atomic ? BwdFusedTraits<128>::kBlockM : bwd_m_tiles(p) * kMTileRows;
}

int bwd_tensor_core_streamed(const FlashParams& p) {
  const int head_dim = padded_head_dim(p.head_dim, true);
  if (!p.dq_atomic) return split_bwd_streamed_tile(head_dim, bwd_m_tiles(p));
  return by_fused_head_dim(fused_head_dim(head_dim), [&](auto t) {
    return with_fused_traits<decltype(t)::kHeadDim>(p.causal, [](auto traits) { return decltype(traits)::kBlockN; });
  });
}

void launch_bwd_tensor_core(const FlashParams& p, const FlashVariant& v, cudaStream_t stream) {
  if (v.dq_sum == DqSum::Atomic)
    return by_fused_head_dim(v.bwd.head_dim, [&](auto t) { run_bwd_fused<decltype(t)::kHeadDim>(p, stream); });
  by_tiles(v.bwd.head_dim, v.bwd.rows / kMTileRows,
           [&](auto t) { run_bwd<decltype(t)::kHeadDim, decltype(t)::kMTiles>(p, stream); });
}

}  // namespace llmhpc::flash

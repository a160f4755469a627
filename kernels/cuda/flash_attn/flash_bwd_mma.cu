// Launchers of the tensor-core backward (dK/dV, then dQ): one instantiation per compiled
// head dim. delta must be computed before (flash_api.cu).
#include "kernels/cuda/flash_attn/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {
namespace {

template <int kHeadDim>
void run_bwd(const FlashParams& p, cudaStream_t stream) {
  using Kv = BwdKvTraits<kHeadDim>;
  using Q = BwdQTraits<kHeadDim>;
  const unsigned bh = unsigned(p.batch * p.heads);
  launch_kernel(flash_bwd_dkdv_mma_kernel<Kv>, dim3(bh, ceil_div(p.seq, Kv::kBlockM)), Kv::kThreads, Kv::kSmemBytes,
                stream, p);
  launch_kernel(flash_bwd_dq_mma_kernel<Q>, dim3(bh, ceil_div(p.seq, Q::kBlockM)), Q::kThreads, Q::kSmemBytes, stream,
                p);
}

}  // namespace

void launch_bwd_tensor_core(const FlashParams& p, cudaStream_t stream) {
  switch (padded_head_dim(p.head_dim, true)) {
    case 16: return run_bwd<16>(p, stream);
    case 32: return run_bwd<32>(p, stream);
    case 64: return run_bwd<64>(p, stream);
    case 96: return run_bwd<96>(p, stream);
    case 128: return run_bwd<128>(p, stream);
  }
  LLMHPC_FATAL("flash backward: no tensor-core kernel for head dim " + std::to_string(p.head_dim));
}

}  // namespace llmhpc::flash

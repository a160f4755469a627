// Launcher of the tensor-core forward: one instantiation per compiled head dim.
#include "kernels/cuda/flash_attn/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {
namespace {

template <int kHeadDim>
void run_fwd(const FlashParams& p, cudaStream_t stream) {
  using Tr = FwdTraits<kHeadDim>;
  const dim3 grid(ceil_div(p.seq, Tr::kBlockM), unsigned(p.batch * p.heads));
  launch_kernel(flash_fwd_mma_kernel<Tr>, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
}

}  // namespace

void launch_fwd_tensor_core(const FlashParams& p, cudaStream_t stream) {
  switch (padded_head_dim(p.head_dim, true)) {
    case 16: return run_fwd<16>(p, stream);
    case 32: return run_fwd<32>(p, stream);
    case 64: return run_fwd<64>(p, stream);
    case 96: return run_fwd<96>(p, stream);
    case 128: return run_fwd<128>(p, stream);
  }
  LLMHPC_FATAL("flash forward: no tensor-core kernel for head dim " + std::to_string(p.head_dim));
}

}  // namespace llmhpc::flash

// Launchers of the CUDA-core kernels: fp32 and bf16 storage x compiled head dims. The
// backward is fused (dK/dV kernel summing dQ into the accumulator, then its conversion) where
// the variant says so (DqSum::Ordered: the scratch of flash_backward_scratch_bytes() holds the
// accumulator, the default); split (dK/dV, then dQ) with LLMHPC_FLASH_BWD=split.
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"
#include "kernels/cuda/flash_attn/flash_simt_kernel.cuh"

namespace llmhpc::flash {
namespace {

template <int kHeadDim, class E>
void run_fwd(const FlashParams& p, cudaStream_t stream) {
  using Tr = SimtTraits<kHeadDim>;
  const dim3 grid(unsigned(p.batch * p.heads), ceil_div(p.seq, Tr::kBlockM));
  launch_kernel(flash_fwd_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kFwdSmemBytes, stream, p);
}

template <int kHeadDim, class E>
void run_bwd(const FlashParams& p, DqSum dq_sum, cudaStream_t stream) {
  using Tr = SimtTraits<kHeadDim>;
  const dim3 grid(unsigned(p.batch * p.heads), ceil_div(p.seq, Tr::kBlockM));
  // Five products: dQ summed by the dK/dV kernel (the delta kernel zeroed the counters).
  if (dq_sum == DqSum::Ordered) {
    launch_kernel(flash_bwd_dkdv_simt_kernel<Tr, E, true>, grid, Tr::kThreads, Tr::kBwdKvSmemBytes, stream, p);
    launch_kernel(flash_bwd_dq_convert_simt_kernel<Tr, E>,
                  dim3(ceil_div(p.seq * (kHeadDim / 4), 256), unsigned(p.batch * p.heads)), 256, 0, stream, p);
    return;
  }
  launch_kernel(flash_bwd_dkdv_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kBwdKvSmemBytes, stream, p);
  launch_kernel(flash_bwd_dq_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kBwdQSmemBytes, stream, p);
}

template <class E>
void fwd(const FlashParams& p, const FlashVariant::Kernels& k, cudaStream_t stream) {
  switch (k.head_dim) {
    case 32: return run_fwd<32, E>(p, stream);
    case 64: return run_fwd<64, E>(p, stream);
    case 128: return run_fwd<128, E>(p, stream);
  }
  LLMHPC_FATAL("flash forward: no CUDA-core kernel for head dim " + std::to_string(p.head_dim));
}

template <class E>
void bwd(const FlashParams& p, const FlashVariant& v, cudaStream_t stream) {
  switch (v.bwd.head_dim) {
    case 32: return run_bwd<32, E>(p, v.dq_sum, stream);
    case 64: return run_bwd<64, E>(p, v.dq_sum, stream);
    case 128: return run_bwd<128, E>(p, v.dq_sum, stream);
  }
  LLMHPC_FATAL("flash backward: no CUDA-core kernel for head dim " + std::to_string(p.head_dim));
}

}  // namespace

void launch_fwd_simt(const FlashParams& p, const FlashVariant::Kernels& fwd_kernels, cudaStream_t stream) {
  if (p.dtype == DType::F32) fwd<float>(p, fwd_kernels, stream);
  else fwd<bf16>(p, fwd_kernels, stream);
}

void launch_bwd_simt(const FlashParams& p, const FlashVariant& v, cudaStream_t stream) {
  if (p.dtype == DType::F32) bwd<float>(p, v, stream);
  else bwd<bf16>(p, v, stream);
}

}  // namespace llmhpc::flash

// Launcher of the tensor-core forward (one instantiation per compiled head dim and number of
// m tiles per warp) and its choice of rows.
#include "kernels/cuda/flash_attn/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {

// Rule: 128 query rows per CTA (two m tiles per warp: half the shared-memory reads per mma, half
// the CTAs) where the grid of 128-row tiles still fills the GPU, at least two CTAs per SM under a
// causal mask (whose CTAs differ in work) and one without; else 64. Head dim 16 always takes 64:
// its products are too short for the saved reads to pay. On an H100, 128 rows were 1.06-1.50x
// faster where this rule takes them (docs/results/attention.md). LLMHPC_FLASH_FWD_ROWS=64|128
// (settings.fwd_rows) forces one (the tests compare the two).
int fwd_tensor_core_rows(const FlashParams& p) {
  if (p.settings.fwd_rows) return p.settings.fwd_rows;
  if (padded_head_dim(p.head_dim, true) == 16) return 64;
  const int64_t ctas = int64_t(ceil_div(p.seq, 128)) * p.batch * p.heads;
  return ctas >= (p.causal ? 2 : 1) * int64_t(sm_count()) ? 128 : 64;
}

namespace {

template <class Tr>
void launch_fwd(const FlashParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.batch * p.heads), ceil_div(p.seq, Tr::kBlockM));
  launch_kernel(flash_fwd_mma_kernel<Tr>, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
}

template <int kHeadDim>
void run_fwd(const FlashParams& p, int rows, cudaStream_t stream) {
  using Two = FwdTraits<kHeadDim, 2>;
  if (rows == Two::kBlockM) launch_fwd<Two>(p, stream);
  else launch_fwd<FwdTraits<kHeadDim, 1>>(p, stream);
}

}  // namespace

void launch_fwd_tensor_core(const FlashParams& p, const FlashVariant::Kernels& fwd, cudaStream_t stream) {
  switch (fwd.head_dim) {
    case 16: return run_fwd<16>(p, fwd.rows, stream);
    case 32: return run_fwd<32>(p, fwd.rows, stream);
    case 64: return run_fwd<64>(p, fwd.rows, stream);
    case 80: return run_fwd<80>(p, fwd.rows, stream);
    case 96: return run_fwd<96>(p, fwd.rows, stream);
    case 128: return run_fwd<128>(p, fwd.rows, stream);
  }
  LLMHPC_FATAL("flash forward: no tensor-core kernel for head dim " + std::to_string(p.head_dim));
}

}  // namespace llmhpc::flash

// Launcher of the tensor-core forward (one instantiation per compiled head dim and number of
// m tiles per warp) and its choice of rows.
#include "kernels/cuda/flash_attn/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {

// 128 query rows per CTA (two m tiles per warp) read less shared memory per mma but give half
// the CTAs. What decides is whether those CTAs still fill the GPU: on an H100 (session 14,
// docs/results/attention.md) 128 rows won wherever the grid of 128-row tiles had at least two
// CTAs per SM under a causal mask (whose CTAs differ in work) or one without: batch 4 x 32 heads
// from T 512 (1.08-1.42x, head dims 64-128), 64 heads from T 1024, batch 8 x one head from T 8192
// (causal) or 4096 (not: 1.39x); and lost where they left SMs idle (batch 8, one head, T 1024:
// 0.76-0.83x; T 4096 causal: 0.84-0.93x). Session 4's kernels also lost at T 1024 with 64 heads;
// these win there (1.06-1.28x). At head dim 16 the products are too short for the saved
// shared-memory reads to matter: 64 rows were as fast or faster on every grid measured (session
// 21, with key tiles of 128: batch 8, T 4096-16384, 0.90-0.94x of 128 rows' time; one head,
// causal, T 65536, the same). At head dim 32 they were too, with key tiles of 64 (session 14);
// with 128 (kernel_traits.h), 128 rows follow the rule above (batch 8, T 4096-16384:
// 0.82-0.87x of 64 rows' time; causal, batch 1, T 65536: 0.87x; batch 1, T 16384, and batch 8,
// T 1024, where the grid is not full: 1.28x and 1.47x). LLMHPC_FLASH_FWD_ROWS=64|128
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

// The launchers behind flash_attn.h's API (private to kernels/cuda/flash_attn/). Each
// chooses the compiled head dim for p.head_dim, sizes the grid and enqueues on `stream`;
// the API has checked p before. Split over several .cu files so they compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/flash_attn/flash_attn.h"

namespace llmhpc::flash {

// Tensor cores, bf16 (flash_fwd_mma.cu, flash_bwd_mma.cu). The backward expects delta.
void launch_fwd_tensor_core(const FlashParams& p, cudaStream_t stream);
void launch_bwd_tensor_core(const FlashParams& p, cudaStream_t stream);

// CUDA cores, fp32 or bf16 storage (flash_simt.cu). The backward expects delta.
void launch_fwd_simt(const FlashParams& p, cudaStream_t stream);
void launch_bwd_simt(const FlashParams& p, cudaStream_t stream);

// delta = rowsum(dout * o) (flash_api.cu).
void launch_bwd_delta(const FlashParams& p, cudaStream_t stream);

// The smallest compiled head dim that holds `head_dim` (0 if none).
int padded_head_dim(int head_dim, bool tensor_cores);

}  // namespace llmhpc::flash

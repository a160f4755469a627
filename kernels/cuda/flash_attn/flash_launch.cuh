// The launch template shared by the launchers: opt in to more than 48 KB of dynamic shared
// memory when a kernel needs it, launch, check the launch (src/core/cuda/check.h).
#pragma once
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

using FlashKernel = void (*)(const FlashParams);

inline void launch_kernel(FlashKernel kernel, dim3 grid, int threads, size_t smem_bytes, cudaStream_t stream,
                          const FlashParams& p) {
  if (grid.x == 0 || grid.y == 0) return;
  if (smem_bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace llmhpc::flash

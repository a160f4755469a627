// Element conversion between storage types (fp32, bf16) and fp32 arithmetic, shared by the
// backend's kernels (common.cuh) and the FlashAttention kernels (flash_attn/utils.cuh).
#pragma once
#include <cuda_bf16.h>

namespace llmhpc::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as float_to_bf16_bits on the host
}

}  // namespace llmhpc::cuda

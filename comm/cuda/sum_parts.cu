#include "comm/cuda/sum_parts.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "src/core/cuda/check.h"

namespace llmhpc {
namespace {

__device__ float to_float(float v) { return v; }
__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void sum_parts_kernel(T* out, const T* parts, size_t count, int n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    float s = to_float(parts[i]);
    for (int r = 1; r < n; ++r) s += to_float(parts[size_t(r) * count + i]);
    out[i] = from_float<T>(s * scale);
  }
}

}  // namespace

void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, int sms,
               cudaStream_t stream) {
  if (count == 0) return;
  // A memory-bound pass beside compute: a grid of a few blocks per SM is enough to keep the
  // loads in flight, and leaves the compute kernels room.
  const int threads = 512;
  const int blocks = int(std::min<size_t>(size_t(sms) * 4, (count + threads - 1) / threads));
  switch (dtype) {
    case DType::F32:
      sum_parts_kernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(out), static_cast<const float*>(parts),
                                                       count, n, scale);
      break;
    case DType::BF16:
      sum_parts_kernel<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(out),
                                                       static_cast<const __nv_bfloat16*>(parts), count, n, scale);
      break;
    default: LLMHPC_FATAL(std::string("no copy-engine sum of dtype ") + dtype_name(dtype));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmhpc

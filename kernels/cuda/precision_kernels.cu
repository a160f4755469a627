// The accumulation experiment of mixed precision on the GPU (Ops::accumulation_experiment):
// sequential sums, each addition in fp32 and rounded to the sum's type with the device's own
// conversions (__float2half_rn, __float2bfloat16_rn), as PyTorch's CUDA `s += x` does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

__global__ void accumulation_kernel(float* out, float value, int64_t n) {
  const float x32 = value;
  const __half x16 = __float2half_rn(value);
  const __nv_bfloat16 xb = __float2bfloat16_rn(value);
  // The sums so far: out[1] and out[3] hold fp16 and bf16 values, converted back exactly.
  float s32 = out[0], mixed = out[2];
  __half s16 = __float2half_rn(out[1]);
  __nv_bfloat16 sb = __float2bfloat16_rn(out[3]);
  for (int64_t i = 0; i < n; ++i) {
    s32 += x32;
    s16 = __float2half_rn(__half2float(s16) + __half2float(x16));
    mixed += __half2float(x16);
    sb = __float2bfloat16_rn(__bfloat162float(sb) + __bfloat162float(xb));
  }
  out[0] = s32;
  out[1] = __half2float(s16);
  out[2] = mixed;
  out[3] = __bfloat162float(sb);
}

}  // namespace

void accumulation_experiment(float* out, double value, int64_t n, cudaStream_t stream) {
  accumulation_kernel<<<1, 1, 0, stream>>>(out, float(value), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmhpc::cuda

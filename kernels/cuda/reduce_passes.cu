// The passes of kernels/reduce_passes.h on the GPU: memory-bound, beside backward's compute,
// so a grid of a few blocks per SM keeps the loads in flight and leaves the compute kernels room.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "src/core/cuda/check.h"

namespace llmhpc::cuda {
namespace {

// Eight elements per thread where both sides allow 16-byte accesses (32 bytes of fp32, 16 of
// bf16), one at a time in the elements past them: memory-bound passes move the most bytes per
// instruction that way.
constexpr int kVector = 8;

struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};

__global__ void narrow_kernel(const float* data, __nv_bfloat16* wire, size_t count, size_t vectors) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    const float4 a = reinterpret_cast<const float4*>(data)[2 * i], b = reinterpret_cast<const float4*>(data)[2 * i + 1];
    Bf16x8 out;
    out.v[0] = __floats2bfloat162_rn(a.x, a.y);
    out.v[1] = __floats2bfloat162_rn(a.z, a.w);
    out.v[2] = __floats2bfloat162_rn(b.x, b.y);
    out.v[3] = __floats2bfloat162_rn(b.z, b.w);
    reinterpret_cast<Bf16x8*>(wire)[i] = out;
  }
  for (size_t i = vectors * kVector + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += stride)
    wire[i] = __float2bfloat16_rn(data[i]);
}

__global__ void widen_kernel(const __nv_bfloat16* wire, float* data, size_t count, size_t vectors) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    const Bf16x8 in = reinterpret_cast<const Bf16x8*>(wire)[i];
    const float2 p = __bfloat1622float2(in.v[0]), q = __bfloat1622float2(in.v[1]), r = __bfloat1622float2(in.v[2]),
                 s = __bfloat1622float2(in.v[3]);
    reinterpret_cast<float4*>(data)[2 * i] = make_float4(p.x, p.y, q.x, q.y);
    reinterpret_cast<float4*>(data)[2 * i + 1] = make_float4(r.x, r.y, s.x, s.y);
  }
  for (size_t i = vectors * kVector + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += stride)
    data[i] = __bfloat162float(wire[i]);
}

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

// Whole vectors of `count` where both buffers start on 16 bytes, else none.
size_t vectors(const void* data, const void* wire, size_t count) {
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0 && reinterpret_cast<uintptr_t>(wire) % 16 == 0;
  return aligned ? count / kVector : 0;
}

constexpr int kThreads = 512;
int blocks(size_t items) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return int(std::max<size_t>(1, std::min<size_t>(size_t(sms) * 4, (items + kThreads - 1) / kThreads)));
}

}  // namespace

void narrow_to_bf16(const float* data, void* wire, size_t count, void* stream) {
  if (count == 0) return;
  const size_t v = vectors(data, wire, count);
  narrow_kernel<<<blocks(v > 0 ? v : count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, static_cast<__nv_bfloat16*>(wire), count, v);
  CUDA_CHECK_LAUNCH();
}

void widen_from_bf16(const void* wire, float* data, size_t count, void* stream) {
  if (count == 0) return;
  const size_t v = vectors(data, wire, count);
  widen_kernel<<<blocks(v > 0 ? v : count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(wire), data, count, v);
  CUDA_CHECK_LAUNCH();
}

void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, void* stream) {
  if (count == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::F32:
      sum_parts_kernel<<<blocks(count), kThreads, 0, s>>>(static_cast<float*>(out), static_cast<const float*>(parts),
                                                          count, n, scale);
      break;
    case DType::BF16:
      sum_parts_kernel<<<blocks(count), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(out),
                                                          static_cast<const __nv_bfloat16*>(parts), count, n, scale);
      break;
    default: LLMHPC_FATAL(std::string("sum_parts: no sum of dtype ") + dtype_name(dtype));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmhpc::cuda

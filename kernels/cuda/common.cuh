// Helpers shared by the CUDA kernels: storage dtype <-> fp32 conversion, warp and block
// reductions, launch sizing, and the host-side dispatch from a DType to an element type.
// Kernels compute in fp32 whatever the storage dtype (bf16 is a storage format).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.h"
#include "src/core/tensor.h"

namespace llmhpc::cuda {


// ---- vector access -------------------------------------------------------------------------
// kN consecutive elements moved as one aligned load or store (16 bytes for 4 floats).
template <class T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

template <int kN, class T>
__device__ __forceinline__ Pack<T, kN> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, kN>*>(p);
}

template <int kN, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kN>& x) {
  *reinterpret_cast<Pack<T, kN>*>(p) = x;
}

// Whether every pointer is aligned to `bytes` (host side, to choose a vector path).
inline bool aligned_to(size_t bytes, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) return false;
  return true;
}

// ---- reductions ----------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum (or max) over the whole block, returned to every thread. blockDim.x is a multiple of
// 32 and at most 1024; `scratch` is __shared__ float[32]. Safe to call repeatedly.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : 0.f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// ---- launch sizing -------------------------------------------------------------------------
inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// Threads for a one-block-per-row kernel: enough to cover `cols` once, a multiple of 32,
// between 32 and `max_threads`.
inline int threads_for_row(int64_t cols, int max_threads = 1024) {
  int64_t t = (cols + 31) / 32 * 32;
  return int(t < 32 ? 32 : t > max_threads ? max_threads : t);
}

// Blocks for a grid-stride loop over n elements, `threads` per block: one element (or pack)
// per thread, the loop only striding past 2^31 - 1 blocks. A capped grid makes every thread
// walk several distant fronts of memory at once: AdamW over xl's 2B parameters took 20.6 ms
// instead of 20.1 on an H100 (KernelBench.AdamW, docs/results/sharding.md).
inline int blocks_for(int64_t n, int threads, int max_blocks = INT_MAX) {
  int64_t b = (n + threads - 1) / threads;
  return int(b < 1 ? 1 : b > max_blocks ? max_blocks : b);
}

// ---- dtype dispatch (host) ----------------------------------------------------------------
// Calls f(E{}) with E = float or bf16 for the storage dtype `t`; other dtypes are a
// UsageError naming the op.
template <class F>
void dispatch_float(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    default:
      throw UsageError(std::string(op) + ": the CUDA backend stores floating-point tensors in fp32 or bf16, not " +
                       dtype_name(t) + " (fp64 reference runs need {device} cpu)");
  }
}

inline void require_dtype(const char* op, const Tensor& t, DType want, const char* what) {
  if (t.dtype != want)
    throw UsageError(std::string(op) + ": " + what + " must be " + dtype_name(want) + " on the CUDA backend, not " +
                     dtype_name(t.dtype));
}

}  // namespace llmhpc::cuda

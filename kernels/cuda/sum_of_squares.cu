// Ops::sum_of_squares, gradient clipping's norm: the sum of x^2 over spans of a flat tensor, in
// double, added in an order fixed by the spans alone. The grid is a constant (not sized to the
// GPU), each thread adds its elements in turn, and the trees above are fixed, so ranks holding
// the same gradients get bitwise the same norm whatever their GPU or the timing.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

constexpr int kBlocks = 1024, kThreads = 256;

// Up to kMaxSpans spans of one launch, passed by value (kernel parameter space).
constexpr int kMaxSpans = 64;
struct SpanTable {
  int64_t at[kMaxSpans], size[kMaxSpans];
  int count = 0;
};

__device__ __forceinline__ double wide(float x) { return x; }
__device__ __forceinline__ double wide(double x) { return x; }
__device__ __forceinline__ double wide(bf16 x) { return __bfloat162float(x); }

// The sum over the block, in thread 0: warps by a fixed butterfly, then the warps' sums.
__device__ double block_sum_fixed(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Purpose: block b's sum of squares over the table's spans into partials[b].
// Algorithm: each span in turn, grid-strided, four loads in flight per thread (four running
// sums, added in a fixed order at the end).
template <class T>
__global__ void __launch_bounds__(kThreads) partial_sums_kernel(const T* x, SpanTable t, double* partials) {
  const int64_t stride = int64_t(kBlocks) * kThreads;
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int s = 0; s < t.count; ++s) {
    const T* p = x + t.at[s];
    const int64_t n = t.size[s];
    int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const double a = wide(p[i]), b = wide(p[i + stride]), c = wide(p[i + 2 * stride]), d = wide(p[i + 3 * stride]);
      s0 += a * a;
      s1 += b * b;
      s2 += c * c;
      s3 += d * d;
    }
    for (; i < n; i += stride) {
      const double a = wide(p[i]);
      s0 += a * a;
    }
  }
  const double sum = block_sum_fixed((s0 + s1) + (s2 + s3));
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Purpose: out[0] = the sum of partials[0, n), each thread's share in turn, then the block's tree.
__global__ void __launch_bounds__(kThreads) final_sum_kernel(const double* partials, int64_t n, double* out) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += partials[i];
  sum = block_sum_fixed(sum);
  if (threadIdx.x == 0) out[0] = sum;
}

}  // namespace

void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans, Allocator& scratch, cudaStream_t stream) {
  std::vector<SpanTable> tables(1);
  for (const Span& s : spans) {
    if (s.size == 0) continue;
    if (tables.back().count == kMaxSpans) tables.emplace_back();
    SpanTable& t = tables.back();
    t.at[t.count] = s.at;
    t.size[t.count++] = s.size;
  }
  Buffer partials(scratch, DType::F64, {int64_t(tables.size()) * kBlocks}, "sum_of_squares.partials");
  double* part = partials.tensor().ptr<double>();
  for (size_t k = 0; k < tables.size(); ++k) {
    double* block_sums = part + k * kBlocks;
    if (x.dtype == DType::F32)
      partial_sums_kernel<float><<<kBlocks, kThreads, 0, stream>>>(x.ptr<float>(), tables[k], block_sums);
    else if (x.dtype == DType::F64)
      partial_sums_kernel<double><<<kBlocks, kThreads, 0, stream>>>(x.ptr<double>(), tables[k], block_sums);
    else if (x.dtype == DType::BF16)
      partial_sums_kernel<bf16><<<kBlocks, kThreads, 0, stream>>>(x.ptr<bf16>(), tables[k], block_sums);
    else require_dtype("sum_of_squares", x, DType::F32, "x (fp32, fp64 or bf16)");
    CUDA_CHECK_LAUNCH();
  }
  final_sum_kernel<<<1, kThreads, 0, stream>>>(part, int64_t(tables.size()) * kBlocks, out.ptr<double>());
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmhpc::cuda

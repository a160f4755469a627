// RMSNorm forward (optionally fused with the residual add) and backward. Both are
// memory-bound: rows are moved with 4-element vector accesses when C and the pointers
// allow (kPack = 4), else element by element (kPack = 1).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

constexpr float kRmsEps = 1e-5f;

// Purpose: out = x * rstd * w per row, rstd = 1/sqrt(mean(x^2) + eps). With kResidual the
// residual add comes first: x_out = x + delta (stored in x's dtype), and the norm is of x_out;
// fusing saves a separate pass over the residual stream.
// Algorithm: one block per row. Pass 1 forms the row (adding delta), stores x_out and sums
// squares in fp32; a block reduction gives rstd. Pass 2 re-reads the row (each thread its
// own elements, hot in L1) and writes out.
// Shapes: x, delta, x_out, out (N,C); w (C) fp32; rstd (N) fp32. C % kPack == 0.
template <class R, class D, class O, bool kResidual, int kPack>
__global__ void rmsnorm_forward_kernel(R* x_out, O* out, float* rstd, const R* x, const D* delta, const float* w,
                                       int64_t C) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * C;
  float sum_sq = 0.f;
  for (int64_t c = threadIdx.x * kPack; c < C; c += blockDim.x * kPack) {
    Pack<R, kPack> v = load_pack<kPack>(x + base + c);
    if constexpr (kResidual) {
      const Pack<D, kPack> d = load_pack<kPack>(delta + base + c);
#pragma unroll
      for (int k = 0; k < kPack; ++k) v.v[k] = from_float<R>(to_float(v.v[k]) + to_float(d.v[k]));
      store_pack<kPack>(x_out + base + c, v);
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) sum_sq += to_float(v.v[k]) * to_float(v.v[k]);
  }
  const float r = 1.f / sqrtf(block_sum(sum_sq, scratch) / float(C) + kRmsEps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  const R* normed = kResidual ? x_out : x;
  for (int64_t c = threadIdx.x * kPack; c < C; c += blockDim.x * kPack) {
    const Pack<R, kPack> v = load_pack<kPack>(normed + base + c);
    const Pack<float, kPack> g = load_pack<kPack>(w + c);
    Pack<O, kPack> o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) o.v[k] = from_float<O>(to_float(v.v[k]) * r * g.v[k]);
    store_pack<kPack>(out + base + c, o);
  }
}

// Purpose: dx += r g w - r^3 x mean(g w x) per row (accumulated into dx), and per-block
// partial sums of the weight gradient sum_rows g x r, with g = dout.
// Algorithm: a grid of as many blocks as fit on the GPU at once strides over the rows. Per
// row, a block reduction gives mean(g w x), then each thread updates its columns of dx and
// adds to its columns of the block's dw accumulator in shared memory (a thread always owns
// the same columns, so no races). At the end each block writes its accumulator to
// partial_dw[block, :]; a second kernel sums those in block order, so the result is
// deterministic (no atomics). With dx_copy, the new dx is also stored in bf16 (the next
// products' input), saving the conversion's pass over dx.
// Shapes: dx, dout, x, dx_copy (N,C); w (C), rstd (N), partial_dw (gridDim.x, C) fp32.
// C % kPack == 0.
template <class DX, class G, class X, int kPack>
__global__ void rmsnorm_backward_kernel(DX* dx, bf16* dx_copy, float* partial_dw, const G* dout, const X* x,
                                        const float* w, const float* rstd, int64_t N, int64_t C) {
  extern __shared__ __align__(16) float dw_acc[];  // (C)
  __shared__ float scratch[32];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_acc[c] = 0.f;
  __syncthreads();  // the accumulator is zeroed with a different column-to-thread map
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t base = row * C;
    const float r = rstd[row];
    float gwx = 0.f;
    for (int64_t c = threadIdx.x * kPack; c < C; c += blockDim.x * kPack) {
      const Pack<G, kPack> g = load_pack<kPack>(dout + base + c);
      const Pack<X, kPack> xv = load_pack<kPack>(x + base + c);
      const Pack<float, kPack> wv = load_pack<kPack>(w + c);
#pragma unroll
      for (int k = 0; k < kPack; ++k) gwx += to_float(g.v[k]) * wv.v[k] * to_float(xv.v[k]);
    }
    const float k3 = r * r * r * block_sum(gwx, scratch) / float(C);
    for (int64_t c = threadIdx.x * kPack; c < C; c += blockDim.x * kPack) {
      const Pack<G, kPack> g = load_pack<kPack>(dout + base + c);
      const Pack<X, kPack> xv = load_pack<kPack>(x + base + c);
      const Pack<float, kPack> wv = load_pack<kPack>(w + c);
      Pack<DX, kPack> d = load_pack<kPack>(dx + base + c);
      Pack<float, kPack> acc = load_pack<kPack>(dw_acc + c);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float gk = to_float(g.v[k]), xk = to_float(xv.v[k]);
        d.v[k] = from_float<DX>(to_float(d.v[k]) + r * gk * wv.v[k] - k3 * xk);
        acc.v[k] += gk * xk * r;
      }
      store_pack<kPack>(dx + base + c, d);
      store_pack<kPack>(dw_acc + c, acc);
      if (dx_copy != nullptr) {
        Pack<bf16, kPack> lo;
#pragma unroll
        for (int k = 0; k < kPack; ++k) lo.v[k] = from_float<bf16>(to_float(d.v[k]));
        store_pack<kPack>(dx_copy + base + c, lo);
      }
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partial_dw[blockIdx.x * C + c] = dw_acc[c];
}

// Purpose: dw (C) = (or +=) sum over b of partial (blocks, C), in a fixed order.
// Algorithm: a block of 32 x 8 threads per 32 columns; threadIdx.y strides over the
// partial rows, then the 8 sums of each column are added in order through shared memory.
template <class W>
__global__ void sum_partials_kernel(W* dw, const float* partial, int blocks, int64_t C, bool accumulate) {
  __shared__ float sums[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (c < C)
    for (int b = threadIdx.y; b < blocks; b += 8) s += partial[b * C + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.f;
    for (int y = 0; y < 8; ++y) total += sums[y][threadIdx.x];
    dw[c] = from_float<W>(accumulate ? to_float(dw[c]) + total : total);
  }
}

// 4-wide access needs C % 4 == 0 and every row start aligned to 4 elements.
bool can_pack4(int64_t C, std::initializer_list<const Tensor*> ts) {
  if (C % 4 != 0) return false;
  for (const Tensor* t : ts)
    if (!t->empty() && !aligned_to(4 * dtype_size(t->dtype), {t->data})) return false;
  return true;
}

template <class R, class D, class O, bool kResidual, int kPack>
void launch_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w, int64_t N, int64_t C,
                    cudaStream_t stream) {
  rmsnorm_forward_kernel<R, D, O, kResidual, kPack><<<int(N), threads_for_row(C / kPack), 0, stream>>>(
      x_out.ptr<R>(), out.ptr<O>(), rstd.ptr<float>(), x.ptr<R>(), delta.ptr<D>(), w.ptr<float>(), C);
  CUDA_CHECK_LAUNCH();
}

template <class R, class D, class O, bool kResidual>
void launch_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w, int64_t N, int64_t C,
                    cudaStream_t stream) {
  if (can_pack4(C, {&x_out, &out, &x, &delta, &w}))
    launch_forward<R, D, O, kResidual, 4>(x_out, out, rstd, x, delta, w, N, C, stream);
  else launch_forward<R, D, O, kResidual, 1>(x_out, out, rstd, x, delta, w, N, C, stream);
}

template <class DX, class G, class X, int kPack>
void launch_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, Tensor dx_copy, int64_t N,
                     int64_t C, bool accumulate, int multiprocessors, Allocator& scratch, cudaStream_t stream) {
  auto kernel = rmsnorm_backward_kernel<DX, G, X, kPack>;
  const int threads = threads_for_row(C / kPack);
  const size_t shared_bytes = size_t(C) * sizeof(float);
  if (shared_bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes));
  const int blocks = int(std::min<int64_t>(N, int64_t(std::max(per_sm, 1)) * multiprocessors));
  Buffer partial(scratch, DType::F32, {blocks, C}, "rmsnorm_backward.partial_dw");
  kernel<<<blocks, threads, shared_bytes, stream>>>(dx.ptr<DX>(), dx_copy.empty() ? nullptr : dx_copy.ptr<bf16>(),
                                                    partial.tensor().ptr<float>(), dout.ptr<G>(), x.ptr<X>(),
                                                    w.ptr<float>(), rstd.ptr<float>(), N, C);
  CUDA_CHECK_LAUNCH();
  dispatch_float("rmsnorm_backward", dw.dtype, [&](auto w_type) {
    using W = decltype(w_type);
    sum_partials_kernel<W><<<ceil_div(C, 32), dim3(32, 8), 0, stream>>>(dw.ptr<W>(), partial.tensor().ptr<float>(),
                                                                        blocks, C, accumulate);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w, int64_t N, int64_t C,
                     cudaStream_t stream) {
  const char* op = delta.empty() ? "rmsnorm_forward" : "residual_rmsnorm_forward";
  require_dtype(op, w, DType::F32, "the gain w");
  require_dtype(op, rstd, DType::F32, "rstd");
  if (!delta.empty() && x_out.dtype != x.dtype) throw UsageError(std::string(op) + ": x_out and x must have one dtype");
  if (N == 0) return;
  dispatch_float(op, x.dtype, [&](auto r) {
    dispatch_float(op, out.dtype, [&](auto o) {
      using R = decltype(r);
      using O = decltype(o);
      if (delta.empty()) {
        launch_forward<R, R, O, false>(x_out, out, rstd, x, delta, w, N, C, stream);
      } else {
        dispatch_float(op, delta.dtype, [&](auto d) {
          launch_forward<R, decltype(d), O, true>(x_out, out, rstd, x, delta, w, N, C, stream);
        });
      }
    });
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, Tensor dx_copy, int64_t N,
                      int64_t C, bool accumulate, int multiprocessors, Allocator& scratch, cudaStream_t stream) {
  const char* op = "rmsnorm_backward";
  if (dw.dtype != DType::BF16) require_dtype(op, dw, DType::F32, "dw (or bf16)");
  if (!dx_copy.empty()) require_dtype(op, dx_copy, DType::BF16, "dx_copy");
  require_dtype(op, w, DType::F32, "the gain w");
  require_dtype(op, rstd, DType::F32, "rstd");
  if (N == 0) {
    if (!accumulate) CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.bytes(), stream));
    return;
  }
  const bool pack4 = can_pack4(C, {&dx, &dout, &x, &w, &dx_copy});
  dispatch_float(op, dx.dtype, [&](auto d) {
    dispatch_float(op, dout.dtype, [&](auto g) {
      dispatch_float(op, x.dtype, [&](auto xx) {
        using DX = decltype(d);
        using G = decltype(g);
        using X = decltype(xx);
        if (pack4)
          launch_backward<DX, G, X, 4>(dx, dw, dout, x, w, rstd, dx_copy, N, C, accumulate, multiprocessors, scratch,
                                       stream);
        else
          launch_backward<DX, G, X, 1>(dx, dw, dout, x, w, rstd, dx_copy, N, C, accumulate, multiprocessors, scratch,
                                       stream);
      });
    });
  });
}

}  // namespace llmhpc::cuda

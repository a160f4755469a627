// The embedding backward: a deterministic scatter-add of rows into the embedding gradient.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = int32_t(i);
}

// Purpose: dwte[token, :] += sum of dout[n, :] over the rows n holding that token.
// Algorithm: the (token, row) pairs come sorted by token, rows in increasing order within
// a token (a stable sort). Block s handles the run of equal tokens that starts at sorted
// position s (blocks inside a run exit at once): it sums the run's rows in order, column by
// column, and adds the sum to the token's row. Runs never share a row of dwte, so there
// are no atomics and the result does not depend on scheduling.
// Shapes: dwte (V,C) fp32 or bf16, dout (N,C), sorted_tokens and sorted_rows (N) int32.
template <class W, class G>
__global__ void embedding_backward_kernel(W* dwte, const G* dout, const int32_t* sorted_tokens,
                                          const int32_t* sorted_rows, int64_t N, int64_t C) {
  const int64_t start = blockIdx.x;
  const int32_t token = sorted_tokens[start];
  if (start > 0 && sorted_tokens[start - 1] == token) return;
  int64_t end = start + 1;
  while (end < N && sorted_tokens[end] == token) ++end;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.f;
    for (int64_t k = start; k < end; ++k) sum += to_float(dout[int64_t(sorted_rows[k]) * C + c]);
    W& out = dwte[int64_t(token) * C + c];
    out = from_float<W>(to_float(out) + sum);
  }
}

}  // namespace

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t N, int64_t C, Allocator& scratch,
                        cudaStream_t stream) {
  if (dwte.dtype != DType::BF16) require_dtype("embedding_backward", dwte, DType::F32, "dwte (or bf16)");
  if (N == 0) return;
  LLMHPC_CHECK(N < (int64_t(1) << 31), "embedding_backward: more rows than int32 sort indices");
  const int64_t V = dwte.dim(0);
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) < V) ++end_bit;

  // One scratch buffer: sorted tokens, row indices in and out, then CUB's temporary storage.
  const int32_t* keys_in = tokens.ptr<int32_t>();
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, static_cast<int32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                             int(N), 0, end_bit, stream));
  const int64_t ints = (3 * N + 63) / 64 * 64;  // keeps CUB's storage 256-byte aligned
  Buffer buf(scratch, DType::I32, {ints + int64_t(temp_bytes + 3) / 4}, "embedding_backward.sort");
  int32_t* base = buf.tensor().ptr<int32_t>();
  int32_t *keys_out = base, *rows_in = base + N, *rows_out = base + 2 * N;
  void* temp = base + ints;

  iota_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(rows_in, N);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in, rows_out, int(N), 0, end_bit,
                                             stream));
  dispatch_float("embedding_backward", dwte.dtype, [&](auto w) {
    dispatch_float("embedding_backward", dout.dtype, [&](auto g) {
      using W = decltype(w);
      using G = decltype(g);
      embedding_backward_kernel<<<int(N), threads_for_row(C, 256), 0, stream>>>(dwte.ptr<W>(), dout.ptr<G>(), keys_out,
                                                                                rows_out, N, C);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace llmhpc::cuda

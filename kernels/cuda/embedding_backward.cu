// The embedding backward: a deterministic scatter-add of rows into the embedding gradient.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace llmhpc::cuda {
namespace {

// The sort's input: rows[i] = i, and keys[i] = tokens[i] - vocab_begin, the row of dwte (V,C)
// the token adds to, or V for a token outside [vocab_begin, vocab_begin + V) (sorted after
// every row, and skipped).
__global__ void iota_kernel(int32_t* keys, int32_t* rows, const int32_t* tokens, int64_t n, int64_t V,
                            int64_t vocab_begin) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = int64_t(tokens[i]) - vocab_begin;
    keys[i] = int32_t(row >= 0 && row < V ? row : V);
    rows[i] = int32_t(i);
  }
}

// Purpose: dwte[token, :] += sum of dout[n, :] over the rows n holding that token.
// Algorithm: the (token, row) pairs come sorted by token, rows in increasing order within
// a token (a stable sort). Block s handles the run of equal tokens that starts at sorted
// position s (blocks inside a run, and those of tokens outside dwte, key V, exit at once): it
// sums the run's rows in order, column by column, and adds the sum to the token's row. Runs
// never share a row of dwte, so there are no atomics and the result does not depend on
// scheduling.
// Shapes: dwte (V,C) fp32 or bf16, dout (N,C), sorted_tokens (rows of dwte) and sorted_rows (N) int32.
template <class W, class G>
__global__ void embedding_backward_kernel(W* dwte, const G* dout, const int32_t* sorted_tokens,
                                          const int32_t* sorted_rows, int64_t N, int64_t V, int64_t C) {
  const int64_t start = blockIdx.x;
  const int32_t token = sorted_tokens[start];
  if (token >= V || (start > 0 && sorted_tokens[start - 1] == token)) return;
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

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t N, int64_t C, int64_t vocab_begin,
                        Allocator& scratch, cudaStream_t stream) {
  if (dwte.dtype != DType::BF16) require_dtype("embedding_backward", dwte, DType::F32, "dwte (or bf16)");
  if (N == 0) return;
  LLMHPC_CHECK(N < (int64_t(1) << 31), "embedding_backward: more rows than int32 sort indices");
  const int64_t V = dwte.dim(0);
  LLMHPC_CHECK(V < (int64_t(1) << 31) - 1, "embedding_backward: more rows of dwte than int32 sort keys");
  int end_bit = 1;  // keys in [0, V]: V marks a token outside dwte
  while (end_bit < 31 && (int64_t(1) << end_bit) <= V) ++end_bit;

  // One scratch buffer: keys (rows of dwte) and row indices, two buffers each that the sort
  // alternates between (cub::DoubleBuffer: CUB's own storage stays small), then that storage.
  const int64_t ints = (4 * N + 63) / 64 * 64;  // keeps CUB's storage 256-byte aligned
  int32_t* none = nullptr;
  cub::DoubleBuffer<int32_t> keys(none, none), rows(none, none);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, rows, int(N), 0, end_bit, stream));
  Buffer buf(scratch, DType::I32, {ints + int64_t(temp_bytes + 3) / 4}, "embedding_backward.sort");
  int32_t* base = buf.tensor().ptr<int32_t>();
  keys = cub::DoubleBuffer<int32_t>(base, base + N);
  rows = cub::DoubleBuffer<int32_t>(base + 2 * N, base + 3 * N);
  void* temp = base + ints;

  iota_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(keys.Current(), rows.Current(), tokens.ptr<int32_t>(), N, V,
                                                      vocab_begin);
  CUDA_CHECK_LAUNCH();
  // Sorted into keys.Current() and rows.Current() (the sort sets which buffer holds them).
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, rows, int(N), 0, end_bit, stream));
  const int32_t *sorted_keys = keys.Current(), *sorted_rows = rows.Current();
  dispatch_float("embedding_backward", dwte.dtype, [&](auto w) {
    dispatch_float("embedding_backward", dout.dtype, [&](auto g) {
      using W = decltype(w);
      using G = decltype(g);
      embedding_backward_kernel<<<int(N), threads_for_row(C, 256), 0, stream>>>(dwte.ptr<W>(), dout.ptr<G>(),
                                                                                sorted_keys, sorted_rows, N, V, C);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace llmhpc::cuda

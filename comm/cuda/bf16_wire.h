// The casts around a reduction of fp32 values that travel as bf16
// (Communicator::all_reduce_in_bf16_async): rounded into the wire before the collective,
// widened back after it, on the communicator's stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace llmhpc {

// wire[i] = bf16(data[i]), rounded to nearest even, for i < count. `sms`: the GPU's
// multiprocessors (the grid is a few blocks per SM, as sum_parts').
void narrow_to_bf16(const float* data, void* wire, size_t count, int sms, cudaStream_t stream);
// data[i] = float(wire[i]) (exact) for i < count.
void widen_from_bf16(const void* wire, float* data, size_t count, int sms, cudaStream_t stream);

}  // namespace llmhpc

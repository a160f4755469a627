// The elementwise passes of the data-parallel reductions that src/dist composes from the
// Communicator's primitives (a bf16 wire, the copy engines' part sums). They run on the stream
// the caller names, the communicator's (Communicator::enqueue_async), not the compute stream:
// the compute stream does not pay for them. `stream`: a cudaStream_t of the current GPU, the
// buffers in its memory; or nullptr, host memory, the pass run now (the reference loops).
// Defined in kernels/backend.cpp, the one place that knows which backends were built.
#pragma once
#include <cstddef>

#include "src/core/dtype.h"

namespace llmhpc {

// wire[i] = bf16(data[i]), rounded to nearest even, for i < count.
void narrow_to_bf16(const float* data, void* wire, size_t count, void* stream);
// data[i] = float(wire[i]) (exact) for i < count.
void widen_from_bf16(const void* wire, float* data, size_t count, void* stream);
// out[i] = scale * (parts[i] + parts[count + i] + ... + parts[(n-1) * count + i]) for i < count:
// fp32, or bf16 summed in fp32 and rounded once. The parts are added in rank order, so the
// owner of a part computes the same bits whoever reads them after an all-gather.
void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, void* stream);

}  // namespace llmhpc

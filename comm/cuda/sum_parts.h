// The one kernel of the copy-engine collectives (Communicator::use_copy_engines): after an
// all-to-all has put every rank's copy of this rank's part side by side, it adds them up.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "src/core/dtype.h"

namespace llmhpc {

// out[i] = scale * (parts[i] + parts[count + i] + ... + parts[(n-1) * count + i]) for i < count:
// fp32, or bf16 summed in fp32 and rounded once. The parts are added in rank order, so the
// owner of a part computes the same bits whoever reads them after the all-gather. `sms`: the
// GPU's multiprocessors (the grid is a few blocks per SM).
void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, int sms,
               cudaStream_t stream);

}  // namespace llmhpc

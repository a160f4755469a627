// Reductions through the copy engines (--collective-engine copy), composed from the
// Communicator's primitives: an in-place all-reduce or reduce-scatter of a range as an
// all-to-all of the ranks' parts into a scratch (copy engines), a pass that sums this rank's
// part (the SMs, kernels/reduce_passes.h, on the communicator's stream) and, for an all-reduce,
// an all-gather of the sums in place (copy engines). The SMs only sum; the bytes move with the
// copy engines, which leave the SMs to the compute beside them (CopyEngines says why). Every
// rank gets the same bits: each part is summed by its owner, in rank order.
#pragma once
#include <cstddef>

#include "comm/communicator.h"
#include "src/core/allocator.h"
#include "src/core/tensor.h"

namespace llmhpc {

class CopyEngineReduction {
 public:
  // Registers `region` (fp32 or bf16, from Allocator::allocate_shareable) and `scratch` (as
  // long as the longest range reduced, of the region's dtype, shareable too) as windows of
  // `engines`, which are `comm`'s. Collective.
  CopyEngineReduction(Communicator& comm, CopyEngines& engines, Tensor region, Buffer scratch);
  ~CopyEngineReduction();  // deregisters them, before the scratch goes
  CopyEngineReduction(const CopyEngineReduction&) = delete;
  CopyEngineReduction& operator=(const CopyEngineReduction&) = delete;

  // In the region, in place, as the communicator's all_reduce_async with send == recv. The
  // elements a part would not hold whole (count mod size()) take the communicator's all-reduce.
  CommHandle all_reduce_async(void* data, size_t count, ReduceOp op);
  // count * size() elements, rank r's reduced part back at data + r * count, as the
  // communicator's in-place reduce_scatter_async; the rest of the range is left undefined.
  CommHandle reduce_scatter_async(void* data, size_t count, ReduceOp op);

 private:
  CommHandle reduce(char* data, size_t count, ReduceOp op, bool gather);

  Communicator& comm_;
  CopyEngines& engines_;
  Tensor region_;
  Buffer scratch_;  // where every rank's copy of this rank's part arrives
};

}  // namespace llmhpc

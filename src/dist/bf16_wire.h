// Fp32 values that travel as bf16 (--grad-reduce-dtype bf16; PyTorch DDP's bf16_compress_hook,
// FSDP's reduce_dtype), composed from the Communicator's primitives: a range is rounded (to
// nearest even) into a bf16 wire, reduced there by the bf16 collective, and the result widened
// back, in place. Half the bytes of the fp32 collective; every rank gets the same values, those
// of the bf16 collective on the rounded inputs (on one rank: the rounded inputs). The casts are
// ordered among the collectives on the communicator's stream (Communicator::enqueue_async), so
// the compute stream does not pay for them, and the operations run one after another there:
// one wire as long as the longest range serves each in turn without waiting.
#pragma once
#include <cstddef>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "src/core/tensor.h"
#include "src/dist/copy_engine_reduction.h"

namespace llmhpc {

class Bf16Wire {
 public:
  // `wire`: bf16, in the memory the values are in. `engines`: the copy engines' reduction of
  // the wire, or null for the communicator's collectives; held by the caller, as the wire.
  Bf16Wire(Communicator& comm, Tensor wire, CopyEngineReduction* engines);

  // `count` values at `data`, in place.
  CommHandle all_reduce_async(float* data, size_t count, ReduceOp op);
  // count * size() values at `data`; rank r's reduced part back at data + r * count, the rest
  // left as it was.
  CommHandle reduce_scatter_async(float* data, size_t count, ReduceOp op);

 private:
  void reduce(size_t count, ReduceOp op, Collective c);

  Communicator& comm_;
  Tensor wire_;
  CopyEngineReduction* engines_;
};

}  // namespace llmhpc

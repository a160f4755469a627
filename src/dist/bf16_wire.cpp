#include "src/dist/bf16_wire.h"

#include "comm/collectives.h"
#include "kernels/reduce_passes.h"
#include "src/core/check.h"

namespace llmhpc {

Bf16Wire::Bf16Wire(Communicator& comm, Tensor wire, CopyEngineReduction* engines)
    : comm_(comm), wire_(wire), engines_(engines) {
  LLMHPC_CHECK(wire_.dtype == DType::BF16, "the wire is bf16");
  LLMHPC_CHECK(!engines_ || comm_.stream_ordered(), "the copy engines' reductions are stream-ordered");
}

CommHandle Bf16Wire::all_reduce_async(float* data, size_t count, ReduceOp op) {
  void* wire = wire_.data;
  LLMHPC_CHECK(count <= size_t(wire_.numel()), "the wire is shorter than the range");
  comm_.enqueue_async([=](void* stream) { narrow_to_bf16(data, wire, count, stream); });
  reduce(count, op, Collective::AllReduce);
  return comm_.enqueue_async([=](void* stream) { widen_from_bf16(wire, data, count, stream); });
}

CommHandle Bf16Wire::reduce_scatter_async(float* data, size_t count, ReduceOp op) {
  const size_t total = count * size_t(comm_.size()), mine = size_t(comm_.rank()) * count;
  uint16_t* wire = static_cast<uint16_t*>(wire_.data);
  LLMHPC_CHECK(total <= size_t(wire_.numel()), "the wire is shorter than the range");
  comm_.enqueue_async([=](void* stream) { narrow_to_bf16(data, wire, total, stream); });
  reduce(count, op, Collective::ReduceScatter);
  return comm_.enqueue_async([=](void* stream) { widen_from_bf16(wire + mine, data + mine, count, stream); });
}

// The bf16 collective in the wire, between the casts. On the host (mpi) the widening reads its
// result at once, so it completes here, in the blocking form (MPI's blocking collectives use
// better algorithms than its non-blocking ones).
void Bf16Wire::reduce(size_t count, ReduceOp op, Collective c) {
  const bool all = c == Collective::AllReduce;
  uint16_t* wire = static_cast<uint16_t*>(wire_.data);
  uint16_t* mine = wire + size_t(comm_.rank()) * count;
  if (engines_) {
    if (all) engines_->all_reduce_async(wire, count, op);
    else engines_->reduce_scatter_async(wire, count, op);
  } else if (comm_.stream_ordered()) {
    if (all) comm_.all_reduce_async(wire, wire, count, DType::BF16, op);
    else comm_.reduce_scatter_async(wire, mine, count, DType::BF16, op);
  } else {
    if (all) comm_.all_reduce(wire, wire, count, DType::BF16, op);
    else comm_.reduce_scatter(wire, mine, count, DType::BF16, op);
  }
}

}  // namespace llmhpc

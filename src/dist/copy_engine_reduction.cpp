#include "src/dist/copy_engine_reduction.h"

#include "kernels/reduce_passes.h"
#include "src/core/check.h"

namespace llmhpc {

CopyEngineReduction::CopyEngineReduction(Communicator& comm, CopyEngines& engines, Tensor region, Buffer scratch)
    : comm_(comm), engines_(engines), region_(region), scratch_(std::move(scratch)) {
  LLMHPC_CHECK(region_.dtype == DType::F32 || region_.dtype == DType::BF16,
               "the copy engines' reductions sum fp32 or bf16");
  LLMHPC_CHECK(scratch_.tensor().dtype == region_.dtype, "the scratch holds the region's dtype");
  engines_.register_window(region_.data, region_.bytes());
  engines_.register_window(scratch_.tensor().data, scratch_.tensor().bytes());
}

CopyEngineReduction::~CopyEngineReduction() {
  engines_.deregister_window(region_.data);
  engines_.deregister_window(scratch_.tensor().data);
}

CommHandle CopyEngineReduction::all_reduce_async(void* data, size_t count, ReduceOp op) {
  return reduce(static_cast<char*>(data), count, op, /*gather=*/true);
}

CommHandle CopyEngineReduction::reduce_scatter_async(void* data, size_t count, ReduceOp op) {
  return reduce(static_cast<char*>(data), count * size_t(comm_.size()), op, /*gather=*/false);
}

// Part r is [r * part, (r + 1) * part), part = count / size(). Each step reads the last one's
// result: they follow one another on the communicator's stream (on the host a dropped handle
// completes its operation first), so the last one's handle is the operation's.
CommHandle CopyEngineReduction::reduce(char* data, size_t count, ReduceOp op, bool gather) {
  const DType dtype = region_.dtype;
  const int ranks = comm_.size();
  const size_t es = dtype_size(dtype), part = count / size_t(ranks), rest = count - part * size_t(ranks);
  LLMHPC_CHECK(count <= size_t(scratch_.tensor().numel()), "the copy engines' scratch is shorter than the range");
  LLMHPC_CHECK(gather || rest == 0, "a reduce-scatter's count divides among the ranks");
  CommHandle last;
  if (part > 0) {
    void* scratch = scratch_.tensor().data;
    char* mine = data + size_t(comm_.rank()) * part * es;
    const float scale = op == ReduceOp::Average ? 1.0f / float(ranks) : 1.0f;
    engines_.all_to_all_async(data, scratch, part, dtype);
    last = comm_.enqueue_async([=](void* stream) { sum_parts(mine, scratch, part, ranks, dtype, scale, stream); });
    if (gather) last = engines_.all_gather_async(mine, data, part, dtype);
  }
  if (rest > 0) {
    char* tail = data + part * size_t(ranks) * es;
    last = comm_.all_reduce_async(tail, tail, rest, dtype, op);
  }
  return last;
}

}  // namespace llmhpc

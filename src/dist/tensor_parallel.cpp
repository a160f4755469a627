#include "src/dist/tensor_parallel.h"

#include <string>

#include "comm/collectives.h"
#include "src/core/check.h"
#include "src/core/units.h"
#include "src/dist/parallelism.h"

namespace llmhpc {

namespace {
// A Communicator's operation in flight as the model's Pending.
class PendingCollective final : public TensorParallelGroup::Pending {
 public:
  PendingCollective(CommTensorParallelGroup& group, CommHandle handle) : group_(group), handle_(std::move(handle)) {}
  ~PendingCollective() override { finish(); }  // never abandoned
  void finish() override {
    if (handle_.pending()) group_.wait(handle_);
  }

 private:
  CommTensorParallelGroup& group_;
  CommHandle handle_;
};
}  // namespace

void CommTensorParallelGroup::count(Collective c, size_t bytes) {
  traffic_.collectives += 1;
  traffic_.bytes += int64_t(bus_factor(c, size()) * double(bytes));
}

std::unique_ptr<TensorParallelGroup::Pending> CommTensorParallelGroup::begin_all_reduce(Tensor x) {
  count(Collective::AllReduce, x.bytes());
  return std::make_unique<PendingCollective>(
      *this, comm_.all_reduce_async(x.data, x.data, size_t(x.numel()), x.dtype, ReduceOp::Sum));
}

std::unique_ptr<TensorParallelGroup::Pending> CommTensorParallelGroup::begin_reduce_scatter(Tensor part, Tensor whole) {
  LLMHPC_CHECK(whole.dtype == part.dtype && whole.numel() == part.numel() * size(),
               "reduce_scatter: the whole must hold every rank's part");
  count(Collective::ReduceScatter, whole.bytes());
  return std::make_unique<PendingCollective>(
      *this, comm_.reduce_scatter_async(whole.data, part.data, size_t(part.numel()), part.dtype, ReduceOp::Sum));
}

std::unique_ptr<TensorParallelGroup::Pending> CommTensorParallelGroup::begin_all_gather(Tensor whole, Tensor part) {
  LLMHPC_CHECK(whole.dtype == part.dtype && whole.numel() == part.numel() * size(),
               "all_gather: the whole must hold every rank's part");
  count(Collective::AllGather, whole.bytes());
  return std::make_unique<PendingCollective>(
      *this, comm_.all_gather_async(part.data, whole.data, size_t(part.numel()), part.dtype));
}

void CommTensorParallelGroup::wait(CommHandle& handle) {
  if (!compute_) return handle.wait();
  if (next_mark_ + 2 > compute_->marks()) fold_marks();  // a step of more collectives than marks
  compute_->mark(next_mark_++);
  handle.wait();
  compute_->mark(next_mark_++);
}

void CommTensorParallelGroup::fold_marks() {
  for (int i = 0; i + 1 < next_mark_; i += 2) traffic_.exposed_ms += compute_->elapsed_ms(i, i + 1);
  next_mark_ = 0;
}

CommTensorParallelGroup::Traffic CommTensorParallelGroup::take_traffic(Timer* origin) {
  if (compute_) fold_marks();
  Traffic t = traffic_;
  if (comm_.busy_measured()) {
    t.spans = comm_.take_busy_spans(comm_.busy_mark(), origin, 0);
    t.busy_ms = 0;
    for (const OperationSpan& s : t.spans) t.busy_ms += s.end_ms - s.start_ms;
  }
  traffic_ = {};
  return t;
}

MeshPlace mesh_place(int rank, int world, int tp) {
  if (tp < 1 || world % tp != 0)
    throw UsageError("{tp} " + std::to_string(tp) + " does not divide the " + counted(world, "rank") +
                     ": the ranks form groups of tp; give a tp that divides the rank count" +
                     (world < tp && tp >= 1 ? ", or launch a multiple of " + std::to_string(tp) +
                                                  " ranks (mpirun -np " + std::to_string(tp) + " llmhpc ...)"
                                            : std::string()));
  return {tp, rank % tp, world / tp, rank / tp};
}

MeshRuntimes::MeshRuntimes(const Runtime& rt, int tp)
    : place(mesh_place(rt.rank, rt.world_size, tp)), dp(tp > 1 ? rt.group(place.tp_rank) : rt),
      tp(tp > 1 ? rt.group(place.dp_rank) : rt) {}

MeshRuntimes::~MeshRuntimes() {
  if (place.tp_size == 1) return;
  Runtime::free_group(dp);
  Runtime::free_group(tp);
}

TensorParallelMesh::TensorParallelMesh(const Runtime& rt, int tp, const std::string& backend, Device& dev)
    : ranks(rt, tp) {
  if (tp == 1) return;
  comm = make_model_communicator(rt, backend, dev, false, ranks.place.dp_rank);
  // Two marks per wait, read back once a step (take_traffic; a step of more waits folds them
  // early, which waits for the device once): a layer waits up to 12 times a micro-batch (sequence
  // parallelism: forward's 2 gathers and 2 reductions, backward's 4 gathers, 2 reductions and the
  // norm gains' 2 sums), 2 more per further chunk of forward's two row-parallel products
  // (overlap_chunks); 3072 waits hold 2.7B's 32 layers under sequence parallelism for 7
  // micro-batches (--grad-accum).
  group = std::make_unique<CommTensorParallelGroup>(*comm, dev.make_timer(2 * 32 * 96));
}

}  // namespace llmhpc

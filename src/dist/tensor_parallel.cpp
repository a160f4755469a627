#include "src/dist/tensor_parallel.h"

#include "src/core/check.h"

namespace llmhpc {

namespace {
// A Communicator's operation in flight as the model's Pending.
class PendingCollective final : public TensorParallelGroup::Pending {
 public:
  explicit PendingCollective(CommHandle handle) : handle_(std::move(handle)) {}
  ~PendingCollective() override { handle_.wait(); }  // never abandoned
  void finish() override { handle_.wait(); }

 private:
  CommHandle handle_;
};
}  // namespace

void CommTensorParallelGroup::count(double bus_factor, size_t bytes) {
  const double n = size();
  traffic_.collectives += 1;
  traffic_.bytes += int64_t(bus_factor * (n - 1) / n * double(bytes));
}

std::unique_ptr<TensorParallelGroup::Pending> CommTensorParallelGroup::begin_all_reduce(Tensor x) {
  count(2, x.bytes());
  return std::make_unique<PendingCollective>(
      comm_.all_reduce_async(x.data, x.data, size_t(x.numel()), x.dtype, ReduceOp::Sum));
}

std::unique_ptr<TensorParallelGroup::Pending> CommTensorParallelGroup::begin_reduce_scatter(Tensor part, Tensor whole) {
  LLMHPC_CHECK(whole.dtype == part.dtype && whole.numel() == part.numel() * size(),
               "reduce_scatter: the whole must hold every rank's part");
  count(1, whole.bytes());
  return std::make_unique<PendingCollective>(
      comm_.reduce_scatter_async(whole.data, part.data, size_t(part.numel()), part.dtype, ReduceOp::Sum));
}

void CommTensorParallelGroup::all_gather(Tensor whole, Tensor part) {
  LLMHPC_CHECK(whole.dtype == part.dtype && whole.numel() == part.numel() * size(),
               "all_gather: the whole must hold every rank's part");
  count(1, whole.bytes());
  comm_.all_gather(part.data, whole.data, size_t(part.numel()), part.dtype);
}

CommTensorParallelGroup::Traffic CommTensorParallelGroup::take_traffic() {
  const Traffic t = traffic_;
  traffic_ = {};
  return t;
}

MeshPlace mesh_place(int rank, int world, int tp) {
  if (tp < 1 || world % tp != 0)
    throw UsageError("{tp} " + std::to_string(tp) + " does not divide the " + std::to_string(world) +
                     " ranks: the ranks form groups of tp (tensor parallelism inside each), data parallelism across "
                     "them; give a tp that divides the rank count");
  return {tp, rank % tp, world / tp, rank / tp};
}

}  // namespace llmhpc

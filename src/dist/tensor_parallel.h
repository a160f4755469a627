// Tensor parallelism's side in src/dist: a tensor-parallel group's collectives on a
// Communicator (the model's TensorParallelGroup), and where each rank sits in the 2-D layout
// of tensor x data parallelism.
#pragma once
#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "src/model/tensor_parallel.h"

namespace llmhpc {

// The group's collectives in the tensors' dtype, the blocking forms of `comm` (on a GPU
// ordered on the compute stream, the host never waiting), counted for the rank files.
class CommTensorParallelGroup final : public TensorParallelGroup {
 public:
  explicit CommTensorParallelGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  std::unique_ptr<Pending> begin_all_reduce(Tensor x) override;
  std::unique_ptr<Pending> begin_reduce_scatter(Tensor part, Tensor whole) override;
  void all_gather(Tensor whole, Tensor part) override;

  // Collectives and the bytes each rank sent and received in them as a ring moves them (bus
  // bytes, nccl-tests' busbw convention: an all-reduce of S bytes 2 (n-1)/n S, an all-gather
  // or reduce-scatter whose whole is S bytes (n-1)/n S) since the last take_traffic().
  struct Traffic {
    int64_t collectives = 0, bytes = 0;
  };
  Traffic take_traffic();

 private:
  void count(double bus_factor, size_t bytes);
  Communicator& comm_;
  Traffic traffic_;
};

// A rank's place in the layout of `world` ranks as tp x dp: tensor-parallel groups of `tp`
// consecutive ranks (so that a group lies inside a node where a node's ranks divide by tp), and
// data parallelism among the ranks holding the same part (tp_rank) across the groups.
struct MeshPlace {
  int tp_size = 1, tp_rank = 0, dp_size = 1, dp_rank = 0;
};
// Throws UsageError (naming {tp}) where tp does not divide the world.
MeshPlace mesh_place(int rank, int world, int tp);

}  // namespace llmhpc

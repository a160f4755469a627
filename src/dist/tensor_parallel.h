// Tensor parallelism's side in src/dist: a tensor-parallel group's collectives on a
// Communicator (the model's TensorParallelGroup), and where each rank sits in the 2-D layout
// of tensor x data parallelism.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "kernels/backend.h"
#include "src/core/runtime.h"
#include "src/model/tensor_parallel.h"

namespace llmhpc {

// The group's collectives in the tensors' dtype, the asynchronous forms of `comm`, each
// finished by its Pending (on a GPU ordered on the compute stream, the host never waiting),
// counted for the rank files. Given a
// timer on the compute order (Device::make_timer), it also measures what the model waits for
// them: from each finish() to the collective's result, marked on either side of the wait (what
// the work issued since its begin did not hide; in forward the whole collective).
class CommTensorParallelGroup final : public TensorParallelGroup {
 public:
  explicit CommTensorParallelGroup(Communicator& comm, std::unique_ptr<Timer> compute = nullptr)
      : comm_(comm), compute_(std::move(compute)) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  std::unique_ptr<Pending> begin_all_reduce(Tensor x) override;
  std::unique_ptr<Pending> begin_reduce_scatter(Tensor part, Tensor whole) override;
  std::unique_ptr<Pending> begin_all_gather(Tensor whole, Tensor part) override;

  // Collectives and the bytes each rank sent and received in them as a ring moves them (bus
  // bytes, nccl-tests' busbw convention: an all-reduce of S bytes 2 (n-1)/n S, an all-gather
  // or reduce-scatter whose whole is S bytes (n-1)/n S) since the last take_traffic().
  struct Traffic {
    int64_t collectives = 0, bytes = 0;
    double exposed_ms = 0;  // the waits for them (with a timer; else 0)
    // Their own device time on the communicator's stream, hidden or not, while
    // time_collectives(true) holds (Communicator::take_busy_ms); NaN otherwise, and on mpi.
    double busy_ms = std::numeric_limits<double>::quiet_NaN();
    // Each of them when timing them, from mark 0 of take_traffic's `origin` (the step's timer).
    std::vector<OperationSpan> spans;
  };
  // Waits for the last collective's marks, and for the collectives when timing them.
  Traffic take_traffic(Timer* origin = nullptr);
  // Off by default: two timing events a collective, kept until take_traffic().
  void time_collectives(bool on) { comm_.time_operations(on); }

  void wait(CommHandle& handle);  // the handle's wait(), timed

 private:
  void count(Collective c, size_t bytes);  // one collective of `bytes` (the whole), by its bus factor
  void fold_marks();                       // the marked waits into traffic_.exposed_ms
  Communicator& comm_;
  std::unique_ptr<Timer> compute_;
  int next_mark_ = 0;
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

// The Runtimes of `rt`'s ranks laid out as tp x dp (mesh_place): `dp` over the ranks holding this
// rank's part, which data parallelism runs over, and `tp` over its tensor-parallel group; at tp 1
// both are `rt` itself (`tp` then unused). Collective.
class MeshRuntimes {
 public:
  MeshRuntimes(const Runtime& rt, int tp);
  ~MeshRuntimes();
  MeshRuntimes(const MeshRuntimes&) = delete;
  MeshRuntimes& operator=(const MeshRuntimes&) = delete;
  const MeshPlace place;
  Runtime dp, tp;

  // Whether the tensor-parallel group's ranks sit on more than one node: its collectives, four
  // per layer and step (more with sequence parallelism), then cross the network.
  bool tp_spans_nodes() const { return tp.spans_nodes(); }
};

// A rank's place in the tp x dp layout with what the model runs on: the Runtimes (MeshRuntimes)
// and the tensor-parallel group's collectives on `backend` (make_model_communicator; null at
// tp 1). Collective over `rt`; throws the same UsageError on every rank.
struct TensorParallelMesh {
  TensorParallelMesh(const Runtime& rt, int tp, const std::string& backend, Device& dev);
  MeshRuntimes ranks;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CommTensorParallelGroup> group;
  // TransformerLM::Config::tensor_parallel for this rank.
  TensorParallel model_config(bool sequence_parallel, int overlap_chunks) const {
    return {ranks.place.tp_size, ranks.place.tp_rank, sequence_parallel, overlap_chunks, group.get()};
  }
};

}  // namespace llmhpc

// Helpers for the tests that run under mpirun: this rank in MPI_COMM_WORLD, and whether
// every rank can run the nccl backend (decided collectively, so no rank is left alone in a
// collective when another one skips).
#pragma once
#include <mpi.h>

#include "comm/communicator.h"
#include "kernels/backend.h"

namespace llmhpc::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// This rank's place among the ranks of its node.
struct NodePlace {
  int rank = 0, size = 1;
};
inline NodePlace node_place() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodePlace p;
  MPI_Comm_rank(node, &p.rank);
  MPI_Comm_size(node, &p.size);
  MPI_Comm_free(&node);
  return p;
}

// Whether every rank can run nccl: compiled in, and on every node at least one GPU per rank.
inline bool nccl_runnable() {
  int mine = nccl_compiled() && cuda_device_count() >= node_place().size ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// This rank's GPU, as llmhpc picks it: local rank modulo the GPUs visible.
inline int local_gpu() { return node_place().rank % cuda_device_count(); }

}  // namespace llmhpc::test

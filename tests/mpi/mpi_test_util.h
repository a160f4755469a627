// Helpers for the tests that run under mpirun: this rank in MPI_COMM_WORLD, and whether
// every rank can run the nccl backend (decided collectively, so no rank is left alone in a
// collective when another one skips).
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <string>

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

// Whether ranks may share a GPU: LLMHPC_TEST_GPU_SHARING=1, for runs under
// scripts/fake_hosts.sh, where each rank's NCCL_HOSTID makes NCCL take the ranks of one GPU for
// hosts of their own, which it then connects over its network transport (NCCL refuses two
// ranks on one GPU of one host): the multi-rank NCCL paths on a machine with fewer GPUs than
// ranks (scripts/gpu/shared_gpu_check.sh). Correctness only: their time means nothing.
inline bool gpu_sharing() {
  const char* v = std::getenv("LLMHPC_TEST_GPU_SHARING");
  return v != nullptr && std::string(v) == "1";
}

// Whether every rank can run nccl: compiled in, and on every node at least one GPU per rank
// (or one GPU, shared: gpu_sharing).
inline bool nccl_runnable() {
  const int gpus = cuda_device_count();
  int mine = nccl_compiled() && gpus > 0 && (gpus >= node_place().size || gpu_sharing()) ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// This rank's GPU, as llmhpc picks it: local rank modulo the GPUs visible.
inline int local_gpu() { return node_place().rank % cuda_device_count(); }

}  // namespace llmhpc::test

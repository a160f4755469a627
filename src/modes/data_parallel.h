// What the modes that train over ranks (train, ddp) share: the --ddp and --bucket-mb
// options, the communicator that reduces the model's gradients, and which sequences of a
// global batch are this rank's (SPEC: rank r of n takes [r*B/n, (r+1)*B/n)).
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "src/dist/grad_sync.h"
#include "src/modes/mode.h"

namespace llmhpc {

// --ddp and --bucket-mb. A sweep takes comma-separated lists, and every strategy by default;
// training takes one value, bucketed on several ranks by default.
void add_data_parallel_options(po::options_description& desc, bool sweep);
// --ddp, with "auto" resolved: bucketed on several ranks, none on one. Throws UsageError.
std::vector<SyncStrategy> sync_strategies(const po::variables_map& vm, int world_size);
// --bucket-mb values (MiB, as PyTorch's bucket_cap_mb), each > 0. Throws UsageError.
std::vector<double> bucket_sizes_mb(const po::variables_map& vm);

// The communicator the gradients are reduced over: nccl on the model's GPU, ordered after its
// compute stream; mpi where the model lives in host memory. Collective; a UsageError (the mpi
// backend with a GPU model) on every rank alike.
std::unique_ptr<Communicator> make_gradient_communicator(const Runtime& rt, const po::variables_map& vm, Device& dev);

// This rank's sequences of a global batch. Throws UsageError when the batch does not divide
// by the ranks (the same verdict on every rank).
struct LocalBatch {
  int64_t first = 0, count = 0;
};
LocalBatch local_batch(int64_t global_batch, int rank, int world_size);

}  // namespace llmhpc

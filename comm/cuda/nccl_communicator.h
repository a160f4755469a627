// The NCCL communicator: collectives on device buffers of this rank's GPU, enqueued on the
// communicator's own stream and ordered against the compute stream with CUDA events (see
// comm/communicator.h). Bootstrap over MPI: rank 0's ncclGetUniqueId goes to every rank
// with MPI_Bcast, then ncclCommInitRankConfig (blocking; the watchdog polls each operation's
// completion event and the communicator's asynchronous error from its own thread and aborts:
// src/core/watchdog.h). Its copy engines are a zero-CTA communicator split from it at the first
// copy_engines(), on the same stream. Not thread-safe: one host thread drives it.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace llmhpc {

// Collective over options.parent; sets the current device to options.gpu.
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options);

// "2.28.3": the NCCL library this binary runs with.
std::string nccl_version();

}  // namespace llmhpc

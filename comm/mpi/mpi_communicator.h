// The MPI communicator: collectives on host buffers (the CPU baseline). Blocking forms use
// MPI's blocking collectives, async forms the non-blocking MPI_I* ones. bf16 sums use a
// user-defined MPI_Op (MPI has no bf16): each pairwise add is done in fp32 and rounded to
// bf16 (round to nearest even), as NCCL's bf16 reduction does. Average is a sum followed
// by one division by the rank count, rounded once to the element type. All-reduce goes in
// calls of at most 16 MiB (MPI's large-message temporaries otherwise cost page faults).
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/communicator.h"

namespace llmhpc {

// Collective over `parent` (which is duplicated, so our traffic never mixes with others').
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm parent);

}  // namespace llmhpc

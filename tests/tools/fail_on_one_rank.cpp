// Test program for the fatal path: the last rank hits a failed check while every other
// rank waits in a barrier. fatal() must print rank, host and the failing call, then abort
// the whole job, so mpirun returns non-zero instead of hanging
// (tests/scripts/test_fatal_aborts_job.sh).
#include <mpi.h>

#include "src/core/check.h"
#include "src/core/runtime.h"

int main(int argc, char** argv) {
  llmhpc::Runtime rt = llmhpc::Runtime::init(&argc, &argv);
  llmhpc::set_fatal_context_device("cpu");
  if (rt.rank == rt.world_size - 1) {
    const int bytes_free = 0;
    LLMHPC_CHECK(bytes_free > 0, "the planted failure");
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the others wait here forever unless the job is aborted
  rt.finalize();
  return 0;
}

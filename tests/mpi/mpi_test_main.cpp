// main() for GoogleTest suites that run under mpirun: every rank runs every test; rank 0 prints
// as usual, the other ranks only their failures (prefixed with the rank, so a check that fails
// on one rank alone is seen), and the exit code is the worst over all ranks.
#include <cblas.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/core/runtime.h"

namespace {

class FailuresOfThisRank : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOfThisRank(int rank) : rank_(rank) {}
  // The test's name as it starts: OnTestPartResult runs under GoogleTest's lock, which
  // UnitTest::current_test_info() takes again.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};

// Without OMP_NUM_THREADS (ctest sets 1), each rank takes its share of the CPUs it may run on,
// by llmhpc's own rule (Runtime::cpu_share). OpenMP's and OpenBLAS's defaults, every thread of
// the host for each rank, made a case of test_shard take 28-39 s on 2 ranks of a 32-core GPU
// host (87 ms on 2 cores).
void share_the_host() {
  if (std::getenv("OMP_NUM_THREADS")) return;
  llmhpc::Runtime rt;  // what cpu_share needs: the node's ranks
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &rt.node_comm);
  MPI_Comm_size(rt.node_comm, &rt.local_size);
  const int n = rt.cpu_share();
  MPI_Comm_free(&rt.node_comm);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  share_the_host();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOfThisRank(rank));
  }
  int rc = RUN_ALL_TESTS(), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

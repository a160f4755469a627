// main() for GoogleTest suites that run under mpirun: every rank runs every test; rank 0 prints
// as usual, the other ranks only their failures (prefixed with the rank, so a check that fails
// on one rank alone is seen), and the exit code is the worst over all ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
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

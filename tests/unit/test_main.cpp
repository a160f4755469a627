// main() for the single-process GoogleTest suites: MPI is initialised because fatal()
// and the recorder may use it, as in the real binary.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  // Every case skipped (the GPU suites without a GPU): ctest's skip code (tests/CMakeLists.txt),
  // so the suite reads as skipped, not passed.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) rc = 77;
  MPI_Finalize();
  return rc;
}

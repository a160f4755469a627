// The watchdog's side channel (src/core/progress_board.h) under mpirun with 1-4 ranks: every
// other rank's answer carries its progress and whether its watchdog has reported (what a
// firing watchdog waits for before it ends the job), asking a subset asks those ranks only,
// and a rank that has closed its board is named as not answering, its connection refused. No
// ASSERT before a barrier: a rank that left a test early would leave the others waiting in it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "src/core/progress_board.h"

namespace llmhpc {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

RankProgress progress_of(int rank) {
  RankProgress p;
  p.issued = uint64_t(rank) + 10;
  p.completed = uint64_t(rank);
  p.step = rank;
  p.last_name = "allreduce";
  p.last_backend = "mpi";
  p.last_bytes = 4096 * uint64_t(rank + 1);
  // Odd ranks: a strided group too long for the answer (every 8th of 320 ranks).
  for (int r = rank % 2; r < (rank % 2 ? 320 : 2); r += rank % 2 ? 8 : 1)
    p.last_group += (p.last_group.empty() ? "" : ",") + std::to_string(r);
  p.context = "rank " + std::to_string(rank);
  p.reported = rank % 2 == 1;
  return p;
}

TEST(ProgressBoard, AnswersCarryEachRanksProgressAndWhetherItReported) {
  const int rank = world_rank(), n = world_size();
  ProgressBoard board;
  EXPECT_EQ(board.open(rank, n, [rank] { return progress_of(rank); }), "");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<RankAnswer> answers = board.ask_all(5.0);
  EXPECT_EQ(answers.size(), size_t(n - 1));
  int expected = 0;
  for (const RankAnswer& a : answers) {
    if (expected == rank) ++expected;
    EXPECT_EQ(a.rank, expected++);
    EXPECT_TRUE(a.answered) << "rank " << a.rank << ": " << a.why;
    if (!a.answered) continue;
    const RankProgress want = progress_of(a.rank);
    EXPECT_EQ(a.progress.issued, want.issued);
    EXPECT_EQ(a.progress.completed, want.completed);
    EXPECT_EQ(a.progress.step, want.step);
    EXPECT_EQ(a.progress.last_name, want.last_name);
    EXPECT_EQ(a.progress.last_bytes, want.last_bytes);
    // A group that does not fit is cut after a whole rank, never inside a number.
    const std::string& group = a.progress.last_group;
    if (want.last_group.size() < 64) {
      EXPECT_EQ(group, want.last_group);
    } else {
      ASSERT_GT(group.size(), 4u);
      EXPECT_LT(group.size(), 64u);
      EXPECT_EQ(group.substr(group.size() - 4), ",...") << group;
      const std::string kept = group.substr(0, group.size() - 4);
      EXPECT_EQ(want.last_group.compare(0, kept.size(), kept), 0) << group;
      EXPECT_EQ(want.last_group[kept.size()], ',') << group;
    }
    EXPECT_EQ(a.progress.context, want.context);
    EXPECT_EQ(a.progress.reported, want.reported) << "rank " << a.rank;
  }
  // A subset: those ranks only, each once, in rank order; this rank and ranks outside the world
  // are left out.
  std::vector<int> some = {n, -1, rank};
  for (int r = n - 1; r >= 0; r -= 2) some.push_back(r);
  some.push_back(n - 1);  // asked once
  std::vector<int> want;
  for (int r = 0; r < n; ++r)
    if (r != rank && (n - 1 - r) % 2 == 0) want.push_back(r);
  std::vector<int> got;
  for (const RankAnswer& a : board.ask(some, 5.0)) {
    EXPECT_TRUE(a.answered) << "rank " << a.rank << ": " << a.why;
    got.push_back(a.rank);
  }
  EXPECT_EQ(got, want);
  MPI_Barrier(MPI_COMM_WORLD);
  board.close();
}

TEST(ProgressBoard, ARankWhoseBoardClosedDoesNotAnswer) {
  const int rank = world_rank(), n = world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  ProgressBoard board;
  EXPECT_EQ(board.open(rank, n, [rank] { return progress_of(rank); }), "");
  if (rank == n - 1) board.close();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != n - 1) {
    const std::vector<RankAnswer> answers = board.ask({n - 1}, 2.0);
    EXPECT_EQ(answers.size(), 1u);
    for (const RankAnswer& a : answers) {
      EXPECT_FALSE(a.answered);
      EXPECT_TRUE(a.refused) << a.why;
      EXPECT_FALSE(a.why.empty());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace llmhpc

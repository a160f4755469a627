// The watchdog's registry under operations of a fraction of a microsecond (one rank's no-op
// all-reduces): every one is counted and seen complete, and registering never blocks for good
// (past kWaitAt the issuing thread waits for the watchdog's thread to take them). And which
// ranks of a stuck collective's group a report names as the ones it waits for.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "src/core/progress_board.h"
#include "src/core/watchdog.h"

namespace llmhpc {

TEST(Watchdog, MillionsOfShortOperationsAreCountedAndRetired) {
  Watchdog& w = Watchdog::instance();
  w.start(/*timeout_s=*/100.0, /*rank=*/0, /*world_size=*/1);
  const uint64_t before = w.last_enqueued();
  constexpr int kOps = 1'000'000;
  for (int i = 0; i < kOps; ++i) Watchdog::complete(w.begin("allreduce", "mpi (host)", 4));
  EXPECT_EQ(w.last_enqueued(), before + kOps);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (w.last_completed() < before + kOps && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(w.last_completed(), before + kOps) << "the watchdog's thread did not retire every operation";
  w.stop();
}

// Rank 2 is stuck in collective #57 among ranks 0,2,4 (its own collectives complete up to #56).
TEST(Watchdog, AGroupCollectiveWaitsForTheRanksOfItsGroupThatAreBehind) {
  auto answer = [](int rank, uint64_t issued, uint64_t completed) {
    RankAnswer a;
    a.rank = rank;
    a.answered = true;
    a.progress.issued = issued;
    a.progress.completed = completed;
    return a;
  };
  Watchdog::HangReport r;
  r.collective = 57;
  r.group = {0, 2, 4};
  // Rank 0 had not issued it (its own group's collective #46 holds it); rank 4 issued it, as a
  // host ahead of its GPU does, but completed only up to #45; rank 1, outside the group, is behind
  // too and not waited for.
  r.not_reached = {0, 1};
  const std::vector<RankAnswer> answers = {answer(0, 46, 45), answer(1, 45, 45), answer(3, 57, 56), answer(4, 57, 45)};
  EXPECT_EQ(group_waits(r, 2, 56, answers),
            "    its group: ranks 0,2,4; of them it waits for ranks 0,4; rank 4 issued it, but its collectives "
            "completed only up to #45\n");
  EXPECT_EQ(r.waited_for, (std::vector<int>{0, 4}));
  // Every rank of the group issued it and completed what came before: none is named.
  r.not_reached = {1};
  EXPECT_EQ(group_waits(r, 2, 56, {answer(0, 57, 56), answer(4, 58, 56)}),
            "    its group: ranks 0,2,4; of them it waits for none (every rank of it issued it)\n");
  EXPECT_TRUE(r.waited_for.empty());
  // A rank of the group that gave no answer is waited for.
  r.no_answer = {4};
  group_waits(r, 2, 56, {answer(0, 57, 56)});
  EXPECT_EQ(r.waited_for, (std::vector<int>{4}));
}

}  // namespace llmhpc

// The watchdog's registry under operations of a fraction of a microsecond (one rank's no-op
// all-reduces): every one is counted and seen complete, and registering never blocks for good
// (past kWaitAt the issuing thread waits for the watchdog's thread to take them).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

}  // namespace llmhpc

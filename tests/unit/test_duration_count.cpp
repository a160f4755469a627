// --duration-s's count (src/modes/soak.h): aimed from the warm-up, re-aimed from the loop's
// own pace, so a warm-up that misjudges the pace neither cuts a soak short nor stretches it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "src/modes/soak.h"

namespace llmhpc {
namespace {

// Runs iterations of about 1 ms in the chunks `count` gives until it says done; returns
// (iterations, seconds).
std::pair<int64_t, double> run_loop(DurationCount& count) {
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  while (done < count.total()) {
    const int64_t chunk = count.next_chunk(done);
    EXPECT_GT(chunk, 0);
    for (int64_t i = 0; i < chunk; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done += chunk;
    count.after_chunk(done);
  }
  return {done, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

TEST(DurationCount, AWarmupFarSlowerThanTheLoopDoesNotCutTheRunShort) {
  Runtime rt;
  DurationCount count(rt, 0.3, 20, /*warmup_pace_s=*/10.0, /*max_chunk=*/50);
  EXPECT_EQ(count.total(), 1);  // what the warm-up alone would have run
  const auto [done, seconds] = run_loop(count);
  EXPECT_GT(done, 20);
  EXPECT_GT(seconds, 0.25);
  EXPECT_LT(seconds, 1.5);
}

TEST(DurationCount, AWarmupFarFasterThanTheLoopDoesNotStretchIt) {
  Runtime rt;
  DurationCount count(rt, 0.3, 20, /*warmup_pace_s=*/1e-6, /*max_chunk=*/50);
  EXPECT_EQ(count.total(), 300000);
  const auto [done, seconds] = run_loop(count);
  EXPECT_LT(done, 1000);
  EXPECT_GT(seconds, 0.25);
  EXPECT_LT(seconds, 1.5);
}

// A soak of iterations far shorter than the duration needs: at most kMaxTimedIterations, aimed
// from the warm-up and after a chunk alike, then it says it was capped.
TEST(DurationCount, AtMostTheCapOfTimedIterations) {
  Runtime rt;
  DurationCount count(rt, 1e6, 20, /*warmup_pace_s=*/1e-6, /*max_chunk=*/10000);
  EXPECT_EQ(count.total(), kMaxTimedIterations);
  EXPECT_TRUE(count.capped());
  count.after_chunk(count.next_chunk(0));  // a pace of microseconds over the chunk: far more left
  EXPECT_EQ(count.total(), kMaxTimedIterations);
  DurationCount short_one(rt, 0.3, 20, 1e-3, 50);
  EXPECT_FALSE(short_one.capped());
  DurationCount fixed(rt, 0, kMaxTimedIterations, 0, 7);  // a fixed count is the user's: never capped
  EXPECT_FALSE(fixed.capped());
}

TEST(DurationCount, WithoutADurationTheFixedCountInOneChunk) {
  Runtime rt;
  DurationCount count(rt, 0, 7, 0, 7);
  EXPECT_EQ(count.total(), 7);
  EXPECT_EQ(count.next_chunk(0), 7);
  count.after_chunk(7);
  EXPECT_EQ(count.total(), 7);
  EXPECT_EQ(count.next_chunk(7), 0);
}

TEST(ReserveTouched, KeepsWhatTheVectorHoldsAndMakesRoom) {
  std::vector<double> v{1, 2, 3};
  reserve_touched(v, 1000);
  EXPECT_EQ(v, (std::vector<double>{1, 2, 3}));
  EXPECT_GE(v.capacity(), 1000u);
  const double* data = v.data();
  for (int i = 0; i < 997; ++i) v.push_back(i);
  EXPECT_EQ(v.data(), data);  // no reallocation while it fills
}

}  // namespace
}  // namespace llmhpc

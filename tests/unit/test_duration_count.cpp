// --duration-s's count (src/modes/soak.h): aimed from the warm-up, re-aimed from the loop's
// own pace, so a warm-up that misjudges the pace neither cuts a soak short nor stretches it; and
// the thinning that keeps what a long loop records within bounds.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <thread>

#include "src/modes/soak.h"
#include "tests/unit/cpu_test_util.h"

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

// A soak of iterations far shorter than the duration needs: at most `most` (kMaxTimedIterations
// by default, where each iteration is recorded), aimed from the warm-up and after a chunk alike.
TEST(DurationCount, AtMostTheCapOfTimedIterations) {
  Runtime rt;
  DurationCount count(rt, 1e6, 20, /*warmup_pace_s=*/1e-6, /*max_chunk=*/10000);
  EXPECT_EQ(count.total(), kMaxTimedIterations);
  count.after_chunk(count.next_chunk(0));  // a pace of microseconds over the chunk: far more left
  EXPECT_EQ(count.total(), kMaxTimedIterations);
  DurationCount uncapped(rt, 1e6, 20, 1e-6, 10000, std::numeric_limits<int64_t>::max());  // comm's, thinned
  EXPECT_EQ(uncapped.total(), int64_t(1e12));
  DurationCount fixed(rt, 0, 2 * kMaxTimedIterations, 0, 7);  // a fixed count is the user's: never capped
  EXPECT_EQ(fixed.total(), 2 * kMaxTimedIterations);
}

// What Thinning records of a series of n values, for every n up to past four fillings of a
// small capacity, against the rule: values 0, e, 2e, ... where e is the smallest power of two
// with ceil(n / e) values within the capacity; the arrays it halves stay in step.
TEST(Thinning, RecordsEvenlySpacedValuesWithinItsCapacity) {
  for (const size_t capacity : {size_t(2), size_t(6), size_t(64)}) {
    Thinning thinning(capacity);
    std::vector<int64_t> recorded, twin;
    for (int64_t n = 1; n <= int64_t(9 * capacity); ++n) {
      if (thinning.record_next([&] {
            drop_odd(recorded);
            drop_odd(twin);
          })) {
        recorded.push_back(n - 1);
        twin.push_back(-(n - 1));
      }
      int64_t e = 1;
      while ((n + e - 1) / e > int64_t(capacity)) e *= 2;
      ASSERT_EQ(thinning.every(), e) << "capacity " << capacity << ", " << n << " values";
      ASSERT_EQ(recorded.size(), size_t((n + e - 1) / e)) << "capacity " << capacity << ", " << n << " values";
      for (size_t k = 0; k < recorded.size(); ++k) {
        ASSERT_EQ(recorded[k], int64_t(k) * e) << "capacity " << capacity << ", " << n << " values";
        ASSERT_EQ(twin[k], -recorded[k]);
      }
    }
  }
  EXPECT_THROW(Thinning(3), std::invalid_argument);
  EXPECT_THROW(Thinning(0), std::invalid_argument);
}

// Memory samples past kMaxMemorySamples: thinned evenly, the five arrays in step, each sample
// still saying after which iteration it was taken.
TEST(MemorySamples, PastTheirCapacityThinnedEvenlyInStep) {
  Backend be = test::cpu_backend();
  const size_t offered = 2 * kMaxMemorySamples + 3;
  MemorySamples memory(offered);
  for (size_t k = 0; k < offered; ++k) memory.take(int64_t(10 * k + 9), *be.device, int64_t(k));
  EXPECT_EQ(memory.offered(), offered);
  Record rec;
  memory.record(rec);
  const auto array = [&](const std::string& name) {
    for (const auto& [n, values] : rec.int_series)
      if (n == name) return values;
    ADD_FAILURE() << "no " << name;
    return std::vector<int64_t>{};
  };
  const std::vector<int64_t> iteration = array("memory_iteration"), records = array("records_bytes");
  ASSERT_EQ(iteration.size(), kMaxMemorySamples / 2 + 1);  // 1 in 4 of 2 x capacity + 3
  for (const char* name : {"device_live_bytes", "device_used_bytes", "host_rss_bytes"})
    EXPECT_EQ(array(name).size(), iteration.size()) << name;
  for (size_t i = 0; i < iteration.size(); ++i) {
    ASSERT_EQ(records[i], int64_t(4 * i)) << i;  // the sample offered 4i-th
    ASSERT_EQ(iteration[i], 10 * records[i] + 9) << i;
  }
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

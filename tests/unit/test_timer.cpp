// The host side of the one Timer interface (src/core/timer.h): marks, elapsed time between
// marks of one timer and between marks of two timers on the same clock.
#include <gtest/gtest.h>

#include <thread>

#include "src/core/timer.h"

namespace llmhpc {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(HostTimer, MeasuresBetweenMarks) {
  auto t = make_host_timer(3);
  EXPECT_EQ(t->marks(), 3);
  t->mark(0);
  sleep_ms(20);
  t->mark(1);
  t->mark(2);
  EXPECT_GE(t->elapsed_ms(0, 1), 19.0);
  EXPECT_LT(t->elapsed_ms(0, 1), 5000.0);
  EXPECT_GE(t->elapsed_ms(1, 2), 0.0);
  EXPECT_LT(t->elapsed_ms(1, 2), t->elapsed_ms(0, 1));
  EXPECT_LT(t->elapsed_ms(1, 0), 0.0) << "the time from a later mark back to an earlier one is negative";
}

// Two timers (a compute stream's and a communicator's, on the host) share one clock.
TEST(HostTimer, TwoTimersShareOneClock) {
  auto compute = make_host_timer(2), comm = make_host_timer(2);
  compute->mark(0);
  sleep_ms(10);
  comm->mark(0);
  sleep_ms(10);
  comm->mark(1);
  compute->mark(1);
  const double start = comm->elapsed_ms(*compute, 0, 0), end = comm->elapsed_ms(*compute, 0, 1);
  EXPECT_GE(start, 9.0);
  EXPECT_GE(end - start, 9.0);
  EXPECT_GE(compute->elapsed_ms(*comm, 1, 1), 0.0) << "the compute timer's last mark comes after the comm timer's";
  EXPECT_NEAR(compute->elapsed_ms(0, 1), start + (end - start) + compute->elapsed_ms(*comm, 1, 1), 1e-6);
}

}  // namespace
}  // namespace llmhpc

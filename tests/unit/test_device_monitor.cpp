// The sweep's device monitor (src/core/device_monitor.h) with a scripted reader: readings in
// order from start() to stop(), none where there is nothing to read, the summary over the
// busy readings, and the names of NVML's slowdown reasons.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "src/core/device_monitor.h"

namespace llmhpc {
namespace {

using namespace std::chrono_literals;

// Reading n has clock 1000 + n MHz, power n W, temperature 30 + n, reasons n % 2 (idle on odd).
struct CountingReader {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  bool operator()(DeviceReading& r) const {
    const int n = (*calls)++;
    r = {1000.0 + n, double(n), 30.0 + n, uint64_t(n % 2)};
    return true;
  }
};

TEST(DeviceMonitor, ReadsInOrderFromStartToStop) {
  CountingReader reader;
  DeviceMonitor monitor(reader, 5ms);
  monitor.start();
  std::this_thread::sleep_for(60ms);
  monitor.stop();
  const DeviceMonitor::Samples& s = monitor.samples();
  const int n = reader.calls->load();
  ASSERT_GE(n, 2) << "one reading at start, one at stop";
  ASSERT_EQ(int(s.time_ms.size()), n);
  EXPECT_EQ(s.time_ms.front(), 0.0);
  EXPECT_GE(s.time_ms.back(), 59.0) << "stop's reading comes after the measurement";
  for (int i = 0; i < n; ++i) {
    if (i > 0) EXPECT_GE(s.time_ms[size_t(i)], s.time_ms[size_t(i - 1)]) << i;
    EXPECT_EQ(s.sm_clock_mhz[size_t(i)], 1000.0 + i) << i;
    EXPECT_EQ(s.power_w[size_t(i)], double(i)) << i;
    EXPECT_EQ(s.temperature_c[size_t(i)], 30.0 + i) << i;
    EXPECT_EQ(s.clock_reasons[size_t(i)], i % 2) << i;
  }
  // A second measurement starts afresh; with a long interval only start's and stop's readings.
  DeviceMonitor slow(reader, std::chrono::hours(1));
  slow.start();
  slow.stop();
  slow.start();
  slow.stop();
  EXPECT_EQ(slow.samples().time_ms.size(), 2u);
  EXPECT_EQ(slow.samples().sm_clock_mhz.front(), 1000.0 + n + 2);
}

// train's snapshots: copies of the readings so far while the thread goes on adding.
TEST(DeviceMonitor, SnapshotsWhileRunning) {
  CountingReader reader;
  DeviceMonitor monitor(reader, 1ms);
  monitor.start();
  std::this_thread::sleep_for(20ms);
  const DeviceMonitor::Samples early = monitor.snapshot();
  std::this_thread::sleep_for(20ms);
  monitor.stop();
  const DeviceMonitor::Samples& all = monitor.samples();
  ASSERT_GE(early.time_ms.size(), 1u);
  ASSERT_GT(all.time_ms.size(), early.time_ms.size()) << "the thread went on after the snapshot";
  for (size_t i = 0; i < early.time_ms.size(); ++i) EXPECT_EQ(early.sm_clock_mhz[i], all.sm_clock_mhz[i]) << i;
  EXPECT_EQ(early.sm_clock_mhz.size(), early.clock_reasons.size());
}

TEST(DeviceMonitor, NothingToReadStartsNothing) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  DeviceMonitor monitor([calls](DeviceReading&) { return ++*calls, false; }, 1ms);
  for (int i = 0; i < 2; ++i) {
    monitor.start();
    std::this_thread::sleep_for(10ms);
    monitor.stop();
    EXPECT_TRUE(monitor.samples().time_ms.empty());
    EXPECT_EQ(monitor.summary().busy_samples, 0);
  }
  EXPECT_EQ(calls->load(), 1) << "a reader with nothing to read is not asked again";
  CountingReader reader;
  DeviceMonitor off(reader, 0ms);  // --device-sample-ms 0
  off.start();
  off.stop();
  EXPECT_EQ(reader.calls->load(), 0);
  EXPECT_TRUE(off.samples().time_ms.empty());
}

TEST(DeviceMonitor, DestroyedWhileRunningStops) {
  CountingReader reader;
  {
    DeviceMonitor monitor(reader, 1ms);
    monitor.start();
    std::this_thread::sleep_for(5ms);
  }  // joins the thread: no hang, no crash
  const int n = reader.calls->load();
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(reader.calls->load(), n) << "no reading after the monitor is gone";
}

TEST(DeviceMonitor, SummaryIsOverBusyReadings) {
  using namespace clock_reason;
  DeviceMonitor::Samples s;
  auto add = [&](double mhz, uint64_t reasons) {
    s.time_ms.push_back(double(s.time_ms.size()));
    s.sm_clock_mhz.push_back(mhz);
    s.power_w.push_back(100);
    s.temperature_c.push_back(50);
    s.clock_reasons.push_back(int64_t(reasons));
  };
  add(345, kIdle | kSwPowerCap);  // idle: neither its clock nor its reasons count
  add(1980, 0);
  add(1755, kSwPowerCap);
  add(1800, kHwThermal | 0x2);  // 0x2, application clocks: not a slowdown
  const ClockSummary c = summarize_clocks(s);
  EXPECT_EQ(c.busy_samples, 3);
  EXPECT_EQ(c.min_mhz, 1755);
  EXPECT_EQ(c.median_mhz, 1800);
  EXPECT_EQ(c.max_mhz, 1980);
  EXPECT_EQ(c.slowdowns, kSwPowerCap | kHwThermal);
  EXPECT_EQ(slowdown_names(c.slowdowns), "sw power cap, hw thermal");
  EXPECT_EQ(summarize_clocks({}).busy_samples, 0);
}

TEST(DeviceMonitor, SlowdownNames) {
  using namespace clock_reason;
  EXPECT_EQ(slowdown_names(0), "none");
  EXPECT_EQ(slowdown_names(kIdle | 0x2 | 0x10 | 0x100), "none");
  EXPECT_EQ(slowdown_names(kSlowdowns), "sw power cap, hw slowdown, sw thermal, hw thermal, hw power brake");
  EXPECT_EQ(slowdown_names(kHwPowerBrake | kSwThermal), "sw thermal, hw power brake");
}

}  // namespace
}  // namespace llmhpc

// The device's clocks, power and temperature while a configuration is measured: a thread
// reads them every --device-sample-ms, so a reader of the results can see whether the GPU
// ran at its clock or slowed down under its power cap or heat (which moves step times by 10%
// within a run on an H100 at full load), as nvbench and Nsight Systems' GPU metrics show.
//
//   DeviceMonitor monitor([&](DeviceReading& r) { return device.read_sensors(r); }, 50ms);
//   monitor.start();  ...measure...;  monitor.stop();
//   monitor.samples(), monitor.summary()  // what the sweep records (docs/hdf5-schema.md)
//
// A reader that has nothing to read (the CPU, a GPU without NVML) returns false: no thread is
// started and nothing is recorded.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/core/device_sensors.h"

namespace llmhpc {

// What the readings of one measurement say, over those taken while the GPU was busy (the
// idle reason unset): the SM clock's range and median, and every slowdown reason seen.
struct ClockSummary {
  int busy_samples = 0;
  double min_mhz = 0, median_mhz = 0, max_mhz = 0;
  uint64_t slowdowns = 0;  // the OR of the busy readings' slowdown bits
};

class DeviceMonitor {
 public:
  using Reader = std::function<bool(DeviceReading&)>;
  // interval 0: no readings at all.
  DeviceMonitor(Reader read, std::chrono::milliseconds interval);
  ~DeviceMonitor();
  DeviceMonitor(const DeviceMonitor&) = delete;
  DeviceMonitor& operator=(const DeviceMonitor&) = delete;

  // Forgets the last measurement's readings, takes one now and then one every interval on a
  // thread of its own until stop(), which takes a last one. Nothing where the reader has
  // nothing to read.
  void start();
  void stop();

  // The readings of the last start() .. stop(): time since start (ms) and the values.
  struct Samples {
    std::vector<double> time_ms, sm_clock_mhz, power_w, temperature_c;
    std::vector<int64_t> clock_reasons;
  };
  // After stop(): the readings as they are.
  const Samples& samples() const { return samples_; }
  ClockSummary summary() const;  // of samples()
  // While it runs too: a copy of the readings so far.
  Samples snapshot() const;

 private:
  void take();                                  // a reading now, kept if there is one
  void keep(const DeviceReading& r, double t);  // at t ms since start()
  void loop();

  Reader read_;
  std::chrono::milliseconds interval_;
  bool readable_ = true;  // false once the reader had nothing to read
  std::chrono::steady_clock::time_point start_;
  Samples samples_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

ClockSummary summarize_clocks(const DeviceMonitor::Samples& samples);

}  // namespace llmhpc

#include "src/core/device_monitor.h"

#include <algorithm>
#include <utility>

#include "src/core/stats.h"

namespace llmhpc {

DeviceMonitor::DeviceMonitor(Reader read, std::chrono::milliseconds interval)
    : read_(std::move(read)), interval_(interval), readable_(read_ && interval.count() > 0) {}

DeviceMonitor::~DeviceMonitor() { stop(); }

void DeviceMonitor::start() {
  stop();
  samples_ = Samples{};
  if (!readable_) return;
  start_ = std::chrono::steady_clock::now();
  DeviceReading first;
  if (!read_(first)) {  // nothing to read here: never again
    readable_ = false;
    return;
  }
  keep(first, 0.0);
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void DeviceMonitor::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  take();
}

void DeviceMonitor::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    take();
    lock.lock();
  }
}

void DeviceMonitor::take() {
  DeviceReading r;
  if (!read_(r)) return;  // a reading that failed now and then: skipped
  keep(r, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
}

void DeviceMonitor::keep(const DeviceReading& r, double t) {
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.time_ms.push_back(t);
  samples_.sm_clock_mhz.push_back(r.sm_clock_mhz);
  samples_.power_w.push_back(r.power_w);
  samples_.temperature_c.push_back(r.temperature_c);
  samples_.clock_reasons.push_back(int64_t(r.clock_reasons));
}

ClockSummary DeviceMonitor::summary() const { return summarize_clocks(samples_); }

DeviceMonitor::Samples DeviceMonitor::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return samples_;
}

ClockSummary summarize_clocks(const DeviceMonitor::Samples& samples) {
  ClockSummary s;
  std::vector<double> busy;
  for (size_t i = 0; i < samples.time_ms.size(); ++i) {
    const uint64_t reasons = uint64_t(samples.clock_reasons[i]);
    if (reasons & clock_reason::kIdle) continue;
    busy.push_back(samples.sm_clock_mhz[i]);
    s.slowdowns |= reasons & clock_reason::kSlowdowns;
  }
  s.busy_samples = int(busy.size());
  if (busy.empty()) return s;
  s.min_mhz = *std::min_element(busy.begin(), busy.end());
  s.max_mhz = *std::max_element(busy.begin(), busy.end());
  s.median_mhz = median(busy);
  return s;
}

}  // namespace llmhpc

#include "src/modes/sensors.h"

#include <cmath>
#include <vector>

#include "src/core/table.h"
#include "src/core/watchdog.h"
#include "src/modes/options.h"

namespace llmhpc {

void record_arrivals(Record& rec) {
  const std::vector<Watchdog::StepArrival> steps = Watchdog::instance().arrivals();
  if (steps.empty()) return;
  std::vector<int64_t> index, step, collectives;
  std::vector<double> start, first, last;
  for (const Watchdog::StepArrival& a : steps) {
    index.push_back(a.index);
    step.push_back(a.step);
    collectives.push_back(a.collectives);
    start.push_back(a.start_s);
    first.push_back(a.first_s);
    last.push_back(a.last_s);
  }
  rec.add("arrival_index", std::move(index))
      .add("arrival_step", std::move(step))
      .add("arrival_start_s", std::move(start))
      .add("arrival_first_s", std::move(first))
      .add("arrival_last_s", std::move(last))
      .add("arrival_collectives", std::move(collectives));
}

void record_sensors(Record& rec, const DeviceMonitor::Samples& s) {
  if (s.time_ms.empty()) return;
  rec.add("device_time_ms", s.time_ms)
      .add("device_sm_clock_mhz", s.sm_clock_mhz)
      .add("device_power_w", s.power_w)
      .add("device_temperature_c", s.temperature_c)
      .add("device_clock_reasons", s.clock_reasons);
  const ClockSummary c = summarize_clocks(s);
  rec.attr("device_busy_samples", int64_t(c.busy_samples)).attr("device_slowdowns", slowdown_names(c.slowdowns));
  if (c.busy_samples > 0)
    rec.attr("device_sm_clock_mhz_min", c.min_mhz)
        .attr("device_sm_clock_mhz_median", c.median_mhz)
        .attr("device_sm_clock_mhz_max", c.max_mhz);
}

std::string slowdown_note(const Runtime& rt, const ClockSummary& mine) {
  constexpr int kBits = 8;  // the slowdown reasons are among NVML's bits 0-7
  std::vector<double> v(kBits + 2, 0.0);
  for (int b = 0; b < kBits; ++b) v[size_t(b)] = (mine.slowdowns >> b) & 1;
  const bool busy = mine.busy_samples > 0;
  v[kBits] = busy ? -mine.min_mhz : -INFINITY;  // Max of the negated: the lowest minimum
  v[kBits + 1] = busy ? mine.max_mhz : -INFINITY;
  const std::vector<double> all = rt.reduce_all(v, HostReduce::Max);
  uint64_t slowdowns = 0;
  for (int b = 0; b < kBits; ++b) slowdowns |= uint64_t(all[size_t(b)] > 0) << b;
  if (!slowdowns) return "";
  return "; clocks slowed (" + slowdown_names(slowdowns) + "): SM " + fmt(-all[kBits], 0) + "-" +
         fmt(all[kBits + 1], 0) + " MHz" + (rt.world_size > 1 ? " over the ranks" : "");
}

std::unique_ptr<DeviceMonitor> device_monitor(const ModeContext& ctx) {
  return std::make_unique<DeviceMonitor>(
      [&device = *ctx.backend.device](DeviceReading& r) { return device.read_sensors(r); }, ctx.device_sample);
}

}  // namespace llmhpc

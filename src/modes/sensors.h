// The device's sensors as the measuring modes read them (the sweep's configurations, comm's,
// train's run): src/core/device_monitor.h over the mode's device.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "src/core/device_monitor.h"
#include "src/io/recorder.h"
#include "src/modes/mode.h"

namespace llmhpc {

// A monitor of ctx's device every ctx.device_sample (--device-sample-ms).
std::unique_ptr<DeviceMonitor> device_monitor(const ModeContext& ctx);
// The readings into a record (docs/hdf5-schema.md, "Device sensors"): the raw arrays, and
// their summary over the busy readings as attributes; nothing where there are none.
void record_sensors(Record& rec, const DeviceMonitor::Samples& samples);
// The current configuration's arrival times (Watchdog::arrivals) into a record
// (docs/hdf5-schema.md, "Arrivals"): one row per step that issued collectives; nothing where
// none did.
void record_arrivals(Record& rec);
// What rank 0 adds to a line when a busy GPU slowed its clock on any rank ("; clocks slowed
// (sw power cap): SM 1755-1980 MHz"), or "". Collective.
std::string slowdown_note(const Runtime& rt, const ClockSummary& mine);

}  // namespace llmhpc

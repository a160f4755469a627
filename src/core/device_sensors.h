// One reading of a device's sensors (Device::read_sensors: NVML on a GPU), and what NVML's
// clocks event reasons mean.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

namespace llmhpc {

// One reading of a GPU's sensors (NVML).
struct DeviceReading {
  double sm_clock_mhz = 0, power_w = 0, temperature_c = 0;
  uint64_t clock_reasons = 0;  // NVML's clocks event reasons: why the SM clock is below its maximum
};

// NVML's clocks event reasons (nvml.h, nvmlClocksEventReason*): the bits that slow a busy GPU.
namespace clock_reason {
constexpr uint64_t kIdle = 0x1, kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20, kHwThermal = 0x40,
                   kHwPowerBrake = 0x80;
constexpr uint64_t kSlowdowns = kSwPowerCap | kHwSlowdown | kSwThermal | kHwThermal | kHwPowerBrake;
}  // namespace clock_reason
// "sw power cap, hw thermal" for the slowdown bits of `reasons`; "none" for none.
inline std::string slowdown_names(uint64_t reasons) {
  using namespace clock_reason;
  static const std::pair<uint64_t, const char*> kNames[] = {{kSwPowerCap, "sw power cap"},
                                                            {kHwSlowdown, "hw slowdown"},
                                                            {kSwThermal, "sw thermal"},
                                                            {kHwThermal, "hw thermal"},
                                                            {kHwPowerBrake, "hw power brake"}};
  std::string out;
  for (const auto& [bit, name] : kNames)
    if (reasons & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  return out.empty() ? "none" : out;
}

}  // namespace llmhpc

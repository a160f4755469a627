// Facts about a GPU that a reader of results needs to trust a number: its name and size,
// the CUDA runtime and driver, and from NVML (where the driver provides it) the SM clock
// when the run started and the enforced power limit (root attributes of every rank file);
// and its sensors while it runs.
#pragma once
#include <memory>

#include "src/core/attrs.h"
#include "src/core/device_sensors.h"

namespace llmhpc {

Attrs gpu_environment(int ordinal);

struct NvmlLibrary;  // the driver's NVML, opened at run time (gpu_info.cpp)

// A GPU's sensors through NVML, for the sweep's monitor: the SM clock now, the power draw,
// the temperature and the clock event reasons. Where NVML is missing, read() is false.
// read() is safe from any thread (NVML's calls are).
class GpuSensors {
 public:
  explicit GpuSensors(int ordinal);
  ~GpuSensors();
  bool read(DeviceReading& out) const;  // power and temperature NaN where NVML lacks them

 private:
  std::unique_ptr<NvmlLibrary> nvml_;
  void* device_ = nullptr;  // nvmlDevice_t
};

}  // namespace llmhpc

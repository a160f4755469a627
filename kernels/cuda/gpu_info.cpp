#include "kernels/cuda/gpu_info.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>

#include "src/core/cuda/check.h"

namespace llmhpc {

// NVML comes with the driver, not the toolkit, so it is opened at run time: a binary built
// here still starts where there is no driver (CI), and a host without NVML just records less.
// The few entry points used, with NVML's stable C ABI (nvml.h): return 0 is NVML_SUCCESS.
struct NvmlLibrary {
  using Device = void*;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, Device*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;               // nvmlDeviceGetClockInfo: the current clock
  int (*power_limit)(Device, unsigned*) = nullptr;              // nvmlDeviceGetEnforcedPowerLimit, milliwatts
  int (*power)(Device, unsigned*) = nullptr;                    // nvmlDeviceGetPowerUsage, milliwatts
  int (*temperature)(Device, int, unsigned*) = nullptr;         // nvmlDeviceGetTemperature, degrees C
  int (*clock_reasons)(Device, unsigned long long*) = nullptr;  // nvmlDeviceGetCurrentClocksEventReasons
  int (*driver_version)(char*, unsigned) = nullptr;             // nvmlSystemGetDriverVersion
  static constexpr int kClockSm = 1;                            // NVML_CLOCK_SM
  static constexpr int kTemperatureGpu = 0;                     // NVML_TEMPERATURE_GPU

  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);

  NvmlLibrary() {
    if (!library) return;
    load(init, "nvmlInit_v2");
    load(shutdown, "nvmlShutdown");
    load(by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    load(clock, "nvmlDeviceGetClockInfo");
    load(power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    load(power, "nvmlDeviceGetPowerUsage");
    load(temperature, "nvmlDeviceGetTemperature");
    load(clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!clock_reasons) load(clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // before R535
    load(driver_version, "nvmlSystemGetDriverVersion");
    if (!init || !shutdown || init() != 0) init = nullptr;
  }
  ~NvmlLibrary() {
    if (init) shutdown();
    if (library) dlclose(library);
  }
  bool usable() const { return init != nullptr; }

  template <class F>
  void load(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
  }
};

namespace {

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

std::string bus_id_of(int ordinal) {
  char bus_id[32] = {0};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal));
  return bus_id;
}

}  // namespace

GpuSensors::GpuSensors(int ordinal) : nvml_(std::make_unique<NvmlLibrary>()) {
  if (!nvml_->usable() || !nvml_->by_pci_bus_id || !nvml_->clock ||
      nvml_->by_pci_bus_id(bus_id_of(ordinal).c_str(), &device_) != 0)
    device_ = nullptr;
}

GpuSensors::~GpuSensors() = default;

bool GpuSensors::read(DeviceReading& out) const {
  if (!device_) return false;
  const NvmlLibrary& n = *nvml_;
  unsigned mhz = 0, milliwatts = 0, celsius = 0;
  unsigned long long reasons = 0;
  if (n.clock(device_, NvmlLibrary::kClockSm, &mhz) != 0) return false;
  out.sm_clock_mhz = mhz;
  out.power_w = n.power && n.power(device_, &milliwatts) == 0 ? milliwatts / 1000.0 : NAN;
  out.temperature_c =
      n.temperature && n.temperature(device_, NvmlLibrary::kTemperatureGpu, &celsius) == 0 ? celsius : NAN;
  out.clock_reasons = n.clock_reasons && n.clock_reasons(device_, &reasons) == 0 ? reasons : 0;
  return true;
}

Attrs gpu_environment(int ordinal) {
  Attrs out;
  int runtime = 0, driver = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  const std::string bus_id = bus_id_of(ordinal);
  int clock_khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal));
  out.emplace_back("cuda_runtime_version", version_text(runtime));
  out.emplace_back("cuda_driver_version", version_text(driver));
  out.emplace_back("gpu_name", std::string(prop.name));
  out.emplace_back("gpu_pci_bus_id", bus_id);
  out.emplace_back("gpu_compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  out.emplace_back("gpu_sm_count", int64_t(prop.multiProcessorCount));
  out.emplace_back("gpu_memory_bytes", int64_t(prop.totalGlobalMem));
  out.emplace_back("gpu_max_sm_clock_mhz", int64_t(clock_khz / 1000));

  NvmlLibrary nvml;
  NvmlLibrary::Device dev = nullptr;
  if (!nvml.usable() || !nvml.by_pci_bus_id || nvml.by_pci_bus_id(bus_id.c_str(), &dev) != 0) {
    out.emplace_back("nvml", std::string("unavailable (no libnvidia-ml.so.1): clocks and power limit not read"));
    return out;
  }
  char driver_text[96] = {0};
  unsigned mhz = 0, milliwatts = 0;
  if (nvml.driver_version && nvml.driver_version(driver_text, sizeof driver_text) == 0)
    out.emplace_back("nvidia_driver_version", std::string(driver_text));
  if (nvml.clock && nvml.clock(dev, NvmlLibrary::kClockSm, &mhz) == 0)
    out.emplace_back("gpu_sm_clock_mhz", int64_t(mhz));
  if (nvml.power_limit && nvml.power_limit(dev, &milliwatts) == 0)
    out.emplace_back("gpu_power_limit_w", double(milliwatts) / 1000.0);
  return out;
}

}  // namespace llmhpc

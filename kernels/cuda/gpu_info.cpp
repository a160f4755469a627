#include "kernels/cuda/gpu_info.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include "src/core/cuda/check.h"

namespace llmhpc {
namespace {

// NVML comes with the driver, not the toolkit, so it is opened at run time: a binary built
// here still starts where there is no driver (CI), and a host without NVML just records less.
// The few entry points used, with NVML's stable C ABI (nvml.h): return 0 is NVML_SUCCESS.
struct Nvml {
  using Device = void*;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, Device*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;    // nvmlDeviceGetClockInfo
  int (*power_limit)(Device, unsigned*) = nullptr;   // nvmlDeviceGetEnforcedPowerLimit, milliwatts
  int (*driver_version)(char*, unsigned) = nullptr;  // nvmlSystemGetDriverVersion
  static constexpr int kClockSm = 1;                 // NVML_CLOCK_SM

  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);

  Nvml() {
    if (!library) return;
    load(init, "nvmlInit_v2");
    load(shutdown, "nvmlShutdown");
    load(by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    load(clock, "nvmlDeviceGetClockInfo");
    load(power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    load(driver_version, "nvmlSystemGetDriverVersion");
    if (!init || !shutdown || init() != 0) init = nullptr;
  }
  ~Nvml() {
    if (init) shutdown();
    if (library) dlclose(library);
  }
  bool usable() const { return init != nullptr; }

  template <class F>
  void load(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
  }
};

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

Attrs gpu_environment(int ordinal) {
  Attrs out;
  int runtime = 0, driver = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  char bus_id[32] = {0};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal));
  int clock_khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal));
  out.emplace_back("cuda_runtime_version", version_text(runtime));
  out.emplace_back("cuda_driver_version", version_text(driver));
  out.emplace_back("gpu_name", std::string(prop.name));
  out.emplace_back("gpu_pci_bus_id", std::string(bus_id));
  out.emplace_back("gpu_compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  out.emplace_back("gpu_sm_count", int64_t(prop.multiProcessorCount));
  out.emplace_back("gpu_memory_bytes", int64_t(prop.totalGlobalMem));
  out.emplace_back("gpu_max_sm_clock_mhz", int64_t(clock_khz / 1000));

  Nvml nvml;
  Nvml::Device dev = nullptr;
  if (!nvml.usable() || !nvml.by_pci_bus_id || nvml.by_pci_bus_id(bus_id, &dev) != 0) {
    out.emplace_back("nvml", std::string("unavailable (no libnvidia-ml.so.1): clocks and power limit not read"));
    return out;
  }
  char driver_text[96] = {0};
  unsigned mhz = 0, milliwatts = 0;
  if (nvml.driver_version && nvml.driver_version(driver_text, sizeof driver_text) == 0)
    out.emplace_back("nvidia_driver_version", std::string(driver_text));
  if (nvml.clock && nvml.clock(dev, Nvml::kClockSm, &mhz) == 0) out.emplace_back("gpu_sm_clock_mhz", int64_t(mhz));
  if (nvml.power_limit && nvml.power_limit(dev, &milliwatts) == 0)
    out.emplace_back("gpu_power_limit_w", double(milliwatts) / 1000.0);
  return out;
}

}  // namespace llmhpc

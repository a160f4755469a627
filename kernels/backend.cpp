#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"
#include "kernels/reduce_passes.h"
#if defined(LLMHPC_WITH_CUDA)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace llmhpc {

Backend make_backend(const BackendOptions& options) {
  if (options.kind == DeviceKind::Cpu) return make_cpu_backend(options);
#if defined(LLMHPC_WITH_CUDA)
  return make_cuda_backend(options);
#else
  throw UsageError("{device} cuda: this llmhpc was built without the CUDA backend (no nvcc at build time)");
#endif
}

std::unique_ptr<Profiler> make_profiler(Backend& backend, bool activities) {
  Device& dev = *backend.device;
  Ops& ops = *backend.ops;
  if (!activities)
    return make_phase_event_profiler(dev, ops, name_fields("{no_cupti}: phases timed with device events"));
  if (dev.kind() == DeviceKind::Cpu) return make_cpu_op_profiler(ops);
#if defined(LLMHPC_WITH_CUDA)
  std::string why_not;
  if (auto cupti = make_cupti_profiler(ops, why_not)) return cupti;
  return make_phase_event_profiler(dev, ops, "no CUPTI (" + why_not + "): phases timed with device events");
#else
  LLMHPC_FATAL("a CUDA device in a build without the CUDA backend");
#endif
}

// A stream is a GPU's: without CUDA there is none, and every pass runs on the host.
void narrow_to_bf16(const float* data, void* wire, size_t count, void* stream) {
#if defined(LLMHPC_WITH_CUDA)
  if (stream) return cuda::narrow_to_bf16(data, wire, count, stream);
#endif
  cpu::narrow_to_bf16(data, wire, count);
}

void widen_from_bf16(const void* wire, float* data, size_t count, void* stream) {
#if defined(LLMHPC_WITH_CUDA)
  if (stream) return cuda::widen_from_bf16(wire, data, count, stream);
#endif
  cpu::widen_from_bf16(wire, data, count);
}

void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale, void* stream) {
#if defined(LLMHPC_WITH_CUDA)
  if (stream) return cuda::sum_parts(out, parts, count, n, dtype, scale, stream);
#endif
  cpu::sum_parts(out, parts, count, n, dtype, scale);
}

bool cuda_compiled() {
#if defined(LLMHPC_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if defined(LLMHPC_WITH_CUDA)
  return cuda_visible_devices();
#else
  return 0;
#endif
}

}  // namespace llmhpc

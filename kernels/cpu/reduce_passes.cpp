// The passes of kernels/reduce_passes.h on host memory: the reference loops, with the host's
// round-to-nearest-even conversion (src/core/dtype.h), as the GPU's.
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "src/core/check.h"

namespace llmhpc::cpu {

void narrow_to_bf16(const float* data, void* wire, size_t count) {
  uint16_t* bits = static_cast<uint16_t*>(wire);
  for (size_t i = 0; i < count; ++i) bits[i] = float_to_bf16_bits(data[i]);
}

void widen_from_bf16(const void* wire, float* data, size_t count) {
  const uint16_t* bits = static_cast<const uint16_t*>(wire);
  for (size_t i = 0; i < count; ++i) data[i] = bf16_bits_to_float(bits[i]);
}

void sum_parts(void* out, const void* parts, size_t count, int n, DType dtype, float scale) {
  LLMHPC_CHECK(dtype == DType::F32 || dtype == DType::BF16,
               std::string("sum_parts: no sum of dtype ") + dtype_name(dtype));
  const bool bf16 = dtype == DType::BF16;
  auto part = [&](size_t i) {
    return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(parts)[i]) : static_cast<const float*>(parts)[i];
  };
  for (size_t i = 0; i < count; ++i) {
    float s = part(i);
    for (int r = 1; r < n; ++r) s += part(size_t(r) * count + i);
    if (bf16) static_cast<uint16_t*>(out)[i] = float_to_bf16_bits(s * scale);
    else static_cast<float*>(out)[i] = s * scale;
  }
}

}  // namespace llmhpc::cpu

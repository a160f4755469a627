// Element types of tensors, the bf16 bit conversions, and the host's one conversion between
// any dtype and double (src/core/dtype.cpp): every host-side reader and writer of typed
// memory (the CPU convert op, random fills, the comm harness's verifiable data) uses it.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace llmhpc {

enum class DType : uint8_t { F32, F64, BF16, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::I32: return "int32";
  }
  return "?";
}

// Round-to-nearest-even float -> bf16, as the hardware conversion does (NaN kept quiet).
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// IEEE half precision (fp16) on the host, round to nearest even as the hardware conversion
// (only the accumulation experiment uses fp16: it is no tensor dtype).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));  // NaN, inf
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                                // 65520 and above round to inf
  if (a < 0x38800000u) {  // below 2^-14: a multiple of 2^-24, rounded to nearest even
    float v;
    std::memcpy(&v, &a, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(v * 16777216.0f)));
  }
  uint32_t h = ((a >> 23) - 112u) << 10 | (a & 0x7fffffu) >> 13;  // exponent rebiased 127 -> 15
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // rounding up may overflow into the exponent
  return uint16_t(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(float(m), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element `i` of typed host memory as a double: exact for every dtype.
double load_as_double(const void* base, size_t i, DType t);
// Stores `v` as element `i`, rounded as the device's conversions round: fp32 to nearest even,
// bf16 through fp32 (float_to_bf16_bits), int32 towards zero (as a C++ cast). An unknown
// dtype is fatal (a bug, never input).
void store_from_double(void* base, size_t i, DType t, double v);
// The same over `n` elements, with the dtype dispatched once (the CPU convert op's speed).
void to_doubles(const void* src, DType t, size_t n, double* out);
void from_doubles(const double* in, size_t n, DType t, void* dst);

}  // namespace llmhpc

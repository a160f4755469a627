// The host's conversion between typed memory and double (src/core/dtype.h), written once:
// one storage type per dtype with its two conversions, and one dispatch over dtypes.
#include "src/core/dtype.h"

#include "src/core/check.h"

namespace llmhpc {
namespace {

struct F32 {
  using T = float;
  static double get(T x) { return x; }
  static T put(double v) { return float(v); }
};
struct F64 {
  using T = double;
  static double get(T x) { return x; }
  static T put(double v) { return v; }
};
struct BF16 {
  using T = uint16_t;  // the bits
  static double get(T x) { return bf16_bits_to_float(x); }
  static T put(double v) { return float_to_bf16_bits(float(v)); }
};
struct I32 {
  using T = int32_t;
  static double get(T x) { return x; }
  static T put(double v) { return int32_t(v); }
};

// Calls f(F32{}), f(F64{}), ... for `t`.
template <class F>
auto with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(F32{});
    case DType::F64: return f(F64{});
    case DType::BF16: return f(BF16{});
    case DType::I32: return f(I32{});
  }
  LLMHPC_FATAL("host dtype conversion: unsupported dtype " + std::to_string(int(t)));
}

}  // namespace

double load_as_double(const void* base, size_t i, DType t) {
  return with_dtype(t, [&](auto kind) {
    using K = decltype(kind);
    return K::get(static_cast<const typename K::T*>(base)[i]);
  });
}

void store_from_double(void* base, size_t i, DType t, double v) {
  with_dtype(t, [&](auto kind) {
    using K = decltype(kind);
    static_cast<typename K::T*>(base)[i] = K::put(v);
  });
}

void to_doubles(const void* src, DType t, size_t n, double* out) {
  with_dtype(t, [&](auto kind) {
    using K = decltype(kind);
    const typename K::T* p = static_cast<const typename K::T*>(src);
    for (size_t i = 0; i < n; ++i) out[i] = K::get(p[i]);
  });
}

void from_doubles(const double* in, size_t n, DType t, void* dst) {
  with_dtype(t, [&](auto kind) {
    using K = decltype(kind);
    typename K::T* p = static_cast<typename K::T*>(dst);
    for (size_t i = 0; i < n; ++i) p[i] = K::put(in[i]);
  });
}

}  // namespace llmhpc

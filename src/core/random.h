// Counter-based random numbers: the value at (seed, stream, index) does not depend on
// the thread, rank or device that draws it, so initialisation and random data orders are
// reproducible everywhere. The normal values are computed bitwise the same on the host and on
// a GPU (Ops::random_normal), so a model initialised on either holds the same weights.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LLMHPC_HOST_DEVICE __host__ __device__
#else
#define LLMHPC_HOST_DEVICE
#endif

namespace llmhpc {

LLMHPC_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

LLMHPC_HOST_DEVICE inline uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// Uniform in (0, 1): never exactly 0, so log() is safe.
LLMHPC_HOST_DEVICE inline double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (double(random_bits(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Arithmetic rounded once per operation on every device: nvcc would fuse a * b + c into one
// FMA (rounded once) where the host compiler does not (the host file that draws normal values
// is compiled with -ffp-contract=off), and the values must be bitwise the same.
namespace exact {
#if defined(__CUDA_ARCH__)
__device__ inline double add(double a, double b) { return __dadd_rn(a, b); }
__device__ inline double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ inline double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ inline double sqrt(double a) { return __dsqrt_rn(a); }
__device__ inline uint64_t bits(double a) { return uint64_t(__double_as_longlong(a)); }
__device__ inline double from_bits(uint64_t b) { return __longlong_as_double((long long)b); }
#else
inline double add(double a, double b) { return a + b; }
inline double mul(double a, double b) { return a * b; }
inline double div(double a, double b) { return a / b; }
inline double sqrt(double a) { return __builtin_sqrt(a); }  // correctly rounded (IEEE 754)
inline uint64_t bits(double a) {
  uint64_t b;
  std::memcpy(&b, &a, sizeof b);
  return b;
}
inline double from_bits(uint64_t b) {
  double a;
  std::memcpy(&a, &b, sizeof a);
  return a;
}
#endif

// Natural log of a positive normal double from the operations above alone (libm's log differs
// between the host and CUDA in the last bit): x = m 2^e with m in [sqrt(1/2), sqrt(2)), and
// log m = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.172, by its series to f^23 (terms
// below 1e-17 of the sum). Within a few units in the last place; the same on every device.
LLMHPC_HOST_DEVICE inline double log(double x) {
  const uint64_t b = bits(x);
  int e = int((b >> 52) & 0x7ff) - 1023;
  double m = from_bits((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = mul(m, 0.5);
    e += 1;
  }
  const double f = div(add(m, -1.0), add(m, 1.0)), f2 = mul(f, f);
  double p = 1.0 / 23;
  for (int k = 21; k >= 3; k -= 2) p = add(mul(p, f2), div(1.0, double(k)));
  const double two_f = mul(2.0, f);
  return add(mul(double(e), 0.6931471805599453), add(two_f, mul(mul(two_f, f2), p)));
}
}  // namespace exact

// Standard normal truncated to [-bound, bound] (a bound of infinity: not truncated), by
// Marsaglia's polar method from the uniform pair of each attempt, rejecting points outside the
// unit disc and values beyond the bound; 64 attempts per element before streams overlap (the
// chance that all fail is below 1e-40; the value is then 0).
LLMHPC_HOST_DEVICE inline double random_normal(uint64_t seed, uint64_t stream, uint64_t index, double bound) {
  for (uint64_t attempt = 0; attempt < 64; ++attempt) {
    const uint64_t i = index * 64 + attempt;
    const double u = exact::add(exact::mul(2.0, random_uniform(seed, stream, 2 * i)), -1.0);
    const double v = exact::add(exact::mul(2.0, random_uniform(seed, stream, 2 * i + 1)), -1.0);
    const double s = exact::add(exact::mul(u, u), exact::mul(v, v));
    if (!(s > 0.0 && s < 1.0)) continue;
    const double z = exact::mul(u, exact::sqrt(exact::div(exact::mul(-2.0, exact::log(s)), s)));
    if (z <= bound && -z <= bound) return z;
  }
  return 0.0;
}

}  // namespace llmhpc

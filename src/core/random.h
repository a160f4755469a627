// Counter-based random numbers: the value at (seed, stream, index) does not depend on
// the thread, rank or device that draws it, so initialisation and random data orders are
// reproducible everywhere.
#pragma once
#include <cmath>
#include <cstdint>

namespace llmhpc {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// Uniform in (0, 1): never exactly 0, so log() is safe.
inline double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (double(random_bits(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal truncated to [-bound, bound] (rejection, Box-Muller per attempt).
inline double random_truncated_normal(uint64_t seed, uint64_t stream, uint64_t index, double bound) {
  const double two_pi = 6.283185307179586;
  for (uint64_t attempt = 0;; ++attempt) {
    uint64_t i = index * 64 + attempt;  // 64 attempts per element before streams overlap
    double u1 = random_uniform(seed, stream, 2 * i), u2 = random_uniform(seed, stream, 2 * i + 1);
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
    if (std::fabs(z) <= bound || attempt == 63) return std::fabs(z) <= bound ? z : 0.0;
  }
}

}  // namespace llmhpc

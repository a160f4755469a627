// Helpers for tests on the CPU backend: host tensors in fp32 or fp64, random fills, and
// a central finite-difference gradient of a scalar function.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace llmhpc::test {

inline Backend cpu_backend() { return make_cpu_backend(BackendOptions{}); }

// A CPU tensor (CPU device memory is host memory, so tests read and write it directly).
class HostTensor {
 public:
  HostTensor(Device& dev, DType t, Shape s, const std::string& tag = "test") : buf_(dev.allocator(), t, s, tag) {
    std::memset(buf_.tensor().data, 0, buf_.tensor().bytes());
  }
  Tensor t() const { return buf_.tensor(); }
  operator Tensor() const { return buf_.tensor(); }
  int64_t size() const { return buf_.tensor().numel(); }
  // Element i as a double; set() stores v rounded to the tensor's dtype (src/core/dtype.h).
  double get(int64_t i) const { return load_as_double(buf_.tensor().data, size_t(i), buf_.tensor().dtype); }
  void set(int64_t i, double v) { store_from_double(buf_.tensor().data, size_t(i), buf_.tensor().dtype, v); }
  std::vector<double> values() const {
    std::vector<double> v(size());
    for (int64_t i = 0; i < size(); ++i) v[i] = get(i);
    return v;
  }
  void fill_normal(std::mt19937_64& rng, double std = 1.0) {
    std::normal_distribution<double> n(0.0, std);
    for (int64_t i = 0; i < size(); ++i) set(i, n(rng));
  }
  void copy_from(const HostTensor& o) {
    for (int64_t i = 0; i < size(); ++i) set(i, o.get(i));
  }

 private:
  Buffer buf_;
};

// Max |a-b| / max(max|b|, tiny): one number for "how far apart", scale-aware.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

// Central differences of `loss` with respect to every element of `x`.
inline std::vector<double> finite_difference(HostTensor& x, const std::function<double()>& loss, double eps = 1e-6) {
  std::vector<double> g(x.size());
  for (int64_t i = 0; i < x.size(); ++i) {
    const double orig = x.get(i);
    x.set(i, orig + eps);
    const double up = loss();
    x.set(i, orig - eps);
    const double down = loss();
    x.set(i, orig);
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

inline double dot(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.size(); ++i) s += a.get(i) * b.get(i);
  return s;
}

}  // namespace llmhpc::test

// Helpers for tests that run an op on the GPU and on the CPU reference: tensors that hold
// the same values on both backends ("twins": fp64 on the CPU, the dtype under test on the
// GPU), poisoned outputs, and the error measure. Every fixture skips without a GPU.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace llmhpc::test {

// Unit roundoff of bf16 (8 significant bits): rounding moves a value by at most this
// fraction of itself. Error bounds of bf16 tests are multiples of it.
constexpr double kBf16Unit = 1.0 / 256;

// Bound for a bf16 result that went through `roundings` bf16 roundings along its path and
// sums `reduction` terms that were each rounded to bf16 (rounding errors add up like a
// random walk: sqrt(reduction) units, relative to the largest output).
inline double bf16_bound(double roundings, int64_t reduction = 0) {
  return kBf16Unit * (roundings + std::sqrt(double(reduction)));
}

// The raw bytes of a device tensor (for bitwise comparisons).
inline std::vector<char> read_bytes(Device& dev, const Tensor& t) {
  std::vector<char> raw(t.bytes());
  dev.copy_to_host(raw.data(), t.data, t.bytes());
  return raw;
}

inline std::vector<double> read_tensor(Device& dev, const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<char> raw(t.bytes());
  dev.copy_to_host(raw.data(), t.data, t.bytes());
  std::vector<double> v(n);
  to_doubles(raw.data(), t.dtype, size_t(n), v.data());
  return v;
}

inline void write_tensor(Device& dev, const Tensor& t, const std::vector<double>& v) {
  std::vector<char> raw(t.bytes());
  from_doubles(v.data(), size_t(t.numel()), t.dtype, raw.data());
  dev.copy_to_device(t.data, raw.data(), raw.size());
}

// max |a - b| / max |b|, or NaN when `a` holds a non-finite value (an unwritten, poisoned
// element), so that EXPECT_LE on the result fails.
inline double max_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-300;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return NAN;
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

// ||a - b|| / ||b|| (NaN for a non-finite value in a).
inline double l2_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 1e-300;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return NAN;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

inline Backend make_gpu_backend(size_t memory_limit = 0) {
  BackendOptions o;
  o.kind = DeviceKind::Cuda;
  o.memory_limit = memory_limit;
  return make_backend(o);
}

// Fixture: a CPU backend (the fp64 reference) and a GPU backend, fresh random inputs
// from a seed that failure messages print.
class CudaVsCpu : public ::testing::Test {
 protected:
  struct Twin {
    Tensor cpu;  // fp64 (int32 for token ids)
    Tensor gpu;  // the dtype under test
  };

  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
    cpu_ = make_cpu_backend(BackendOptions{});
    gpu_ = make_gpu_backend();
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override { buffers_.clear(); }

  Device& gpu_dev() { return *gpu_.device; }
  Ops& gpu() { return *gpu_.ops; }
  Ops& cpu() { return *cpu_.ops; }
  std::string seed_note() const { return "random seed " + std::to_string(seed_); }

  // The same values on both sides; the GPU side in `dtype` (values should be exactly
  // representable in it: random() rounds them first).
  // `cpu_dtype` is fp64 (the reference) unless a test compares against fp32 CPU arithmetic.
  Twin twin(Shape s, DType dtype, const std::vector<double>& values, DType cpu_dtype = DType::F64) {
    const DType ref = dtype == DType::I32 ? DType::I32 : cpu_dtype;
    buffers_.emplace_back(cpu_.device->allocator(), ref, s, "test.cpu");
    Tensor c = buffers_.back().tensor();
    buffers_.emplace_back(gpu_.device->allocator(), dtype, s, "test.gpu");
    Tensor g = buffers_.back().tensor();
    write_tensor(*cpu_.device, c, values);
    write_tensor(*gpu_.device, g, values);
    return {c, g};
  }

  // Normal(0, std) values, rounded to what the GPU dtype holds.
  Twin random(Shape s, DType dtype, double std = 1.0, DType cpu_dtype = DType::F64) {
    return twin(s, dtype, random_values(s.numel(), dtype, std), cpu_dtype);
  }
  std::vector<double> random_values(int64_t n, DType dtype, double std = 1.0) {
    std::normal_distribution<double> normal(0.0, std);
    std::vector<double> v(n);
    for (double& x : v) x = dtype == DType::BF16 ? round_to_bf16(float(normal(rng_))) : double(float(normal(rng_)));
    return v;
  }

  // Token ids in [0, vocab).
  Twin tokens(Shape s, int64_t vocab) {
    std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
    std::vector<double> v(s.numel());
    for (double& x : v) x = double(pick(rng_));
    return twin(s, DType::I32, v);
  }

  // An output the op must overwrite: NaN on the GPU (all bits set), so an element the
  // kernel skips fails the comparison; zeros on the CPU.
  Twin poisoned(Shape s, DType dtype, DType cpu_dtype = DType::F64) {
    Twin t = twin(s, dtype, std::vector<double>(s.numel(), 0.0), cpu_dtype);
    std::vector<unsigned char> nan_bytes(t.gpu.bytes(), 0xff);
    gpu_.device->copy_to_device(t.gpu.data, nan_bytes.data(), nan_bytes.size());
    return t;
  }

  double error(const Twin& t) { return max_rel_error(gpu_values(t), cpu_values(t)); }
  std::vector<double> gpu_values(const Twin& t) { return read_tensor(*gpu_.device, t.gpu); }
  std::vector<double> cpu_values(const Twin& t) { return read_tensor(*cpu_.device, t.cpu); }

  Backend cpu_, gpu_;
  std::deque<Buffer> buffers_;  // declared after the backends: freed before them
  unsigned seed_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace llmhpc::test

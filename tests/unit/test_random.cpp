// The counter-based generator (src/core/random.h) and the CPU backend's Ops::random_normal:
// the portable log against libm's, the normal values' distribution, truncation and
// independence from the thread count. That the CUDA kernel's values are these, bitwise, is
// tests/cuda/test_cuda_ops.cpp's RandomNormalIsTheCpusBitwise.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "src/core/random.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc {
namespace {

TEST(Random, PortableLogIsLibmsToAFewUnitsInTheLastPlace) {
  for (double x : {1e-300, 1e-17, 2.5e-9, 0.1, 0.5, 0.70710678118654746, 0.70710678118654757, 0.999999999, 1.0,
                   1.0000001, 1.4142135623730949, 1.4142135623730951, 1.5, 2.0, 3.0, 1e10, 1e300}) {
    const double want = std::log(x);
    EXPECT_NEAR(exact::log(x), want, 4 * std::numeric_limits<double>::epsilon() * std::max(1.0, std::fabs(want)))
        << "log(" << x << ")";
  }
  for (uint64_t i = 0; i < 100000; ++i) {  // what the polar method takes logs of: (0, 1)
    const double x = random_uniform(3, 4, i), want = std::log(x);
    ASSERT_NEAR(exact::log(x), want, 4 * std::numeric_limits<double>::epsilon() * std::max(1.0, std::fabs(want)))
        << "log(" << x << ")";
  }
}

struct Moments {
  double mean = 0, std = 0, max_abs = 0;
};

Moments moments(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  Moments m;
  for (float x : v) {
    sum += x;
    sq += double(x) * x;
    m.max_abs = std::max(m.max_abs, std::fabs(double(x)));
  }
  m.mean = sum / double(v.size());
  m.std = std::sqrt(sq / double(v.size()) - m.mean * m.mean);
  return m;
}

std::vector<float> draw(Ops& ops, int64_t n, uint64_t seed, uint64_t stream, double std, double bound) {
  std::vector<float> v(size_t(n), std::nanf(""));
  ops.random_normal(Tensor(v.data(), DType::F32, {n}), seed, stream, std, bound);
  return v;
}

TEST(Random, NormalValuesHaveTheirDistributionAndTruncation) {
  Backend be = test::cpu_backend();
  const int64_t n = 400000;
  const Moments plain = moments(draw(*be.ops, n, 1, 2, 2.0, std::numeric_limits<double>::infinity()));
  EXPECT_NEAR(plain.mean, 0.0, 5 * 2.0 / std::sqrt(double(n)));
  EXPECT_NEAR(plain.std, 2.0, 0.01);
  EXPECT_GT(plain.max_abs, 3 * 2.0) << "400000 normal values, none beyond 3 sigma";
  const Moments cut = moments(draw(*be.ops, n, 1, 2, 2.0, 3.0));
  EXPECT_LE(cut.max_abs, 3 * 2.0 * (1 + 1e-6));
  EXPECT_NEAR(cut.std, 0.9866 * 2.0, 0.01) << "a normal truncated at 3 sigma has std 0.9866 sigma";
  EXPECT_NEAR(cut.mean, 0.0, 5 * 2.0 / std::sqrt(double(n)));
}

TEST(Random, ValuesDependOnSeedStreamAndIndexOnlyNotOnThreads) {
  Backend be = test::cpu_backend();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = draw(*be.ops, 10001, 9, 3, 1.0, 3.0);
  omp_set_num_threads(4);
  const std::vector<float> four = draw(*be.ops, 10001, 9, 3, 1.0, 3.0);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, four);
  const std::vector<float> prefix = draw(*be.ops, 100, 9, 3, 1.0, 3.0);
  EXPECT_EQ(prefix, std::vector<float>(one.begin(), one.begin() + 100)) << "element i is the same at any length";
  EXPECT_NE(draw(*be.ops, 100, 9, 4, 1.0, 3.0), prefix) << "another stream";
  EXPECT_NE(draw(*be.ops, 100, 8, 3, 1.0, 3.0), prefix) << "another seed";
}

}  // namespace
}  // namespace llmhpc

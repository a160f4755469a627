// The host's one conversion between dtypes and double (src/core/dtype.h): exact round trips,
// bf16 rounding to nearest with ties to even, int32 towards zero, the bulk forms equal to
// the per-element ones, and an unknown dtype fatal with a message that names it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/core/dtype.h"

namespace llmhpc {
namespace {

const DType kAll[] = {DType::F32, DType::F64, DType::BF16, DType::I32};

// Stores and loads one element.
double round_trip(DType t, double v) {
  std::vector<char> image(dtype_size(t));
  store_from_double(image.data(), 0, t, v);
  return load_as_double(image.data(), 0, t);
}

TEST(HostConvert, SmallIntegersRoundTripInEveryDtype) {
  for (DType t : kAll)
    for (double v : {0.0, 1.0, -1.0, 127.0, -128.0, 255.0, -1024.0}) EXPECT_EQ(round_trip(t, v), v) << dtype_name(t);
}

TEST(HostConvert, EachDtypeKeepsWhatItCanHold) {
  EXPECT_EQ(round_trip(DType::F64, 0.1), 0.1);
  EXPECT_EQ(round_trip(DType::F32, 0.1), double(0.1f));
  EXPECT_EQ(round_trip(DType::BF16, 0.1), double(round_to_bf16(0.1f)));
  EXPECT_EQ(round_trip(DType::F32, 1.0 + std::ldexp(1.0, -23)), 1.0 + std::ldexp(1.0, -23));
  EXPECT_EQ(round_trip(DType::I32, 2147483647.0), 2147483647.0);
  EXPECT_EQ(round_trip(DType::I32, 3.9), 3.0) << "int32 truncates towards zero, as a C++ cast";
  EXPECT_EQ(round_trip(DType::I32, -3.9), -3.0);
}

TEST(HostConvert, Bf16RoundsToNearestTiesToEven) {
  const double ulp = std::ldexp(1.0, -7);  // of bf16 at 1
  EXPECT_EQ(round_trip(DType::BF16, 1.0 + ulp / 2), 1.0) << "a tie goes to the even neighbour, 1";
  EXPECT_EQ(round_trip(DType::BF16, 1.0 + 3 * ulp / 2), 1.0 + 2 * ulp) << "a tie goes to the even neighbour, 1 + 2 ulp";
  EXPECT_EQ(round_trip(DType::BF16, 1.0 + ulp / 2 + ulp / 8), 1.0 + ulp) << "above the tie: up";
  EXPECT_EQ(round_trip(DType::BF16, 1.0 + ulp / 2 - ulp / 8), 1.0) << "below the tie: down";
  EXPECT_EQ(round_trip(DType::BF16, -(1.0 + ulp / 2)), -1.0);
  EXPECT_TRUE(std::isnan(round_trip(DType::BF16, std::nan(""))));
  EXPECT_TRUE(std::isinf(round_trip(DType::BF16, 1e39))) << "beyond bf16's range (via fp32: inf)";
}

TEST(HostConvert, BulkFormsAreTheElementForms) {
  std::vector<double> values;
  for (int i = -50; i < 50; ++i) values.push_back(i * 0.37 + 1.0 / 3.0);
  for (DType t : kAll) {
    std::vector<char> bulk(values.size() * dtype_size(t)), each(bulk.size());
    from_doubles(values.data(), values.size(), t, bulk.data());
    for (size_t i = 0; i < values.size(); ++i) store_from_double(each.data(), i, t, values[i]);
    EXPECT_EQ(bulk, each) << dtype_name(t);
    std::vector<double> back(values.size());
    to_doubles(bulk.data(), t, back.size(), back.data());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(back[i], load_as_double(bulk.data(), i, t)) << dtype_name(t);
  }
}

TEST(HostConvertDeathTest, AnUnknownDtypeIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh: MPI is initialised once per process
  double x = 0;
  EXPECT_DEATH(load_as_double(&x, 0, DType(99)), "unsupported dtype 99");
  EXPECT_DEATH(store_from_double(&x, 0, DType(99), 1.0), "unsupported dtype 99");
}

}  // namespace
}  // namespace llmhpc

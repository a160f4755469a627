// Sizes with units and lists, as users write them on the command line.
#include <gtest/gtest.h>

#include "src/core/check.h"
#include "src/core/units.h"

namespace llmhpc {
namespace {

TEST(Units, SizesInDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_size("1MB", "size"), 1000000u);
  EXPECT_EQ(parse_size("1000MB", "size"), 1000000000u);
  EXPECT_EQ(parse_size("10mb", "size"), 10000000u);
  EXPECT_EQ(parse_size("1MiB", "size"), 1048576u);
  EXPECT_EQ(parse_size("2GiB", "size"), 2147483648u);
  EXPECT_EQ(parse_size("1.5KB", "size"), 1500u);
  EXPECT_EQ(parse_size("512", "size"), 512u);
  EXPECT_EQ(parse_size("64 B", "size"), 64u);
  EXPECT_EQ(parse_size("1G", "size"), 1000000000u);
}

TEST(Units, BadSizesNameTheOptionAndTheText) {
  for (const char* bad : {"12XB", "MB", "", "1..5MB", "-5MB", "0.5B", "1e3MB"}) {
    try {
      parse_size(bad, "size");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("size '"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, FormatSizeRoundTrips) {
  for (const char* s : {"1MB", "10MB", "100MB", "1GB", "1MiB", "4KiB", "7B"})
    EXPECT_EQ(format_size(parse_size(s, "size")), s);
}

TEST(Units, DurationsForPeople) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(-3), "0s");
  EXPECT_EQ(format_duration(41.6), "42s");
  EXPECT_EQ(format_duration(725), "12m05s");
  EXPECT_EQ(format_duration(10980), "3h03m");
  EXPECT_EQ(format_duration(190000), "2d04h46m");
}

TEST(Units, CountsForPeople) {
  EXPECT_EQ(counted(1, "rank"), "1 rank");
  EXPECT_EQ(counted(2, "data-parallel rank"), "2 data-parallel ranks");
  EXPECT_EQ(counted(0, "rank"), "0 ranks");
}

TEST(Units, Lists) {
  EXPECT_EQ(split_list("small, medium,large", "model"), (std::vector<std::string>{"small", "medium", "large"}));
  EXPECT_EQ(parse_int_list("128,256", "context-length"), (std::vector<int64_t>{128, 256}));
  EXPECT_THROW(split_list("a,,b", "model"), UsageError);
  EXPECT_THROW(split_list("16,32,16", "context-length"), UsageError);
  EXPECT_THROW(parse_int_list("128,abc", "context-length"), UsageError);
  try {  // written differently, the same value: a sweep would run it twice under one label
    parse_int_list("16,32,016", "context-length");
    ADD_FAILURE() << "16 and 016 are the same context length";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'16' and '016' are the same value"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_int("12.5", "steps"), UsageError);
  EXPECT_THROW(require_choice("ring", {"nccl", "mpi"}, "backend"), UsageError);
}

}  // namespace
}  // namespace llmhpc

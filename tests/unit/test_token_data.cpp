// Token files (.bin uint16, .npy uint16/int32) and the batch order of src/io/token_data.h.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>

#include "src/core/check.h"
#include "src/io/token_data.h"

namespace llmhpc {
namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/llmhpc_" + std::to_string(getpid()) + "_" + name;
}

std::string write_bin(const std::string& name, const std::vector<uint16_t>& tokens) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return path;
}

// A .npy v1.0 file as numpy writes it.
std::string write_npy(const std::string& name, const std::string& descr, const void* data, size_t count, size_t elem) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(count) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(static_cast<const char*>(data), count * elem);
  return path;
}

std::vector<uint16_t> iota_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = uint16_t(i % 1000);
  return t;
}

TEST(TokenData, ReadsBinAndNpyAlike) {
  const std::vector<uint16_t> t = iota_tokens(500);
  std::vector<int32_t> t32(t.begin(), t.end());
  TokenData bin = TokenData::open(write_bin("a.bin", t));
  TokenData npy16 = TokenData::open(write_npy("a16.npy", "<u2", t.data(), t.size(), 2));
  TokenData npy32 = TokenData::open(write_npy("a32.npy", "<i4", t32.data(), t32.size(), 4));
  ASSERT_EQ(bin.size(), 500);
  ASSERT_EQ(npy16.size(), 500);
  ASSERT_EQ(npy32.size(), 500);
  for (int64_t i = 0; i < 500; ++i) {
    EXPECT_EQ(bin.token(i), t[i]);
    EXPECT_EQ(npy16.token(i), t[i]);
    EXPECT_EQ(npy32.token(i), t[i]);
  }
}

TEST(TokenData, SequentialOrderFollowsTheSpecFormula) {
  const int64_t N = 1000, B = 4, T = 16;
  TokenData d = TokenData::open(write_bin("seq.bin", iota_tokens(N)));
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t s = 0; s < 20; ++s) {
    d.fill_batch(s, B, T, 0, B, DataOrder::Sequential, 0, in.data(), tg.data());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = ((s * B + b) * T) % (N - T);
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(in[b * T + t], d.token(o + t));
        ASSERT_EQ(tg[b * T + t], d.token(o + t + 1));
      }
    }
  }
}

TEST(TokenData, RanksTakeTheirSliceOfTheSameGlobalBatch) {
  TokenData d = TokenData::open(write_bin("ranks.bin", iota_tokens(5000)));
  const int64_t B = 6, T = 8;
  for (DataOrder order : {DataOrder::Sequential, DataOrder::Random}) {
    std::vector<int32_t> all_in(B * T), all_tg(B * T);
    d.fill_batch(3, B, T, 0, B, order, 7, all_in.data(), all_tg.data());
    for (int n : {2, 3}) {
      for (int r = 0; r < n; ++r) {
        const int64_t first = r * B / n, count = (r + 1) * B / n - first;
        std::vector<int32_t> in(count * T), tg(count * T);
        d.fill_batch(3, B, T, first, count, order, 7, in.data(), tg.data());
        EXPECT_TRUE(std::equal(in.begin(), in.end(), all_in.begin() + first * T));
      }
    }
  }
}

TEST(TokenData, RandomOrderIsSeededAndInRange) {
  const int64_t N = 3000, T = 32;
  TokenData d = TokenData::open(write_bin("rand.bin", iota_tokens(N)));
  std::set<int64_t> offsets;
  for (int64_t s = 0; s < 50; ++s) {
    const int64_t o = d.offset(s, 0, 4, T, DataOrder::Random, 11);
    EXPECT_EQ(o, d.offset(s, 0, 4, T, DataOrder::Random, 11));
    EXPECT_GE(o, 0);
    EXPECT_LT(o, N - T);
    offsets.insert(o);
  }
  EXPECT_GT(offsets.size(), 40u);  // not stuck
  EXPECT_NE(d.offset(0, 0, 4, T, DataOrder::Random, 11), d.offset(0, 0, 4, T, DataOrder::Random, 12));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenData, BadFilesAreRefusedWithAReason) {
  EXPECT_NE(error_of([] { TokenData::open(temp_path("nope.bin")); }).find("cannot open"), std::string::npos);
  std::vector<uint16_t> t = iota_tokens(100);
  t[57] = 12000;
  TokenData d = TokenData::open(write_bin("big.bin", t));
  const std::string err = error_of([&] { d.validate(10000, 8); });
  EXPECT_NE(err.find("12000"), std::string::npos) << err;
  EXPECT_NE(err.find("position 57"), std::string::npos) << err;
  EXPECT_NE(error_of([&] { d.validate(20000, 200); }).find("needs at least"), std::string::npos);
  // 100 tokens: exactly one window of 99 inputs and their targets, and no more.
  EXPECT_EQ(error_of([&] { d.validate(20000, 99); }).find("needs at least"), std::string::npos);
  EXPECT_NE(error_of([&] { d.validate(20000, 100); }).find("needs at least 101"), std::string::npos);
  std::vector<int32_t> in(99), tg(99);
  for (DataOrder order : {DataOrder::Sequential, DataOrder::Random}) {
    d.fill_batch(5, 2, 99, 1, 1, order, 3, in.data(), tg.data());  // any step and sequence: the one window
    EXPECT_EQ(in[0], 0);
    EXPECT_EQ(tg[98], 99);
  }
  const float f[4] = {1, 2, 3, 4};
  EXPECT_NE(error_of([&] { TokenData::open(write_npy("f.npy", "<f4", f, 4, 4)); }).find("dtype"), std::string::npos);
  std::ofstream(temp_path("odd.bin"), std::ios::binary) << "abc";
  EXPECT_NE(error_of([&] { TokenData::open(temp_path("odd.bin")); }).find("odd"), std::string::npos);
  int32_t neg[3] = {1, -4, 2};
  TokenData n = TokenData::open(write_npy("neg.npy", "<i4", neg, 3, 4));
  EXPECT_NE(error_of([&] { n.validate(10, 1); }).find("-4"), std::string::npos);
}

}  // namespace
}  // namespace llmhpc

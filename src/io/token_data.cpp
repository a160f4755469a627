#include "src/io/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <regex>

#include "src/core/check.h"
#include "src/core/random.h"
#include "src/core/units.h"

namespace llmhpc {

DataOrder parse_data_order(const std::string& text) {
  require_choice(text, {"sequential", "random"}, "data-order");
  return text == "random" ? DataOrder::Random : DataOrder::Sequential;
}

struct TokenData::Mapping {
  void* addr = MAP_FAILED;
  size_t length = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) munmap(addr, length);
  }
};

namespace {

// Parses a .npy header; returns the byte offset of the data, sets element size and count.
size_t parse_npy(const std::string& path, const unsigned char* p, size_t len, int* elem, int64_t* count) {
  auto bad = [&](const std::string& why) {
    return UsageError("{data} '" + path + "': " + why + " (expected a 1-D .npy of uint16 or int32)");
  };
  if (len < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) throw bad("not a .npy file");
  const int major = p[6];
  size_t header_len, start;
  if (major == 1) {
    header_len = p[8] | (p[9] << 8);
    start = 10;
  } else {
    if (len < 12) throw bad("truncated header");
    header_len = p[8] | (p[9] << 8) | (size_t(p[10]) << 16) | (size_t(p[11]) << 24);
    start = 12;
  }
  if (start + header_len > len) throw bad("truncated header");
  const std::string header(reinterpret_cast<const char*>(p + start), header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([<|>=]?)([a-z])([0-9]+)'"))) throw bad("no dtype");
  const std::string kind = m[2].str() + m[3].str();
  if (m[1].str() == ">") throw bad("big-endian data");
  if (kind == "u2") *elem = 2;
  else if (kind == "i4") *elem = 4;
  else throw bad("dtype '" + m[1].str() + kind + "'");
  if (std::regex_search(header, m, std::regex("'fortran_order':\\s*True"))) throw bad("Fortran order");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\((\\d+),?\\s*\\)"))) throw bad("shape is not 1-D");
  *count = std::stoll(m[1].str());
  const size_t data_start = start + header_len;
  if (data_start + size_t(*count) * *elem > len) throw bad("file shorter than its shape says");
  return data_start;
}

}  // namespace

TokenData TokenData::open(const std::string& path) {
  TokenData d;
  d.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UsageError("{data} '" + path + "': cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  fstat(fd, &st);
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw UsageError("{data} '" + path + "' is a directory, not a token file");
  }
  auto map = std::make_shared<Mapping>();
  map->length = size_t(st.st_size);
  if (map->length == 0) {
    ::close(fd);
    throw UsageError("{data} '" + path + "' is empty");
  }
  map->addr = mmap(nullptr, map->length, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->addr == MAP_FAILED) throw UsageError("{data} '" + path + "': cannot map the file");
  const auto* bytes = static_cast<const unsigned char*>(map->addr);
  const bool is_npy = path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  if (is_npy) {
    d.data_ = bytes + parse_npy(path, bytes, map->length, &d.element_size_, &d.count_);
  } else {
    // HDF5's signature: a checkpoint or a rank file given as --data would read as tokens.
    if (map->length >= 8 && std::memcmp(bytes, "\x89HDF\r\n\x1a\n", 8) == 0)
      throw UsageError("{data} '" + path + "' is an HDF5 file (a checkpoint or a rank file?), not tokens: give a " +
                       ".bin of uint16 tokens or a 1-D .npy (a checkpoint goes to --init)");
    if (map->length % 2 != 0)
      throw UsageError("{data} '" + path + "': a .bin file holds uint16 tokens, but its size is odd");
    d.data_ = bytes;
    d.element_size_ = 2;
    d.count_ = int64_t(map->length / 2);
  }
  d.map_ = map;
  return d;
}

int64_t TokenData::token(int64_t i) const {
  if (element_size_ == 2) {
    uint16_t v;
    std::memcpy(&v, data_ + 2 * i, 2);
    return v;
  }
  int32_t v;
  std::memcpy(&v, data_ + 4 * i, 4);
  return v;
}

void TokenData::validate(int64_t vocab_size, int64_t seq) const {
  if (count_ < seq + 1)  // one window: `seq` inputs, the last target one further (offset() < count_ - seq)
    throw UsageError("{data} '" + path_ + "' holds " + std::to_string(count_) + " tokens; a sequence of " +
                     std::to_string(seq) + " plus its targets needs at least " + std::to_string(seq + 1));
  int64_t lo = 0, hi = 0;
#pragma omp parallel for reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < count_; ++i) {
    int64_t t = token(i);
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  if (lo >= 0 && hi < vocab_size) return;
  for (int64_t i = 0; i < count_; ++i) {
    int64_t t = token(i);
    if (t < 0 || t >= vocab_size)
      throw UsageError("{data} '" + path_ + "': token id " + std::to_string(t) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(vocab_size) + ") (check {vocab_size})");
  }
}

int64_t TokenData::offset(int64_t step, int64_t b, int64_t global_batch, int64_t seq, DataOrder order,
                          uint64_t seed) const {
  const uint64_t span = uint64_t(count_ - seq);
  const uint64_t index = uint64_t(step) * uint64_t(global_batch) + uint64_t(b);
  if (order == DataOrder::Sequential) return int64_t((index * uint64_t(seq)) % span);
  return int64_t(random_bits(seed, 0x64617461 /* "data" */, index) % span);
}

void TokenData::fill_batch(int64_t step, int64_t global_batch, int64_t seq, int64_t first, int64_t count,
                           DataOrder order, uint64_t seed, int32_t* inputs, int32_t* targets) const {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t o = offset(step, first + i, global_batch, seq, order, seed);
    for (int64_t t = 0; t < seq; ++t) {
      inputs[i * seq + t] = int32_t(token(o + t));
      targets[i * seq + t] = int32_t(token(o + t + 1));
    }
  }
}

}  // namespace llmhpc

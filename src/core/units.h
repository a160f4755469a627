// Parsing of user-written values: sizes with units and comma-separated lists; JSON strings.
// All of these throw UsageError with a message that names the option and the bad text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/check.h"

namespace llmhpc {

// "100MB" -> 100000000, "1GiB" -> 1073741824, "512" -> 512 bytes.
// Units: B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024);
// K/M/G/T alone mean KB/MB/GB/TB. Case-insensitive except that "KiB"-style needs the 'i'.
uint64_t parse_size(const std::string& text, const std::string& option);

// The same value written back the way people write it: 1000000 -> "1MB", 1048576 -> "1MiB".
std::string format_size(uint64_t bytes);

// A count for people: counted(1, "rank") -> "1 rank", counted(2, "rank") -> "2 ranks".
std::string counted(int64_t n, const std::string& noun);

// A duration for people, to the second below an hour and to the minute above: 42 -> "42s",
// 725 -> "12m05s", 10980 -> "3h03m", 190000 -> "2d04h46m".
std::string format_duration(double seconds);

// "small, medium" -> {"small", "medium"}. Empty or repeated items are an error.
std::vector<std::string> split_list(const std::string& text, const std::string& option);

// Throws UsageError when two items of list option `option` mean the same value ("1" and "1.0",
// "auto" and what it stands for): a sweep would run that configuration twice under one label.
template <class T>
void require_distinct(const std::vector<T>& values, const std::vector<std::string>& items, const std::string& option) {
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (values[i] == values[j])
        throw UsageError(field(option) + ": '" + items[j] + "' and '" + items[i] + "' are the same value");
}

// Each item parsed as an integer, no two the same.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option);
int64_t parse_int(const std::string& text, const std::string& option);
double parse_double(const std::string& text, const std::string& option);

// Checks that `value` is one of `choices`; the error lists them.
void require_choice(const std::string& value, const std::vector<std::string>& choices, const std::string& option);

std::string join(const std::vector<std::string>& items, const std::string& sep);
// Appends `value` unless empty or already in `list` (lists of names, each once, in first-seen order).
void append_once(std::vector<std::string>& list, const std::string& value);

// `text` as the inside of a JSON string: quotes, backslashes and control characters escaped.
std::string json_escape(std::string_view text);

}  // namespace llmhpc

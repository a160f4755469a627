#include "src/core/units.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "src/core/check.h"

namespace llmhpc {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

uint64_t parse_size(const std::string& raw, const std::string& option) {
  const std::string text = trim(raw);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i), unit = lower(trim(text.substr(i)));
  auto bad = [&](const std::string& why) {
    return UsageError(field(option) + " '" + raw + "': " + why +
                      " (write a number with an optional unit: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  };
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1) throw bad("not a size");
  double value = std::strtod(number.c_str(), nullptr);
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb") scale = 1e3;
  else if (unit == "m" || unit == "mb") scale = 1e6;
  else if (unit == "g" || unit == "gb") scale = 1e9;
  else if (unit == "t" || unit == "tb") scale = 1e12;
  else if (unit == "kib") scale = 1024.0;
  else if (unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw bad("unknown unit '" + text.substr(i) + "'");
  double bytes = value * scale;
  if (bytes != std::floor(bytes)) throw bad("not a whole number of bytes");
  if (bytes > 1.8e19) throw bad("too large");
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  struct U {
    uint64_t scale;
    const char* name;
  };
  const U units[] = {{1ull << 40, "TiB"}, {1000000000000ull, "TB"}, {1ull << 30, "GiB"}, {1000000000ull, "GB"},
                     {1ull << 20, "MiB"}, {1000000ull, "MB"},       {1ull << 10, "KiB"}, {1000ull, "KB"}};
  for (const U& u : units)
    if (bytes >= u.scale && bytes % u.scale == 0) return std::to_string(bytes / u.scale) + u.name;
  return std::to_string(bytes) + "B";
}

std::string counted(int64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

std::string format_duration(double seconds) {
  const int64_t s = seconds > 0 ? int64_t(seconds + 0.5) : 0;
  char text[48];
  if (s < 60) std::snprintf(text, sizeof text, "%llds", (long long)s);
  else if (s < 3600) std::snprintf(text, sizeof text, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else if (s < 86400)
    std::snprintf(text, sizeof text, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else
    std::snprintf(text, sizeof text, "%lldd%02lldh%02lldm", (long long)(s / 86400), (long long)(s % 86400 / 3600),
                  (long long)(s % 3600 / 60));
  return text;
}

std::vector<std::string> split_list(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) throw UsageError(field(option) + " '" + text + "': empty item in the list");
    if (std::find(items.begin(), items.end(), item) != items.end())
      throw UsageError(field(option) + " '" + text + "': '" + item + "' is listed twice");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

int64_t parse_int(const std::string& raw, const std::string& option) {
  const std::string text = trim(raw);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') throw UsageError(field(option) + " '" + raw + "': not an integer");
  if (errno == ERANGE)
    throw UsageError(field(option) + " '" + raw + "': out of range (a whole number of at most 19 digits, below 2^63)");
  return v;
}

double parse_double(const std::string& raw, const std::string& option) {
  const std::string text = trim(raw);
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') throw UsageError(field(option) + " '" + raw + "': not a number");
  if (!std::isfinite(v))
    throw UsageError(field(option) + " '" + raw + "': not a finite number (at most about 1.8e308)");
  return v;
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option) {
  const std::vector<std::string> items = split_list(text, option);
  std::vector<int64_t> out;
  for (const std::string& item : items) out.push_back(parse_int(item, option));
  require_distinct(out, items, option);
  return out;
}

void require_choice(const std::string& value, const std::vector<std::string>& choices, const std::string& option) {
  if (std::find(choices.begin(), choices.end(), value) == choices.end())
    throw UsageError(field(option) + " '" + value + "': must be one of " + join(choices, ", "));
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

void append_once(std::vector<std::string>& list, const std::string& value) {
  if (!value.empty() && std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", unsigned(c));
      out += code;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace llmhpc

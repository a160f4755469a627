// A plain-text table with aligned columns, for the summaries rank 0 prints.
#pragma once
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace llmhpc {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  // Numbers right-aligned, text left-aligned; the first column is always left-aligned.
  void print(std::FILE* out = stdout) const {
    std::vector<size_t> width(header_.size(), 0);
    for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
    for (const auto& r : rows_)
      for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
    auto line = [&](const std::vector<std::string>& r) {
      for (size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < r.size() ? r[c] : "";
        const bool right = c > 0 && !cell.empty() && (std::isdigit((unsigned char)cell[0]) || cell[0] == '-');
        std::fprintf(out, right ? "%*s" : "%-*s", int(width[c]), cell.c_str());
        std::fputs(c + 1 < width.size() ? "  " : "\n", out);
      }
    };
    line(header_);
    std::string rule;
    for (size_t c = 0; c < width.size(); ++c) rule += std::string(width[c], '-') + (c + 1 < width.size() ? "  " : "");
    std::fprintf(out, "%s\n", rule.c_str());
    for (const auto& r : rows_) line(r);
    std::fflush(out);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

inline std::string fmt(double v, int decimals = 2) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A number as people write it, in the fewest digits that give it back exactly: 25, 0.05,
// 1e-05 (labels of distinct values stay distinct).
inline std::string fmt_exact(double v) {
  char buf[64];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace llmhpc

// Summary statistics of raw per-iteration samples.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace llmhpc {

inline double mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

// Sample standard deviation (n - 1 in the denominator); 0 for a single sample.
inline double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return v.empty() ? NAN : 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

// The middle value (the mean of the two middle ones for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2) return v[mid];
  return (v[mid] + *std::max_element(v.begin(), v.begin() + mid)) / 2;
}

}  // namespace llmhpc

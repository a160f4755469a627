// What modes comm and ddp share for long runs (docs/results/reliability.md, "Soak"):
// --duration-s, which sets the timed iterations from the warm-up's pace; the device
// allocator's live bytes and the host's resident set sampled between timed iterations; and a
// progress line on rank 0 every ~10 s. analysis/soak.py reads what they record.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/modes/mode.h"

namespace llmhpc {

// --duration-s. `count_option` is the mode's fixed count it replaces (iters, steps).
void add_duration_option(po::options_description& desc, const std::string& count_option);
// --duration-s in seconds, 0 when not given. Throws UsageError when it is not a number of
// seconds > 0, when `count_option` is given too, or with --warmup 0 (nothing to calibrate on).
double duration_seconds(const po::variables_map& vm, const std::string& count_option);

// The pace the timed iterations are counted from: the slowest rank's median warm-up
// iteration, in seconds (`warmup` in units of `unit_s` seconds), the same on every rank.
// Collective: one host reduction after the warm-up. Counting on the ranks' clocks during the
// timed loop instead would need a collective at every check to stop together, inside the
// loop it measures.
double agreed_iteration_s(const Runtime& rt, const std::vector<double>& warmup, double unit_s);
// Iterations of `iteration_s` in about `duration_s` seconds, at least 1.
int64_t iterations_in(double duration_s, double iteration_s);
// For the start-up line: "timed for ~S s", or "<count> timed <what>" without --duration-s.
std::string timed_text(double duration_s, int64_t count, const std::string& what);

// Room for n elements, its pages written once: filling it in the timed loop then leaves the
// resident set alone, so the run's own records do not read as a leak.
template <class T>
void reserve_touched(std::vector<T>& v, size_t n) {
  v.resize(n);
  v.clear();  // keeps the capacity
}

// Memory after timed iterations: the iteration's index (0-based), the device allocator's live
// bytes, the driver's count of device memory in use (-1 on the CPU), the host's resident set
// (-1 where /proc cannot be read). Taken between iterations, outside their timing; recorded
// as memory_iteration, device_live_bytes, device_used_bytes, host_rss_bytes.
class MemorySamples {
 public:
  explicit MemorySamples(size_t expected) {
    for (auto* v : {&iteration_, &device_live_, &device_used_, &host_rss_}) reserve_touched(*v, expected);
  }
  void take(int64_t iteration, Device& dev);
  void record(Record& rec) const;

 private:
  std::vector<int64_t> iteration_, device_live_, device_used_, host_rss_;
};

// Rank 0 prints "  <seconds> s: <done> of <total> <what>" every ~10 s; a clock read otherwise.
class Progress {
 public:
  Progress(const Runtime& rt, int64_t total, std::string what);
  void update(int64_t done);

 private:
  const Runtime& rt_;
  int64_t total_;
  std::string what_;
  std::chrono::steady_clock::time_point start_, last_;
  bool printed_ = false;
};

}  // namespace llmhpc

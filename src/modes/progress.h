// Rank 0's progress through a loop that may run for minutes: the steps of a sweep's
// configuration or comm's timed iterations (SweepSteps, src/modes/sweep.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "src/core/runtime.h"

namespace llmhpc {

// Rank 0 prints "  <seconds> s: <done> of <total> <what>" about every --progress-s seconds (10
// by default), the first that long after the loop began, so that a short loop prints nothing;
// otherwise an update is a clock read.
class Progress {
 public:
  Progress(const Runtime& rt, int64_t total, std::string what);
  void update(int64_t done, int64_t total);

 private:
  const Runtime& rt_;
  int64_t total_;
  std::string what_;
  std::chrono::steady_clock::time_point start_, last_;
  bool printed_ = false;
};

// --progress-s (main.cpp), once before the mode runs: seconds between the lines; 0: none.
void set_progress_interval(double seconds);

}  // namespace llmhpc

// What modes comm and ddp share for long runs (docs/results/reliability.md):
// --duration-s, which sets the timed iterations from the warm-up's pace and re-aims them as the
// timed loop goes (DurationCount); and the device allocator's live bytes and the host's resident
// set sampled between timed iterations. analysis/soak.py reads what they record.
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
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

// --heat-s: untimed steps for about that many seconds before each configuration's timed ones, so
// that the GPU runs them at the clocks it holds under sustained load. A power-capped GPU clocks
// lower as it warms (its leakage grows with temperature), and after the pause in which a
// configuration is built its power control swings for a few seconds: a configuration timed in
// that window, or first on a cool GPU, reads slower or faster by its place in the run alone
// (two GPUs: steps 5-20 ms slower in the swing, docs/results/ddp.md). So every configuration
// heats, not only the first.
void add_heat_option(po::options_description& desc);
// --heat-s in seconds, 0 when not given; throws UsageError when it is not a number of seconds
// >= 0 or with --warmup 0 (its count is aimed from the warm-up's pace).
double heat_seconds(const po::variables_map& vm);
// Runs `step` untimed for about `heat_s` seconds of wall time and returns how many it ran.
// Given `together` (ranks whose steps communicate: ddp), collective: every rank runs as many,
// counted by DurationCount from `pace_s`, the warm-up's agreed pace. Without (ranks that each
// time their own steps: bench), each rank heats by its own clock, with no collective that a
// rank which ran out of memory would miss.
int64_t heat_up(const Runtime* together, double heat_s, double pace_s, const std::function<void()>& step);

// The pace the timed iterations are first counted from: the slowest rank's median warm-up
// iteration, in seconds (`warmup` in units of `unit_s` seconds), the same on every rank.
// Collective: one host reduction after the warm-up. (Deciding on the ranks' clocks at every
// iteration would need a collective inside the loop it measures; DurationCount agrees between
// chunks instead.)
double agreed_iteration_s(const Runtime& rt, const std::vector<double>& warmup, double unit_s);
// Iterations of `iteration_s` in about `duration_s` seconds, at least 1.
int64_t iterations_in(double duration_s, double iteration_s);

// The most per-iteration times a --duration-s loop records (comm: 4 arrays of doubles, 320 MB at
// that). Recording every one, a soak of microsecond collectives held gigabytes (a 4 KB all-reduce
// on one CPU rank, ~5 us, for 1000 s: 2e8 iterations, and the run spent its time re-allocating
// 2 GB arrays). ddp, a dozen arrays a step and steps of a millisecond or more (hours to get
// there), ends its loop at this count; comm runs its whole duration and thins what it records
// past it (Thinning).
constexpr int64_t kMaxTimedIterations = 10'000'000;
// The most memory samples a loop records (MemorySamples, thinned past it: 2.6 MB).
constexpr size_t kMaxMemorySamples = size_t(1) << 16;

// Which values of a series of any length to record so that at most `capacity` are held, evenly
// spaced over all of it: each one until the capacity is reached; then every other recorded one is
// dropped and every 2nd value recorded from there on; past the capacity again every 4th, and so
// on. What is recorded is then values 0, every(), 2 every(), ...: a systematic sample, whose
// medians and percentiles stand for the whole series'.
class Thinning {
 public:
  explicit Thinning(size_t capacity);  // even, at least 2
  // For the next value of the series: whether to record it. Where recording it would pass the
  // capacity, `halve()` runs first (drop_odd on every array recorded in step) and every() doubles.
  // Inline: comm asks once per iteration, millions of them.
  template <class Halve>
  bool record_next(Halve&& halve) {
    const int64_t index = offered_++;
    if (index % every_ != 0) return false;
    if (recorded_ == capacity_) {
      halve();
      recorded_ /= 2;
      every_ *= 2;
      if (index % every_ != 0) return false;
    }
    ++recorded_;
    return true;
  }
  int64_t every() const { return every_; }      // values of the series per recorded one
  int64_t offered() const { return offered_; }  // values of the series so far
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_, recorded_ = 0;
  int64_t every_ = 1, offered_ = 0;
};

// Drops v[1], v[3], ...: what Thinning's `halve` does to each array it thins.
template <class T>
void drop_odd(std::vector<T>& v) {
  size_t kept = 0;
  for (size_t i = 0; i < v.size(); i += 2) v[kept++] = v[i];
  v.resize(kept);
}

// How many timed iterations a configuration runs. Without --duration-s a fixed count. With it,
// first aimed from the warm-up's pace, then re-aimed after every chunk of about a second: the
// ranks agree (one host reduction, between chunks, outside the timed iterations) on the wall
// time the loop has taken and on the last chunk's pace, and so on how many iterations are left.
// A warm-up slower than the loop (a loaded host, first-touch costs) then no longer cuts a soak
// short, nor does a faster one stretch it. Every rank makes the same calls in the same order.
class DurationCount {
 public:
  // duration_s 0: `fixed` iterations, one chunk of at most `max_chunk`. With it, at most `most`
  // (kMaxTimedIterations where every iteration is recorded; the loop then ends before the duration).
  DurationCount(const Runtime& rt, double duration_s, int64_t fixed, double warmup_pace_s, int64_t max_chunk,
                int64_t most = kMaxTimedIterations);
  int64_t total() const { return total_; }
  // The iterations of the next chunk, after `done` of them.
  int64_t next_chunk(int64_t done) const { return std::min(chunk_, total_ - done); }
  // The chunks after `done` iterations, as aimed now (a memory sample is taken after each).
  int64_t chunks_left(int64_t done) const { return (total_ - done + chunk_ - 1) / chunk_; }
  // After a chunk: re-aims total() (with --duration-s; collective). `done` iterations so far.
  void after_chunk(int64_t done);

 private:
  const Runtime& rt_;
  double duration_s_;
  int64_t most_, total_, chunk_, max_chunk_;
  int64_t chunk_start_done_ = 0;
  std::chrono::steady_clock::time_point start_, chunk_start_;
};
// For the start-up line: "timed for ~S s", or "<count> timed <what>" without --duration-s.
std::string timed_text(double duration_s, int64_t count, const std::string& what);

// Room for n elements, its pages written once: filling it in the timed loop then leaves the
// resident set alone, so the run's own records do not read as a leak. Keeps what v holds.
template <class T>
void reserve_touched(std::vector<T>& v, size_t n) {
  if (n <= v.capacity()) return;  // its pages were written when the room was made
  const size_t held = v.size();
  v.reserve(v.capacity() == 0 ? n : n + n / 4);  // a re-aimed count grows a little: room to spare
  v.resize(v.capacity());
  v.resize(held);  // keeps the capacity
}

// Memory after timed iterations: the iteration's index (0-based), the device allocator's live
// bytes, the driver's count of device memory in use (-1 on the CPU), the host's resident set
// (-1 where /proc cannot be read), and the bytes the run's own per-iteration records hold then
// (their capacity: a count re-aimed upwards grows them, a resident set that is no leak).
// Taken between iterations, outside their timing; recorded as memory_iteration,
// device_live_bytes, device_used_bytes, host_rss_bytes, records_bytes. At most
// kMaxMemorySamples of them, thinned evenly past that (Thinning).
class MemorySamples {
 public:
  explicit MemorySamples(size_t expected) { expect(expected); }
  // Room for `expected` samples offered in all (a re-aimed count).
  void expect(size_t expected) {
    for (auto* v : arrays()) reserve_touched(*v, std::min(expected, thinning_.capacity()));
  }
  size_t offered() const { return size_t(thinning_.offered()); }
  // A sample after `iteration`, where the thinning records it (read only then).
  void take(int64_t iteration, Device& dev, int64_t records_bytes);
  void record(Record& rec) const;

 private:
  std::array<std::vector<int64_t>*, 5> arrays() {
    return {&iteration_, &device_live_, &device_used_, &host_rss_, &records_};
  }
  std::vector<int64_t> iteration_, device_live_, device_used_, host_rss_, records_;
  Thinning thinning_{kMaxMemorySamples};
};

}  // namespace llmhpc

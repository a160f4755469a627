#include "src/modes/soak.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "src/core/stats.h"
#include "src/core/table.h"
#include "src/core/units.h"
#include "src/modes/options.h"

namespace llmhpc {

void add_duration_option(po::options_description& desc, const std::string& count_option) {
  desc.add_options()(
      "duration-s", po::value<std::string>(),
      ("run each configuration's timed loop for about this many seconds instead of --" + count_option +
       ": the count is aimed from the warm-up's median iteration (the slowest rank's) and re-aimed " +
       "about every second from the loop's own pace, the same on every rank; memory is sampled " +
       "as it runs and rank 0 prints progress every --progress-s; each timed iteration is recorded up to " +
       std::to_string(kMaxTimedIterations) +
       " of them: past that comm records 1 in 2, then 1 in 4, ..., evenly over the whole duration "
       "(attribute time_us_every), and ddp ends its loop there")
          .c_str());
}

double duration_seconds(const po::variables_map& vm, const std::string& count_option) {
  if (!opt_given(vm, "duration-s")) return 0;
  const std::string text = opt_string(vm, "duration-s");
  const double s = parse_double(text, "duration-s");
  if (!(s > 0) || s > 1e7) throw UsageError("--duration-s " + text + ": must be a number of seconds > 0, e.g. 120");
  if (opt_given(vm, count_option))
    throw UsageError("--duration-s and --" + count_option + " both set the timed iterations: give one of them");
  if (opt_int(vm, "warmup") < 1)
    throw UsageError("--duration-s counts the timed iterations from the warm-up's: needs --warmup 1 or more");
  return s;
}

void add_heat_option(po::options_description& desc) {
  desc.add_options()("heat-s", po::value<std::string>(),
                     "before each configuration's timed steps, run its steps untimed for about this many seconds, "
                     "so that a power-capped GPU, which clocks lower as it warms and whose clock swings for a few "
                     "seconds after the pause in which a configuration is built, times every configuration at the "
                     "clocks it holds under sustained load (e.g. 10-30 where configurations are compared; needs "
                     "--warmup 1 or more)");
}

double heat_seconds(const po::variables_map& vm) {
  if (!opt_given(vm, "heat-s")) return 0;
  const std::string text = opt_string(vm, "heat-s");
  const double s = parse_double(text, "heat-s");
  if (!(s >= 0) || s > 1e5) throw UsageError("--heat-s " + text + ": must be a number of seconds >= 0, e.g. 30");
  if (s > 0 && opt_int(vm, "warmup") < 1)
    throw UsageError("--heat-s counts its steps from the warm-up's pace: needs --warmup 1 or more");
  return s;
}

int64_t heat_up(const Runtime* together, double heat_s, double pace_s, const std::function<void()>& step) {
  if (!(heat_s > 0)) return 0;
  int64_t s = 0;
  if (!together) {
    const auto start = std::chrono::steady_clock::now();
    do {
      step();
      ++s;
    } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < heat_s);
    return s;
  }
  DurationCount count(*together, heat_s, 0, pace_s, std::numeric_limits<int64_t>::max());
  while (s < count.total()) {
    for (const int64_t end = s + count.next_chunk(s); s < end; ++s) step();
    count.after_chunk(s);
  }
  return s;
}

double agreed_iteration_s(const Runtime& rt, const std::vector<double>& warmup, double unit_s) {
  return rt.reduce_all(median(warmup) * unit_s, HostReduce::Max);
}

int64_t iterations_in(double duration_s, double iteration_s) {
  return std::max<int64_t>(1, std::llround(duration_s / std::max(iteration_s, 1e-9)));
}

DurationCount::DurationCount(const Runtime& rt, double duration_s, int64_t fixed, double warmup_pace_s,
                             int64_t max_chunk, int64_t most)
    : rt_(rt), duration_s_(duration_s), most_(most),
      total_(duration_s > 0 ? std::min(iterations_in(duration_s, warmup_pace_s), most) : fixed),
      chunk_(duration_s > 0 ? std::clamp<int64_t>(iterations_in(1.0, warmup_pace_s), 1, max_chunk)
                            : std::min(fixed, max_chunk)),
      max_chunk_(max_chunk), start_(std::chrono::steady_clock::now()), chunk_start_(start_) {}

void DurationCount::after_chunk(int64_t done) {
  if (duration_s_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const std::vector<double> agreed =
      rt_.reduce_all(std::vector<double>{std::chrono::duration<double>(now - start_).count(),
                                         std::chrono::duration<double>(now - chunk_start_).count() /
                                             double(std::max<int64_t>(1, done - chunk_start_done_))},
                     HostReduce::Max);
  const double elapsed_s = agreed[0], pace_s = std::max(agreed[1], 1e-9), left_s = duration_s_ - elapsed_s;
  total_ = std::min(done + (left_s > pace_s / 2 ? iterations_in(left_s, pace_s) : 0), most_);
  chunk_ = std::clamp<int64_t>(iterations_in(1.0, pace_s), 1, max_chunk_);
  chunk_start_ = std::chrono::steady_clock::now();
  chunk_start_done_ = done;
}

std::string timed_text(double duration_s, int64_t count, const std::string& what) {
  return duration_s > 0 ? "timed for ~" + fmt_exact(duration_s) + " s" : std::to_string(count) + " timed " + what;
}

Thinning::Thinning(size_t capacity) : capacity_(capacity) {
  if (capacity < 2 || capacity % 2) throw std::invalid_argument("Thinning: an even capacity of at least 2");
}

void MemorySamples::take(int64_t iteration, Device& dev, int64_t records_bytes) {
  if (!thinning_.record_next([&] {
        for (auto* v : arrays()) drop_odd(*v);
      }))
    return;
  iteration_.push_back(iteration);
  device_live_.push_back(dev.allocator().live_bytes());
  device_used_.push_back(dev.memory_used());
  host_rss_.push_back(host_resident_bytes());
  records_.push_back(records_bytes);
}

void MemorySamples::record(Record& rec) const {
  rec.add("memory_iteration", iteration_)
      .add("device_live_bytes", device_live_)
      .add("device_used_bytes", device_used_)
      .add("host_rss_bytes", host_rss_)
      .add("records_bytes", records_);
}

}  // namespace llmhpc

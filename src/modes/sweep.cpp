#include "src/modes/sweep.h"

#include <cmath>
#include <cstdio>

#include "src/core/watchdog.h"
#include "src/modes/options.h"

namespace llmhpc {

std::string SweepStatus::column() const {
  const std::string word = worst.substr(0, worst.find(':'));
  if (worst_rank < 0 || mine == worst) return word;
  return word + " (rank " + std::to_string(worst_rank) + ")";
}

namespace {

// What the ops keep live from one call to the next on purpose: the CUDA ops' RoPE table, which
// grows to the longest context yet as a forward begins (so a configuration that ran out of
// memory after its first layer leaves a larger one). Not a leak of the failed configuration.
int64_t op_cache_bytes(const TracingAllocator& memory) {
  static const std::vector<TagCategory> caches = {{"op caches", {"rope."}}};
  return memory.live_by_category(caches).of("op caches");
}

// The monitor's readings into the record (docs/hdf5-schema.md, "Device sensors"): the raw
// arrays, and their summary over the busy readings as attributes.
void record_sensors(Record& rec, const DeviceMonitor& monitor) {
  const DeviceMonitor::Samples& s = monitor.samples();
  if (s.time_ms.empty()) return;
  rec.add("device_time_ms", s.time_ms)
      .add("device_sm_clock_mhz", s.sm_clock_mhz)
      .add("device_power_w", s.power_w)
      .add("device_temperature_c", s.temperature_c)
      .add("device_clock_reasons", s.clock_reasons);
  const ClockSummary c = monitor.summary();
  rec.attr("device_busy_samples", int64_t(c.busy_samples)).attr("device_slowdowns", slowdown_names(c.slowdowns));
  if (c.busy_samples > 0)
    rec.attr("device_sm_clock_mhz_min", c.min_mhz)
        .attr("device_sm_clock_mhz_median", c.median_mhz)
        .attr("device_sm_clock_mhz_max", c.max_mhz);
}

// What rank 0 adds to a configuration's progress line when a busy GPU slowed its clock on any
// rank: "; clocks slowed (sw power cap): SM 1755-1980 MHz". Collective.
std::string slowdown_note(const Runtime& rt, const ClockSummary& mine) {
  constexpr int kBits = 8;  // the slowdown reasons are among NVML's bits 0-7
  std::vector<double> v(kBits + 2, 0.0);
  for (int b = 0; b < kBits; ++b) v[size_t(b)] = (mine.slowdowns >> b) & 1;
  const bool busy = mine.busy_samples > 0;
  v[kBits] = busy ? -mine.min_mhz : -INFINITY;  // Max of the negated: the lowest minimum
  v[kBits + 1] = busy ? mine.max_mhz : -INFINITY;
  const std::vector<double> all = rt.reduce_all(v, HostReduce::Max);
  uint64_t slowdowns = 0;
  for (int b = 0; b < kBits; ++b) slowdowns |= uint64_t(all[size_t(b)] > 0) << b;
  if (!slowdowns) return "";
  return "; clocks slowed (" + slowdown_names(slowdowns) + "): SM " + fmt(-all[kBits], 0) + "-" +
         fmt(all[kBits + 1], 0) + " MHz" + (rt.world_size > 1 ? " over the ranks" : "");
}

}  // namespace

Sweep::Sweep(ModeContext& ctx, std::string mode, size_t total, std::vector<std::string> columns)
    : ctx_(ctx), mode_(std::move(mode)), total_(total), table_(std::move(columns)),
      monitor_([&device = *ctx.backend.device](DeviceReading& r) { return device.read_sensors(r); },
               std::chrono::milliseconds(opt_int(ctx.vm, "device-sample-ms"))) {}

SweepStatus Sweep::run(const std::string& label, Record& rec, const std::function<std::string()>& measure,
                       const std::function<void(Record&)>& finish) {
  const Runtime& rt = ctx_.rt;
  Watchdog::instance().set_context(rec.group);
  Watchdog::instance().set_step(-1);
  rt.barrier();  // ranks measure side by side
  log_root(rt, "[%zu/%zu] %s ... ", ++done_, total_, label.c_str());
  ctx_.recorder.write_running(rec);  // a rank killed while measuring leaves this mark
  TracingAllocator& memory = ctx_.backend.device->allocator();
  const int64_t live_before = memory.live_bytes(), cached_before = op_cache_bytes(memory);
  std::string progress;
  monitor_.start();
  try {
    progress = measure();
  } catch (const OutOfMemory& e) {
    rec.status = "oom";
    rec.attr("error", std::string(e.what()));
  } catch (const UsageError& e) {  // this configuration cannot run; the others may
    rec.status = std::string("error: ") + e.what();
  }
  monitor_.stop();
  record_sensors(rec, monitor_);
  if (finish) finish(rec);
  if (rec.status != "ok") {
    // What the failed configuration held is freed by now (measure's scope and `finish`):
    // nothing more is live than when it started (less where it released state it shared
    // with earlier configurations, as a ddp model's batch buffers).
    const int64_t live_after = memory.live_bytes();
    rec.attr("live_bytes_before", live_before).attr("live_bytes_after_recovery", live_after);
    const int64_t held = (live_after - live_before) - (op_cache_bytes(memory) - cached_before);
    if (held > 0)
      std::fprintf(stderr, "llmhpc: rank %d: %s: %lld bytes still held after the failure (%lld before, %lld after)\n",
                   rt.rank, label.c_str(), (long long)held, (long long)live_before, (long long)live_after);
  }
  ctx_.recorder.write(rec);

  SweepStatus s;
  s.mine = rec.status;
  s.worst_rank = int(rt.reduce_all(int64_t(s.ok() ? rt.world_size : rt.rank), HostReduce::Min));
  if (s.worst_rank == rt.world_size) s.worst_rank = -1;
  else s.worst = broadcast_string(s.mine, s.worst_rank);

  if (s.mine.rfind("error", 0) == 0 && !rt.is_root())  // the whole message, which rank 0 does not print
    std::fprintf(stderr, "llmhpc: rank %d: %s: %s\n", rt.rank, label.c_str(), s.mine.c_str());
  std::string line = s.ok() ? progress : s.mine;
  if (s.worst_rank >= 0 && s.worst_rank != rt.rank && s.ok())
    line += "; rank " + std::to_string(s.worst_rank) + ": " + s.worst;
  line += slowdown_note(rt, monitor_.summary());
  log_root(rt, "%s\n", line.c_str());
  return s;
}

void Sweep::agree(const std::function<void()>& prepare) const {
  const Runtime& rt = ctx_.rt;
  enum Kind : int64_t { kOk = 0, kUsage = 1, kOom = 2 };
  int64_t kind = kOk;
  std::string what;
  try {
    prepare();
  } catch (const OutOfMemory& e) {
    kind = kOom, what = e.what();
  } catch (const UsageError& e) {
    kind = kUsage, what = e.what();
  }
  const int first = int(rt.reduce_all(int64_t(kind == kOk ? rt.world_size : rt.rank), HostReduce::Min));
  if (first == rt.world_size) return;
  const int64_t first_kind = rt.reduce_all(first == rt.rank ? kind : int64_t(0), HostReduce::Max);
  const std::string message = broadcast_string(what, first);
  const std::string text = first == rt.rank ? message : "rank " + std::to_string(first) + ": " + message;
  if (first_kind == kOom) throw OutOfMemory(text);
  throw UsageError(text);
}

void Sweep::print_summary(const std::string& title) const {
  if (!ctx_.rt.is_root()) return;
  std::printf("\n%s\n", title.c_str());
  table_.print();
}

}  // namespace llmhpc

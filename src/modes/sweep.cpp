#include "src/modes/sweep.h"

#include <cstdio>
#include <new>

#include "src/core/stop_request.h"
#include "src/core/watchdog.h"

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

constexpr const char* kHostOutOfMemory = "the host's memory: an allocation did not fit (std::bad_alloc)";

// How a configuration's work went on this rank: whether it threw what a sweep goes on after (a
// request that did not fit, a configuration that cannot run), and the message.
struct Failure {
  enum Kind : int64_t { None = 0, Usage = 1, Oom = 2 } kind = None;
  std::string what;
  // For the watchdog (settle_after_failure) and the record's status of a usage error.
  std::string text() const { return kind == Oom ? "out of memory (" + what + ")" : "error: " + what; }
};

Failure attempt(const std::function<void()>& work) {
  try {
    work();
  } catch (const OutOfMemory& e) {
    return {Failure::Oom, e.what()};
  } catch (const std::bad_alloc&) {  // a size too large for the host (the same on every rank)
    return {Failure::Oom, kHostOutOfMemory};
  } catch (const UsageError& e) {  // this configuration cannot run; the others may
    return {Failure::Usage, e.what()};
  }
  return {};
}

}  // namespace

Sweep::Sweep(ModeContext& ctx, std::string mode, size_t total, std::vector<std::string> columns)
    : ctx_(ctx), mode_(std::move(mode)), total_(total), table_(std::move(columns)), monitor_(device_monitor(ctx)) {}

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
  monitor_->start();
  const Failure failure = attempt([&] { progress = measure(); });
  if (failure.kind == Failure::Oom) {
    rec.status = "oom";
    rec.attr("error", failure.what);
  } else if (failure.kind == Failure::Usage) {
    rec.status = failure.text();
  }
  monitor_->stop();
  record_sensors(rec, monitor_->samples());
  record_arrivals(rec);
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
  if (failure.kind != Failure::None)  // before the agreement: a rank that went on without this one ends the job
    Watchdog::instance().settle_after_failure(failure.text());

  SweepStatus s;
  s.mine = rec.status;
  s.worst_rank = int(rt.reduce_all(int64_t(s.ok() ? rt.world_size : rt.rank), HostReduce::Min));
  if (s.worst_rank == rt.world_size) s.worst_rank = -1;
  else s.worst = rt.broadcast(s.mine, s.worst_rank);
  ctx_.count_configuration(s.worst == "oom");

  if (s.mine.rfind("error", 0) == 0 && !rt.is_root())  // the whole message, which rank 0 does not print
    std::fprintf(stderr, "llmhpc: rank %d: %s: %s\n", rt.rank, label.c_str(), s.mine.c_str());
  std::string line = s.ok() ? progress : s.mine;
  if (s.worst_rank >= 0 && s.worst_rank != rt.rank && s.ok())
    line += "; rank " + std::to_string(s.worst_rank) + ": " + s.worst;
  line += slowdown_note(rt, monitor_->summary());
  log_root(rt, "%s\n", line.c_str());
  return s;
}

void Sweep::agree(const std::function<void()>& prepare) const {
  const Runtime& rt = ctx_.rt;
  const Failure failure = attempt(prepare);
  if (failure.kind != Failure::None)  // before the agreement: a rank that went on without this one ends the job
    Watchdog::instance().settle_after_failure(failure.text());
  const int first =
      int(rt.reduce_all(int64_t(failure.kind == Failure::None ? rt.world_size : rt.rank), HostReduce::Min));
  if (first == rt.world_size) return;
  const int64_t first_kind = rt.reduce_all(first == rt.rank ? int64_t(failure.kind) : int64_t(0), HostReduce::Max);
  const std::string message = rt.broadcast(failure.what, first);
  const std::string text = first == rt.rank ? message : "rank " + std::to_string(first) + ": " + message;
  if (first_kind == Failure::Oom) throw OutOfMemory(text);
  throw UsageError(text);
}

SweepSteps::SweepSteps(ModeContext& ctx, const Record& rec, int64_t total, std::string what,
                       std::function<void(Record&)> keep)
    : ctx_(ctx), rec_(rec), keep_(std::move(keep)), progress_(ctx.rt, total, std::move(what)), total_(total),
      flush_(ctx.recorder, ctx.flush) {}

void SweepSteps::update(int64_t done, int64_t total) {
  done_ = done;
  total_ = total;
  progress_.update(done_, total_);
  between();
}

void SweepSteps::between() {
  const auto kept = [&](const std::string& status) {
    Record r = rec_;
    keep_(r);
    record_arrivals(r);  // the steps' arrivals so far: who was late before a hang
    r.status = status;
    return r;
  };
  stop_.at_step([&](int signal) { flush_.write_now(kept("interrupted: " + signal_name(signal))); });
  flush_.when_due(done_, [&] { return kept("running"); });
}

void keep_timed_steps(Record& rec, int64_t timed, int64_t asked) {
  rec.attr("steps_timed", timed).attr("steps_asked", asked);
}

void Sweep::print_summary(const std::string& title) const {
  if (!ctx_.rt.is_root()) return;
  std::printf("\n%s\n", title.c_str());
  table_.print();
}

}  // namespace llmhpc

// The one sweep loop of every measuring mode (bench, attention, ddp, profile, memory, precision).
//
// For each configuration, on every rank together: a barrier (ranks measure side by side), the
// progress line on rank 0, the mode's measurement with the device's sensors read beside it
// (--device-sample-ms: src/core/device_monitor.h), an out-of-memory recorded as status "oom"
// and an unsupported configuration as "error: ..." (the sweep goes on), the statuses of all
// ranks agreed (rank 0 reports a failure seen on any rank, and clocks that slowed on any
// rank), the record written, and a row for the summary table rank 0 prints at the end.
//
//   Sweep sweep(ctx, "bench", cases.size(), {"Model", "ctx", "Fwd mean", "status"});
//   for (const Case& c : cases) {
//     Record rec;  rec.group = "bench/" + c.label();  rec.attr(...);
//     Samples s;
//     const SweepStatus st = sweep.run(c.label(), rec, [&] { ...measure, s.record(rec)...; return "12.3 ms"; });
//     sweep.add_row({c.name, ..., fmt(mean(s.step)), st.column()});
//   }
//   sweep.print_summary("bench summary (ms, ...)");
//
// Inside `measure`, SweepSteps follows the configuration's steps: rank 0's progress lines, and
// the steps measured so far kept in the record should the run end before the configuration does.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/core/stop_request.h"
#include "src/core/table.h"
#include "src/modes/mode.h"
#include "src/modes/progress.h"
#include "src/modes/sensors.h"

namespace llmhpc {

// How one configuration went: this rank's status and the first failure over all ranks.
struct SweepStatus {
  std::string mine = "ok";   // this rank's record status: "ok", "oom", "error: ..."
  std::string worst = "ok";  // "ok" when every rank measured; else the lowest failing rank's status
  int worst_rank = -1;       // that rank, -1 when all are ok

  bool ok() const { return mine == "ok"; }
  // For a table: "ok", "oom", "error", or "oom (rank 1)" when another rank failed.
  std::string column() const;
};

class Sweep {
 public:
  // The device's sensors read every ctx.device_sample (--device-sample-ms).
  Sweep(ModeContext& ctx, std::string mode, size_t total, std::vector<std::string> columns);

  // Measures one configuration into `rec` (group and configuration attributes already set).
  // `measure` adds the arrays and results and returns the progress text rank 0 prints when
  // it succeeded ("12.3 ms/step"). `finish`, if given, runs whatever the outcome, before the
  // record is written (memory attributes). Collective.
  SweepStatus run(const std::string& label, Record& rec, const std::function<std::string()>& measure,
                  const std::function<void(Record&)>& finish = nullptr);

  // Runs `prepare` (allocations, the first steps: whatever may run out of memory) and agrees
  // on the outcome before any collective: if it threw OutOfMemory or UsageError on any rank,
  // every rank throws the same kind (naming the failing rank), so none is left waiting in a
  // collective that another rank never enters. Collective; use inside run()'s `measure`.
  void agree(const std::function<void()>& prepare) const;
  // Forgets the device sensors' readings so far in this configuration, so that its record's
  // clocks are those of what follows (the timed steps after --heat-s). Inside run()'s `measure`.
  void restart_sensors() {
    monitor_->stop();
    monitor_->start();
  }

  void add_row(std::vector<std::string> cells) { table_.add_row(std::move(cells)); }
  // Rank 0 prints `title` and the table.
  void print_summary(const std::string& title) const;

 private:
  friend class SweepSteps;
  ModeContext& ctx_;
  std::string mode_;
  size_t total_, done_ = 0;
  TextTable table_;
  std::unique_ptr<DeviceMonitor> monitor_;
};

// The steps of one configuration while they run (inside Sweep::run's `measure`, from its first
// warm-up step to its last timed one), which at a large shape take minutes. Rank 0 prints
// "  <seconds> s: <done> of <total> <what>" about every --progress-s (src/modes/progress.h). On
// SIGINT or SIGTERM (install_stop_notice) the steps measured so far are kept: at the next step
// the record is written with them, status "interrupted: <signal>", before the signal's stop ends
// the process (KeepBeforeStop: where that step ends within kStopWaitMs of the signal; else the
// record stays as the stop marked it, with no steps). Each rank keeps its own. And every
// --flush-s the record is written with the steps so far, status "running" (ModeContext::flush),
// on a thread of its own (RecordFlush), whose last write the destructor waits for: end the
// SweepSteps before writing the record's final version (Sweep::run's `measure` returns first).
// `keep` adds to a copy of the record the arrays of the steps so far and what they are
// (keep_timed_steps), as `measure` adds them at the end.
class SweepSteps {
 public:
  // `total` steps (warm-up and timed), or other units of `what` ("additions").
  SweepSteps(Sweep& sweep, const Record& rec, int64_t total, std::string what, std::function<void(Record&)> keep)
      : SweepSteps(sweep.ctx_, rec, total, std::move(what), std::move(keep)) {}
  // A mode that runs its own loop of configurations (comm).
  SweepSteps(ModeContext& ctx, const Record& rec, int64_t total, std::string what, std::function<void(Record&)> keep);
  // After `n` more of the total.
  void done(int64_t n = 1) { update(done_ + n, total_); }
  // After `done` of `total` (a count re-aimed as the loop goes, as --duration-s's).
  void update(int64_t done, int64_t total);
  // After a step outside the total (--heat-s's, which run for a time, not a count).
  void between();

 private:
  ModeContext& ctx_;
  const Record& rec_;
  std::function<void(Record&)> keep_;
  Progress progress_;
  int64_t total_, done_ = 0;
  KeepBeforeStop stop_;
  RecordFlush flush_;  // destroyed first: the last periodic write lands before the record's final one
};

// A record kept before its configuration ended (SweepSteps): its arrays hold `timed` timed steps
// of the `asked` it was to time (attributes steps_timed, steps_asked; the warm-up arrays hold the
// warm-up steps run).
void keep_timed_steps(Record& rec, int64_t timed, int64_t asked);

}  // namespace llmhpc

#include "src/modes/progress.h"

namespace llmhpc {
namespace {

// One setting for every loop of the run, so that a mode's loops need not pass it on.
double g_interval_s = 10;

}  // namespace

void set_progress_interval(double seconds) { g_interval_s = seconds; }

Progress::Progress(const Runtime& rt, int64_t total, std::string what)
    : rt_(rt), total_(total), what_(std::move(what)), start_(std::chrono::steady_clock::now()), last_(start_) {}

void Progress::update(int64_t done, int64_t total) {
  total_ = total;
  if (!rt_.is_root() || !(g_interval_s > 0)) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::duration<double>(g_interval_s)) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  // The first line after the sweep's pending "[k/n] label ... ".
  log_root(rt_, "%s  %.*f s: %lld of %lld %s\n", printed_ ? "" : "\n", g_interval_s < 1 ? 1 : 0, s, (long long)done,
           (long long)total_, what_.c_str());
  printed_ = true;
}

}  // namespace llmhpc

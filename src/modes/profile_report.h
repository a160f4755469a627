// What mode profile prints and records about one configuration's window (the reference
// nsys study's tables (a)-(e)): per phase a kernel summary like Nsight Systems' (Time %, Total,
// Instances, Avg, Med, Min, Max, StdDev, Name), the time by category with the share of matrix
// products, attention's parts, the profiler's time per phase beside the event timing of the
// same steps, and each phase's time per step; and the profiler's tables as record arrays.
//
// Groups: an activity counts in the phase under the outermost one it ran in ("forward",
// "backward", "optimizer": the second component of its phase path) and in the outermost
// ("step", the whole step). Activities outside every phase form the group "(no phase)".
#pragma once
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/profiler.h"
#include "src/io/recorder.h"
#include "src/modes/model_sweep.h"

namespace llmhpc {

// One row of a kernel summary: one name's instances in one group. Times in ns; StdDev is the
// sample standard deviation (n - 1; 0 for one instance), Med the median (the mean of the two
// middle values for an even count).
struct KernelRow {
  std::string name, category;
  double time_pct = 0, total_ns = 0, avg_ns = 0, med_ns = 0, min_ns = 0, max_ns = 0, stddev_ns = 0;
  int64_t instances = 0;
};

// Rows from each name's durations (ns) and category, largest total first (ties by name);
// Time % is of the total over all rows, so the column sums to 100.
std::vector<KernelRow> kernel_rows(const std::map<std::string, std::pair<std::string, std::vector<double>>>& by_name);

// "step/forward/layer 12/scores" -> "step/forward/layer */scores": a phase path with every
// component's trailing number replaced by '*', so that all layers count as one.
std::string phase_pattern(const std::string& path);

// FLOPs per step of naive attention's `part` ("scores", "softmax", "value_matmul") in group
// `group` ("forward" or "backward"), all layers together; NaN for anything else. The matrix
// products exactly (2 per multiply-add over the full T x T scores: the naive kernels skip
// nothing for the causal mask); softmax an estimate, 5 per score forward (max, subtract, exp,
// sum, scale) and 4 backward. Under tensor parallelism (`tp` ranks) each rank computes its
// num_heads / tp heads.
double naive_attention_flops(const std::string& group, const std::string& part, const ModelCase& c, int tp = 1);

// The profiler's cost: the median traced step against the median untraced one. Medians: one
// slow step (a clock ramp, the host scheduling something else) must not read as the profiler's.
// And how far the step time moved by itself meanwhile, the drift: the median of the untraced
// steps after the traced ones (the last floor(n/2)) against those before them (the first
// ceil(n/2)). An overhead no larger than the drift is not resolved by the run (a busy or shared
// host: docs/results/profile.md).
struct Overhead {
  double untraced_ms, traced_ms, pct;
  double drift_pct;  // NaN with fewer than two untraced steps
  bool resolved() const { return !(std::abs(pct) <= std::abs(drift_pct)); }
};
Overhead overhead(const StepSamples& untraced, const StepSamples& traced);

// One window's activities, aggregated as they are delivered (8 bytes per activity are kept,
// for the medians), and the report made from them and the profiler's tables afterwards.
class ProfileReport {
 public:
  ProfileReport(const ModelCase& c, int64_t steps, int tp = 1) : case_(c), steps_(steps), tp_(tp) {}
  void add(const Activity& a) { durations_[{a.phase, a.name}].push_back(double(a.end_ns - a.start_ns)); }

  // After the window, with the profiler's tables: everything below reads them from `p`.
  void finish(const Profiler& p);

  // The groups, in the order their phases first opened; the outermost ("step") last.
  const std::vector<std::string>& groups() const { return groups_; }
  std::vector<KernelRow> rows(const std::string& group) const;
  double kernel_ms_per_step(const std::string& group) const;
  double category_ms_per_step(const std::string& group, const std::string& category) const;
  double matmul_pct(const std::string& group) const;  // NaN when the group ran nothing
  double activities_per_step() const;

  // Rank 0's report: the tables above, `events` the event timing of the same steps and
  // `untraced` that of as many steps without the profiler (the overhead).
  void print(std::FILE* out, const std::string& title, int top, const StepSamples& events,
             const StepSamples& untraced) const;

 private:
  struct Cell {  // one (group, name)
    std::string category;
    std::vector<double> durations;
  };
  ModelCase case_;
  int64_t steps_;
  int tp_ = 1;  // tensor-parallel ranks sharing the model: this rank's heads are num_heads / tp
  const Profiler* profiler_ = nullptr;
  std::map<std::pair<int32_t, int32_t>, std::vector<double>> durations_;  // (phase, name) -> ns
  std::vector<std::string> groups_;
  std::map<std::string, std::map<std::string, Cell>> cells_;               // group -> name -> cell
  std::map<std::string, std::map<std::string, double>> attention_ns_;      // group -> part -> ns
  std::map<std::string, std::map<std::string, int64_t>> attention_count_;  // group -> part -> activities
  std::map<std::string, std::string> group_path_;                          // group -> its phase path
};

// The profiler's tables into `rec` (docs/hdf5-schema.md, /profile): names with their
// categories, phases, ranges.
void record_profiler_tables(Record& rec, const Profiler& p);

}  // namespace llmhpc

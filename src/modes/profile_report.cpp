// Mode profile's tables (src/modes/profile_report.h).
#include "src/modes/profile_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>

#include "src/core/stats.h"
#include "src/core/table.h"

namespace llmhpc {
namespace {

constexpr size_t kNameWidth = 100;  // printed kernel names are cut here; the rank files have them whole

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t slash; (slash = path.find('/', start)) != std::string::npos; start = slash + 1)
    parts.push_back(path.substr(start, slash - start));
  parts.push_back(path.substr(start));
  return parts;
}

std::string short_name(const std::string& name) {
  return name.size() <= kNameWidth ? name : name.substr(0, kNameWidth - 3) + "...";
}

std::string pct(double v) { return std::isnan(v) ? "-" : fmt(v, 1) + "%"; }

void print_table(std::FILE* out, const std::string& title, const TextTable& table) {
  std::fprintf(out, "\n%s\n", title.c_str());
  table.print(out);
}

}  // namespace

std::vector<KernelRow> kernel_rows(const std::map<std::string, std::pair<std::string, std::vector<double>>>& by_name) {
  std::vector<KernelRow> rows;
  double all = 0;
  for (const auto& [name, cell] : by_name) {
    const std::vector<double>& d = cell.second;
    if (d.empty()) continue;
    KernelRow r;
    r.name = name;
    r.category = cell.first;
    r.instances = int64_t(d.size());
    r.total_ns = std::accumulate(d.begin(), d.end(), 0.0);
    r.avg_ns = mean(d);
    r.med_ns = median(d);
    r.min_ns = *std::min_element(d.begin(), d.end());
    r.max_ns = *std::max_element(d.begin(), d.end());
    r.stddev_ns = stddev(d);
    all += r.total_ns;
    rows.push_back(std::move(r));
  }
  for (KernelRow& r : rows) r.time_pct = all > 0 ? 100.0 * r.total_ns / all : 0.0;
  std::sort(rows.begin(), rows.end(), [](const KernelRow& a, const KernelRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return rows;
}

std::string phase_pattern(const std::string& path) {
  std::string out;
  for (const std::string& part : split_path(path)) {
    size_t digits = part.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(part[digits - 1]))) --digits;
    out += (out.empty() ? "" : "/") + (digits < part.size() ? part.substr(0, digits) + "*" : part);
  }
  return out;
}

double naive_attention_flops(const std::string& group, const std::string& part, const ModelCase& c, int tp) {
  if (c.attention != AttentionKind::Naive) return NAN;
  const double d = double(c.model.head_dim());
  const std::map<std::pair<std::string, std::string>, double> per_score = {
      {{"forward", "scores"}, 2 * d},  {{"forward", "value_matmul"}, 2 * d},  {{"forward", "softmax"}, 5},
      {{"backward", "scores"}, 4 * d}, {{"backward", "value_matmul"}, 4 * d}, {{"backward", "softmax"}, 4}};
  auto it = per_score.find({group, part});
  if (it == per_score.end()) return NAN;
  const double T = double(c.model.context_length);
  return it->second * double(c.batch) * double(c.model.num_heads / tp) * T * T * double(c.model.num_layers);
}

void ProfileReport::finish(const Profiler& p) {
  profiler_ = &p;
  const std::vector<PhaseInfo>& phases = p.phases();
  const std::vector<std::string>& names = p.names();
  // Each phase's groups: the second component of its path, then the first.
  std::vector<std::vector<std::string>> groups_of(phases.size());
  std::vector<std::string> inner, outer;
  auto note = [&](std::vector<std::string>& list, const std::string& g, const std::string& path) {
    if (std::find(list.begin(), list.end(), g) == list.end()) list.push_back(g), group_path_[g] = path;
  };
  std::set<int32_t> opened;  // phases that have ranges in this window, in the order they first opened
  std::vector<int32_t> order;
  for (const PhaseRange& r : p.ranges())
    if (opened.insert(r.phase).second) order.push_back(r.phase);
  for (const auto& entry : durations_)
    if (entry.first.first >= 0 && opened.insert(entry.first.first).second) order.push_back(entry.first.first);
  for (int32_t ph : order) {
    const std::vector<std::string> parts = split_path(phases[ph].path);
    if (parts.size() > 1) {
      note(inner, parts[1], parts[0] + "/" + parts[1]);
      groups_of[ph].push_back(parts[1]);
    }
    note(outer, parts[0], parts[0]);
    groups_of[ph].push_back(parts[0]);
  }
  groups_ = inner;
  groups_.insert(groups_.end(), outer.begin(), outer.end());
  for (const auto& [key, durations] : durations_) {
    const auto [phase, name_id] = key;
    const std::string& name = names[name_id];
    const ActivityKind kind = p.name_kinds()[name_id];
    const std::string leaf = phase >= 0 ? phases[phase].name : "";
    const std::string part = attention_part(leaf, name, kind);
    std::vector<std::string> groups = phase >= 0 ? groups_of[phase] : std::vector<std::string>{"(no phase)"};
    if (phase < 0 && std::find(groups_.begin(), groups_.end(), "(no phase)") == groups_.end())
      groups_.push_back("(no phase)");
    for (const std::string& g : groups) {
      Cell& cell = cells_[g][name];
      cell.category = activity_category(name, kind);
      cell.durations.insert(cell.durations.end(), durations.begin(), durations.end());
      if (!part.empty()) {
        attention_ns_[g][part] += std::accumulate(durations.begin(), durations.end(), 0.0);
        attention_count_[g][part] += int64_t(durations.size());
      }
    }
  }
}

std::vector<KernelRow> ProfileReport::rows(const std::string& group) const {
  std::map<std::string, std::pair<std::string, std::vector<double>>> by_name;
  auto g = cells_.find(group);
  if (g != cells_.end())
    for (const auto& [name, cell] : g->second) by_name[name] = {cell.category, cell.durations};
  return kernel_rows(by_name);
}

double ProfileReport::category_ms_per_step(const std::string& group, const std::string& category) const {
  double ns = 0;
  auto g = cells_.find(group);
  if (g != cells_.end())
    for (const auto& [name, cell] : g->second)
      if (category.empty() || cell.category == category)
        ns += std::accumulate(cell.durations.begin(), cell.durations.end(), 0.0);
  return ns / 1e6 / double(steps_);
}

double ProfileReport::kernel_ms_per_step(const std::string& group) const { return category_ms_per_step(group, ""); }

double ProfileReport::matmul_pct(const std::string& group) const {
  const double all = kernel_ms_per_step(group);
  return all > 0 ? 100.0 * category_ms_per_step(group, "matmul") / all : NAN;
}

double ProfileReport::activities_per_step() const {
  int64_t n = 0;
  for (const auto& entry : durations_) n += int64_t(entry.second.size());
  return double(n) / double(steps_);
}

Overhead overhead(const StepSamples& untraced, const StepSamples& traced) {
  const std::vector<double>& u = untraced.step;
  const double before = median(u), after = median(traced.step);
  const auto split = u.begin() + std::ptrdiff_t((u.size() + 1) / 2);  // as the mode runs them
  const double drift =
      u.size() < 2 ? std::nan("") : 100.0 * (median({split, u.end()}) / median({u.begin(), split}) - 1.0);
  return {before, after, 100.0 * (after / before - 1.0), drift};
}

// Below this share of a step with kernels running, the host's launches, not the device, set the
// pace (docs/results/profile.md: every configuration where tracing cost over 3% was below it).
constexpr double kBusyDevice = 0.9;

void ProfileReport::print(std::FILE* out, const std::string& title, int top, const StepSamples& events,
                          const StepSamples& untraced) const {
  const Profiler& p = *profiler_;
  const double steps = double(steps_);
  std::fprintf(out,
               "\n== %s: %s%s%s, %lld traced steps, %lld activities (%.1f per step), %lld dropped, %lld outside "
               "every phase\n",
               title.c_str(), p.method().c_str(), p.note().empty() ? "" : " - ", p.note().c_str(), (long long)steps_,
               (long long)p.activities(), activities_per_step(), (long long)p.dropped(), (long long)p.unattributed());

  if (p.traces_activities()) {
    for (const std::string& g : groups_) {
      const std::vector<KernelRow> all = rows(g);
      if (all.empty()) continue;
      TextTable t({"Time %", "Total (ms)", "Instances", "Per step", "Avg (us)", "Med (us)", "Min (us)", "Max (us)",
                   "StdDev (us)", "Category", "Name"});
      for (size_t k = 0; k < all.size() && int(k) < top; ++k) {
        const KernelRow& r = all[k];
        t.add_row({fmt(r.time_pct, 1), fmt(r.total_ns / 1e6, 3), std::to_string(r.instances),
                   fmt(double(r.instances) / steps, 1), fmt(r.avg_ns / 1e3, 3), fmt(r.med_ns / 1e3, 3),
                   fmt(r.min_ns / 1e3, 3), fmt(r.max_ns / 1e3, 3), fmt(r.stddev_ns / 1e3, 3), r.category,
                   short_name(r.name)});
      }
      print_table(out,
                  "-- " + g + ": the " + std::to_string(std::min<size_t>(all.size(), size_t(top))) + " of " +
                      std::to_string(all.size()) + " names with the most time (totals over the traced steps)",
                  t);
    }

    std::vector<std::string> header = {"Phase", "Total"};
    for (const char* c : kActivityCategories) header.push_back(c);
    header.push_back("Matmul %");
    TextTable cats(header);
    for (const std::string& g : groups_) {
      std::vector<std::string> row = {g, fmt(kernel_ms_per_step(g), 3)};
      for (const char* c : kActivityCategories) row.push_back(fmt(category_ms_per_step(g, c), 3));
      row.push_back(pct(matmul_pct(g)));
      cats.add_row(row);
    }
    print_table(out, "-- time by category (ms per step, activities' own time)", cats);

    TextTable att({"Phase", "Part", "Per step", "ms per step", "% of attention", "% of phase", "GFLOP", "TFLOP/s"});
    for (const std::string& g : groups_) {
      auto parts = attention_ns_.find(g);
      if (parts == attention_ns_.end()) continue;
      double total = 0;
      for (const auto& [part, ns] : parts->second) total += ns;
      for (const auto& [part, ns] : parts->second) {
        const double ms = ns / 1e6 / steps, flops = naive_attention_flops(g, part, case_, tp_);
        att.add_row({g, short_name(part), fmt(double(attention_count_.at(g).at(part)) / steps, 1), fmt(ms, 3),
                     pct(100.0 * ns / total), pct(100.0 * ms / kernel_ms_per_step(g)), fmt(flops / 1e9, 3),
                     ms > 0 ? fmt(flops / (ms * 1e-3) / 1e12, 2) : "-"});
      }
    }
    print_table(out,
                "-- attention (naive: its scores / softmax / value_matmul phases, FLOPs of all layers, softmax's an "
                "estimate; flash and CPU: the kernels or ops)",
                att);
  }

  // Per group: its range's device span per step against the event timing of the same steps.
  const std::map<std::string, const std::vector<double>*> timed = {{"step", &events.step},
                                                                   {"forward", &events.forward},
                                                                   {"backward", &events.backward},
                                                                   {"optimizer", &events.optimizer}};
  TextTable agree({"Phase", "Events", "Profiler span", "Kernel time", "Span / events"});
  for (const std::string& g : groups_) {
    auto path = group_path_.find(g);
    if (path == group_path_.end()) continue;
    double span_ns = 0;
    for (const PhaseRange& r : p.ranges())
      if (p.phases()[r.phase].path == path->second && r.device_start_ns >= 0)
        span_ns += double(r.device_end_ns - r.device_start_ns);
    auto t = timed.find(g);
    const double ev = t == timed.end() ? NAN : mean(*t->second), span = span_ns / 1e6 / steps;
    agree.add_row(
        {g, fmt(ev, 3), fmt(span, 3), p.traces_activities() ? fmt(kernel_ms_per_step(g), 3) : "-", fmt(span / ev, 3)});
  }
  print_table(out,
              "-- phases (ms per step): the profiler's device span and kernel time against event timing of the "
              "same steps",
              agree);

  std::vector<std::string> patterns;
  std::map<std::string, std::pair<int64_t, double>> by_pattern;  // ranges, device ns
  for (const PhaseRange& r : p.ranges()) {
    const std::string pattern = phase_pattern(p.phases()[r.phase].path);
    auto [it, added] = by_pattern.try_emplace(pattern, 0, 0.0);
    if (added) patterns.push_back(pattern);
    ++it->second.first;
    if (r.device_start_ns >= 0) it->second.second += double(r.device_end_ns - r.device_start_ns);
  }
  TextTable ph({"Phase", "Ranges per step", "ms per step"});
  for (const std::string& pattern : patterns)
    ph.add_row(
        {pattern, fmt(double(by_pattern[pattern].first) / steps, 1), fmt(by_pattern[pattern].second / 1e6 / steps, 3)});
  print_table(out, "-- phase ranges (device time per step, every layer pooled as 'layer *')", ph);

  const Overhead o = overhead(untraced, events);
  const double after = o.traced_ms;
  std::fprintf(out, "\n-- overhead: median %s ms per step untraced, %s ms traced (%s%s)\n",
               fmt(o.untraced_ms, 3).c_str(), fmt(after, 3).c_str(), o.pct >= 0 ? "+" : "", pct(o.pct).c_str());
  if (!std::isnan(o.drift_pct))
    std::fprintf(out, "-- drift: the untraced steps after the traced ones against those before: %s%s%s\n",
                 o.drift_pct >= 0 ? "+" : "", pct(o.drift_pct).c_str(),
                 o.resolved() ? ""
                              : ": the overhead is within what the step time moved by itself, so this run does "
                                "not resolve it (a busy or shared host; more --steps, or a quieter node)");
  // Whether the device or the launches set the pace: where kernels leave the device idle, the
  // launches do, and a tracer's per-kernel cost (on the host, or between a graph's nodes)
  // lands in the step.
  if (p.traces_activities() && after > 0) {
    const double kernels = kernel_ms_per_step("step"), busy = kernels / after;
    std::fprintf(out, "-- device busy: kernels ran %s of the %s ms of a traced step (%s)%s\n", fmt(kernels, 3).c_str(),
                 fmt(after, 3).c_str(), pct(100.0 * busy).c_str(),
                 busy < kBusyDevice ? ": launches set the pace here (the host's, or a CUDA graph's gaps between its "
                                      "kernels), so the profiler's cost per kernel shows in the step (the kernels' own "
                                      "times are not affected; a larger batch or context hides it)"
                                    : "");
  }
  std::fflush(out);
}

void record_profiler_tables(Record& rec, const Profiler& p) {
  std::vector<std::string> categories, paths;
  std::vector<int64_t> parents;
  std::vector<int64_t> kinds;
  for (size_t k = 0; k < p.names().size(); ++k) {
    categories.push_back(activity_category(p.names()[k], p.name_kinds()[k]));
    kinds.push_back(int64_t(p.name_kinds()[k]));
  }
  for (const PhaseInfo& ph : p.phases()) {
    paths.push_back(ph.path);
    parents.push_back(ph.parent);
  }
  std::vector<int64_t> phase, parent, step, host_start, host_end, device_start, device_end;
  for (const PhaseRange& r : p.ranges()) {
    phase.push_back(r.phase);
    parent.push_back(r.parent);
    step.push_back(r.step);
    host_start.push_back(r.host_start_ns);
    host_end.push_back(r.host_end_ns);
    device_start.push_back(r.device_start_ns);
    device_end.push_back(r.device_end_ns);
  }
  rec.add("names", std::vector<std::string>(p.names())).add("name_category", categories).add("name_kind", kinds);
  rec.add("phase_path", paths).add("phase_parent", parents);
  rec.add("range_phase", phase).add("range_parent", parent).add("range_step", step);
  rec.add("range_host_start_ns", host_start).add("range_host_end_ns", host_end);
  rec.add("range_device_start_ns", device_start).add("range_device_end_ns", device_end);
}

}  // namespace llmhpc

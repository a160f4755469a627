#include "src/modes/memory_trace.h"

#include <algorithm>
#include <unordered_map>

namespace llmhpc {

const std::vector<TagCategory>& memory_categories() {
  // Tags of src/model (transformer.cpp, adamw.cpp) and of the kernels (cublas., attention., rope.).
  static const std::vector<TagCategory> categories = {
      {"bf16 weights", {"params.bf16"}},
      {"parameters", {"params"}},
      {"gradients", {"grads"}},
      {"optimizer state", {"optimizer."}},
      {"saved activations",
       {"activations.layers.", "activations.resid_final", "activations.ln_final.", "activations.logits",
        "batch."}},  // batch.: tokens, targets, per-token losses
      {"temporaries", {"activations.", "gradients."}},
      {"workspaces", {"cublas.", "attention.", "rope."}}};
  return categories;
}

TraceSummary summarize_trace(const std::vector<LiveAllocation>& at_start, const std::vector<AllocEvent>& events,
                             const std::vector<PhaseMark>& marks, int64_t live_at_end, size_t top) {
  const std::vector<TagCategory>& categories = memory_categories();
  TraceSummary s;
  std::vector<std::pair<std::string, int64_t>> by_category;  // running live bytes per category
  for (const TagCategory& c : categories) by_category.push_back({c.name, 0});
  by_category.push_back({"other", 0});
  auto add = [&](const std::string& tag, int64_t delta) {
    by_category[category_index(tag, categories)].second += delta;
  };
  auto snapshot_peak = [&] {
    s.at_peak.bytes = by_category;
    s.at_peak.total = s.peak;
  };

  // Each tag once, as its latest allocation: every step takes its activations again.
  std::unordered_map<std::string, size_t> listed;  // tag -> its place in s.largest
  auto list = [&](int64_t bytes, const std::string& tag, const std::string& phase) {
    auto [it, fresh] = listed.emplace(tag, s.largest.size());
    if (fresh) s.largest.push_back({bytes, tag, tag_category(tag, categories), phase});
    else s.largest[it->second] = {bytes, tag, tag_category(tag, categories), phase};
  };
  for (const LiveAllocation& a : at_start) {
    s.live_at_start += a.bytes;
    add(a.tag, a.bytes);
    list(a.bytes, a.tag, "before the trace");
  }
  s.peak = s.live_at_start;
  s.peak_phase = marks.empty() ? "" : marks.front().name;
  s.peak_ms = marks.empty() ? 0.0 : marks.front().time_ms;
  snapshot_peak();
  for (const PhaseMark& m : marks) s.phases.push_back({m.name, m.live_bytes, m.live_bytes, m.live_bytes});

  int64_t live = s.live_at_start;
  for (const AllocEvent& e : events) {
    live += e.delta;
    add(e.tag, e.delta);
    s.balanced = s.balanced && live == e.live_after;
    if (e.delta >= 0 && !e.pages) list(e.delta, e.tag, e.phase);  // pages taken again are no new allocation
    for (PhaseMemory& p : s.phases)
      if (p.name == e.phase) p.peak = std::max(p.peak, live);
    if (live > s.peak || (live == s.peak && e.delta > 0)) {  // its last time: the traced step's, not a warm-up's
      s.peak = live;
      s.peak_ms = e.time_ms;
      s.peak_phase = e.phase;
      snapshot_peak();
    }
  }
  for (size_t k = 0; k < s.phases.size(); ++k)
    s.phases[k].live_at_end = k + 1 < s.phases.size() ? s.phases[k + 1].live_at_start : live_at_end;
  s.live_at_end = live_at_end;
  s.balanced = s.balanced && live == live_at_end;

  std::stable_sort(s.largest.begin(), s.largest.end(),
                   [](const TraceAllocation& a, const TraceAllocation& b) { return a.bytes > b.bytes; });
  if (s.largest.size() > top) s.largest.resize(top);
  return s;
}

}  // namespace llmhpc

// What the memory mode reads off an allocation trace (TracingAllocator events): memory per
// phase, the peak and what it is made of, the largest allocations. Pure functions of the
// trace, so the tests check them against the allocator itself.
#pragma once
#include <string>
#include <vector>

#include "src/core/allocator.h"

namespace llmhpc {

// The categories of the memory mode, finer than the model's (src/model/train_step.h): the
// bf16 weight copies apart from the fp32 parameters, what forward keeps for backward apart
// from temporaries, and the kernels' workspaces. In order; the first matching prefix wins.
const std::vector<TagCategory>& memory_categories();

// A phase begins: its name, when (the allocator's clock) and the live bytes then.
struct PhaseMark {
  std::string name;
  double time_ms;
  int64_t live_bytes;
};

struct PhaseMemory {
  std::string name;
  int64_t live_at_start = 0, peak = 0, live_at_end = 0;
};

struct TraceAllocation {
  int64_t bytes;
  std::string tag, category, phase;
};

struct TraceSummary {
  bool balanced = true;  // every event's live_after is the running sum from the live at the start
  int64_t live_at_start = 0, live_at_end = 0;
  int64_t peak = 0;    // the running maximum (at least the live at the start)
  double peak_ms = 0;  // when it was last reached
  std::string peak_phase;
  std::vector<PhaseMemory> phases;  // in the order of `marks`
  MemoryBreakdown at_peak;          // live bytes by memory_categories() at the peak
  // The largest allocations (live at the start or made), largest first; each tag once, as its
  // latest allocation (every step takes its activations again).
  std::vector<TraceAllocation> largest;
};

// `at_start`: live when the trace began; `marks`: the phases in order (each event belongs to
// the phase its label names); `top`: how many of the largest allocations to keep.
TraceSummary summarize_trace(const std::vector<LiveAllocation>& at_start, const std::vector<AllocEvent>& events,
                             const std::vector<PhaseMark>& marks, int64_t live_at_end, size_t top);

}  // namespace llmhpc

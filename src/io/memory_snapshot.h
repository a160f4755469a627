// The allocation trace of a run as the memory snapshot pytorch.org/memory_viz opens (the
// layout of torch.cuda.memory._snapshot(): `segments` with their `blocks` as they are at the
// end, and `device_traces` with one list of events per device). Each allocation is its own
// segment (the blocks the caching allocator reserved underneath are not traced): an
// allocation is `segment_alloc` + `alloc`, a free `free_requested` + `free_completed` +
// `segment_free`, each with addr, size, stream 0, time_us and frames naming the allocation:
// {filename: its category, line: 0, name: its tag} and {filename: "phase", line: 0, name: the
// phase}. Written with the opcodes of src/io/pickle.h.
#pragma once
#include <string>
#include <vector>

#include "src/core/allocator.h"
#include "src/io/pickle.h"

namespace llmhpc {

// `at_start`: what was live when the trace began (it has no alloc events); `events`: the
// trace; times are counted from `start_ms` (the events' clock).
PyObject memory_snapshot(const std::vector<LiveAllocation>& at_start, const std::vector<AllocEvent>& events,
                         const std::vector<TagCategory>& categories, double start_ms);

// Writes the pickle of `snapshot` to `path` whole: into a temporary file beside it, renamed
// into place. Throws UsageError naming the path when it cannot.
void write_snapshot_file(const std::string& path, const PyObject& snapshot);

}  // namespace llmhpc

// The Profiler interface (mode profile): what ran on the device during a window of steps,
// every kernel (CUDA) or op call (CPU) attributed to the phase it was launched in. Phases are
// the model's NvtxRanges (src/core/nvtx.h): while its window is open the profiler is their
// PhaseListener, so phases are written once and Nsight and this profiler see the same ones.
//
// kernels/backend.h's make_profiler picks one of three implementations:
//  - CUDA: CUPTI's activity API (kernels/cuda/cupti_profiler.cpp), libcupti opened at run time;
//  - CPU: every Ops call timed on the host (kernels/cpu/op_profiler.cpp), the op's name
//    standing in for a kernel's;
//  - without CUPTI (no libcupti, or --no-cupti): no activities, each phase timed with device
//    events (make_phase_event_profiler below).
// This file's .cpp is the bookkeeping they share: phases, ranges, names, and the delivery of
// activities to a sink. It is a library of its own (CMakeLists.txt, kernels_profiler), below
// both backends.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "src/core/nvtx.h"

namespace llmhpc {

enum class ActivityKind : int32_t { Kernel = 0, Memcpy = 1, Memset = 2, Op = 3 };

// The categories of the tables and plots, in their order.
inline constexpr const char* kActivityCategories[] = {"matmul",    "attention", "norm",          "elementwise",
                                                      "optimizer", "memcpy",    "communication", "other"};
// The category of an activity, from its kind and name: cuBLAS/cuBLASLt/CUTLASS kernels
// (gemm, xmma, nvjet, cutlass, split-K reductions) and the CPU's linear ops are "matmul",
// the softmax and flash kernels and the CPU's attention ops "attention", NCCL's kernels (a
// tensor-parallel group's collectives) "communication", and so on. The one
// classification: the mode writes it beside each name into the rank files, so the analysis
// scripts never classify again.
const char* activity_category(const std::string& name, ActivityKind kind);

// Which part of attention an activity is, or "" for none: the naive attention's phases
// ("scores", "softmax", "value_matmul", opened inside the op by the CUDA backend) name their
// kernels' part; inside flash attention's phases, and for activities of category attention
// elsewhere (the CPU's whole attention ops), the part is the kernel or op itself.
std::string attention_part(const std::string& leaf_phase, const std::string& name, ActivityKind kind);

// One kernel, copy or op call.
struct Activity {
  ActivityKind kind = ActivityKind::Kernel;
  int32_t name = -1;                 // index into Profiler::names()
  int64_t range = -1;                // index into Profiler::ranges(): the innermost phase open at
                                     // launch; -1 outside every phase
  int32_t phase = -1;                // that range's phase (Profiler::phases()), -1 outside
  int64_t step = -1;                 // that range's step (Profiler::set_step), -1 outside
  int64_t start_ns = 0, end_ns = 0;  // the profiler's clock
  int64_t stream = 0;                // CUDA: CUPTI's stream id; CPU ops: 0
  int64_t correlation = 0;           // CUDA: CUPTI's correlation id of the launch; CPU: call number in the window
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};  // kernels
  int64_t bytes = 0;                                  // memcpy, memset
};

// A phase: a range name at one place in the nesting ("layer 3" under "forward" is not
// "layer 3" under "backward").
struct PhaseInfo {
  std::string name;     // "scores"
  std::string path;     // the names from the outermost, joined by '/': "step/forward/layer 3/scores"
  int32_t parent = -1;  // -1 at the top
};

// One occurrence of a phase in the window: from its NvtxRange's construction to its destruction.
struct PhaseRange {
  int32_t phase = -1;
  int64_t parent = -1;  // the enclosing range, -1 at the top
  int64_t step = -1;    // Profiler::set_step's value when it opened
  // When the host opened and closed it (the profiler's clock).
  int64_t host_start_ns = 0, host_end_ns = -1;
  // When the device ran it: CUPTI, the first start to the last end of the activities launched
  // in it and the ranges inside it; CPU ops, its host times (ops run as they are called);
  // phase events, events recorded on the compute stream at its open and close. -1 when unknown
  // (a CUPTI range that launched nothing).
  int64_t device_start_ns = -1, device_end_ns = -1;
};

// Receives every activity of a window. Calls are serialised and may come from a thread of
// the tracer (CUPTI's); the profiler's tables (names(), phases(), ranges()) may be read
// inside the call, not outside the window.
class ActivitySink {
 public:
  virtual void on_activity(const Activity& activity) = 0;

 protected:
  ~ActivitySink() = default;
};

class Profiler : public PhaseListener {
 public:
  virtual ~Profiler();
  // "cupti", "host ops" or "phase events", and why this one ("" unless a fallback).
  virtual std::string method() const = 0;
  const std::string& note() const { return note_; }
  // False for phase events: the window has ranges but no activities.
  virtual bool traces_activities() const = 0;
  // The Ops a model must run on to be profiled: the backend's own, or (CPU) a decorator that
  // times each call. Outside a window the decorator only checks a flag.
  virtual Ops& ops() = 0;

  // Opens the window: ranges and activities start from empty (names and phases keep their
  // ids), the profiler listens to the phases, the tracer is enabled. Call outside any range.
  void start(ActivitySink& sink);
  // The step recorded with the ranges opened from now on.
  void set_step(int64_t step) { step_ = step; }
  // Closes the window: stops listening, waits for the device, hands every activity to the
  // sink and releases the tracer (CUPTI disabled and flushed). Ranges still open are closed.
  void stop();
  // --cuda-graph (GraphedStep, src/model/train_step.h): runs `record`, which records a device
  // graph, hearing its phases and (CUPTI) the phase each graph node was recorded in. In later
  // windows, an activity of a replay of that graph is attributed to a copy of its node's
  // recorded range, made under the range open when the replay was launched (whose step it
  // takes); the recording's outermost range, when it is the same phase as that range, is that
  // range itself. So a replayed step has the phases of an eager one. Outside any window and range.
  void record_graph(const std::function<void()>& record);
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // The profiler's clock now: activities' and ranges' times are on it.
  int64_t timestamp_ns() { return now_ns(); }

  // The tables: valid until the next start().
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<ActivityKind>& name_kinds() const { return name_kinds_; }  // the kind of each name's activities
  const std::vector<PhaseInfo>& phases() const { return phases_; }
  const std::vector<PhaseRange>& ranges() const { return ranges_; }
  int64_t activities() const { return activities_; }      // delivered in the last window
  int64_t unattributed() const { return unattributed_; }  // of those, outside every phase
  int64_t dropped() const { return dropped_; }            // lost by the tracer (CUPTI's dropped records)

  void phase_push(const char* name) final;
  void phase_pop() final;

 protected:
  enum class DeviceSpans { FromActivities, SameAsHost, SetByTracer };
  Profiler(DeviceSpans spans, std::string note = "") : spans_(spans), note_(std::move(note)) {}

  virtual void begin_window() = 0;  // enable the tracer
  // Around record_graph's work: hear the graph nodes created (CUPTI); nothing by default.
  virtual void begin_recording() {}
  virtual void end_recording() {}
  virtual void end_window() = 0;  // wait for the device, deliver() everything, disable the tracer
  virtual int64_t now_ns() = 0;   // the profiler's clock
  // The range just opened (after it is in ranges()) or about to close; on the listener's thread.
  virtual void range_opened(int64_t range) {}
  virtual void range_closed(int64_t range) {}

  // Hands `a` (its range set, -1 for none) to the sink, with its phase and step filled in;
  // extends the device spans of its range and their parents (DeviceSpans::FromActivities).
  // Thread-safe.
  void deliver(Activity a);
  // The same for an activity of a graph replay launched in range a.range, whose node was
  // recorded in range `recorded` of record_graph's ranges (-1: unknown, a.range kept).
  void deliver(Activity a, int64_t recorded);
  int32_t intern_name(const std::string& name, ActivityKind kind);  // thread-safe
  void add_dropped(int64_t n) { dropped_ += n; }
  // The innermost open range, -1 for none; during record_graph, an index into the
  // recording's ranges. On the listener's thread.
  int64_t current_range() const { return open_.empty() ? -1 : open_.back(); }
  // DeviceSpans::SetByTracer: from end_window().
  void set_device_span(int64_t range, int64_t start_ns, int64_t end_ns);

 private:
  const DeviceSpans spans_;
  const std::string note_;
  std::mutex mutex_;  // the tables and the sink
  std::atomic<bool> active_{false};
  ActivitySink* sink_ = nullptr;
  int64_t step_ = -1;
  std::vector<std::string> names_;
  std::vector<ActivityKind> name_kinds_;
  std::unordered_map<std::string, int32_t> name_ids_;
  std::vector<PhaseInfo> phases_;
  std::map<std::pair<int32_t, std::string>, int32_t> phase_ids_;  // (parent, name) -> phase
  std::vector<PhaseRange> ranges_;
  std::vector<int64_t> open_;         // the open ranges, innermost last
  bool recording_ = false;            // inside record_graph: no range hooks (nothing may time a capture)
  std::vector<PhaseRange> recorded_;  // record_graph's ranges
  std::map<std::pair<int64_t, int64_t>, int64_t> replayed_;  // (launch range, recorded range) -> copy in ranges_

  void deliver_locked(Activity a);
  int64_t replayed_range(int64_t launch, int64_t recorded);
  std::atomic<int64_t> activities_{0}, unattributed_{0}, dropped_{0};
};

// The fallback: no activities, each phase timed with marks of `device`'s timers (CUDA events
// on the compute stream; the host clock on the CPU). `note` says why it is used. For
// make_profiler (kernels/backend.h); modes get their profiler from there.
std::unique_ptr<Profiler> make_phase_event_profiler(Device& device, Ops& ops, std::string note);

}  // namespace llmhpc

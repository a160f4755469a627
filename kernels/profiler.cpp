// The bookkeeping every Profiler shares (kernels/profiler.h): phases and their ranges from the
// NvtxRanges it hears, activity names, the delivery of activities to the sink; the category
// of an activity; and the fallback that times phases with device events.
#include "kernels/profiler.h"

#include <algorithm>
#include <chrono>

namespace llmhpc {
namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

bool contains_any(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (contains(text, p)) return true;
  return false;
}

}  // namespace

// Names as they come: cuBLAS's (sm90_xmma_gemm_..., nvjet_tst_..., cutlass::Kernel2<...>,
// splitKreduce_kernel, cublasLt::... epilogue and reduction kernels), this project's CUDA kernels (kernels/cuda: attention_softmax_*,
// flash_*, rmsnorm_*, sum_partials_kernel is rmsnorm_backward's dw reduction, adamw_kernel,
// ...), CUB's sort (embedding_backward: other), and the CPU's op names (kernels/ops.h).
const char* activity_category(const std::string& name, ActivityKind kind) {
  if (kind == ActivityKind::Memcpy || kind == ActivityKind::Memset) return "memcpy";
  std::string n(name.size(), ' ');
  std::transform(name.begin(), name.end(), n.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (n.rfind("nccl", 0) == 0) return "communication";  // ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ...
  if (contains_any(n, {"gemm", "xmma", "nvjet", "cutlass", "cublas", "splitkreduce", "gemv", "linear_forward",
                       "linear_backward"}))
    return "matmul";
  if (contains_any(n, {"flash", "softmax", "attention"})) return "attention";
  if (contains_any(n, {"norm", "sum_partials"})) return "norm";
  if (contains_any(n, {"adamw"})) return "optimizer";
  if (contains_any(n,
                   {"elementwise", "swiglu", "rope", "convert", "scale", "embedding_forward", "cross_entropy", "iota"}))
    return "elementwise";
  return "other";
}

// The phases kernels/cuda/cuda_ops.cu opens inside naive attention; flash's and the CPU's
// attention ranges ("flash_attention", "flash_attention_backward", "attention") leave the
// part to the kernel's name.
std::string attention_part(const std::string& leaf_phase, const std::string& name, ActivityKind kind) {
  for (const char* part : {"scores", "softmax", "value_matmul"})
    if (leaf_phase == part) return part;
  if (leaf_phase.rfind("flash_attention", 0) == 0 || leaf_phase == "attention") return name;
  return std::string(activity_category(name, kind)) == "attention" ? name : "";
}

Profiler::~Profiler() {
  if (phase_listener() == this) set_phase_listener(nullptr);
}

void Profiler::start(ActivitySink& sink) {
  LLMHPC_CHECK(!active(), "Profiler::start: the window is already open");
  LLMHPC_CHECK(phase_listener() == nullptr, "Profiler::start: another phase listener is installed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sink_ = &sink;
    ranges_.clear();
    open_.clear();
    replayed_.clear();
    activities_ = 0;
    unattributed_ = 0;
    dropped_ = 0;
  }
  begin_window();
  active_ = true;
  set_phase_listener(this);
}

void Profiler::stop() {
  if (!active()) return;
  set_phase_listener(nullptr);
  while (!open_.empty()) phase_pop();  // ranges a failure left open (their NvtxRanges no longer reach us)
  end_window();
  active_ = false;
  std::lock_guard<std::mutex> lock(mutex_);
  sink_ = nullptr;
  for (const auto& [key, copy] : replayed_) {  // a replay's ranges were open on the host while its launch's was
    ranges_[copy].host_start_ns = ranges_[key.first].host_start_ns;
    ranges_[copy].host_end_ns = ranges_[key.first].host_end_ns;
  }
}

void Profiler::record_graph(const std::function<void()>& record) {
  LLMHPC_CHECK(!active(), "Profiler::record_graph: inside a window");
  LLMHPC_CHECK(phase_listener() == nullptr, "Profiler::record_graph: another phase listener is installed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.clear();
    open_.clear();
  }
  recording_ = true;
  begin_recording();
  set_phase_listener(this);
  struct Finish {  // on every way out, as a window's stop()
    Profiler& p;
    ~Finish() {
      set_phase_listener(nullptr);
      while (!p.open_.empty()) p.phase_pop();
      p.end_recording();
      p.recording_ = false;
      std::lock_guard<std::mutex> lock(p.mutex_);
      p.recorded_ = std::move(p.ranges_);
      p.ranges_.clear();
    }
  } finish{*this};
  record();
}

void Profiler::phase_push(const char* name) {
  const int64_t now = now_ns();
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t parent = current_range();
    const int32_t parent_phase = parent < 0 ? -1 : ranges_[parent].phase;
    auto [it, added] = phase_ids_.try_emplace({parent_phase, std::string(name)}, int32_t(phases_.size()));
    if (added)
      phases_.push_back(
          {name, parent_phase < 0 ? std::string(name) : phases_[parent_phase].path + "/" + name, parent_phase});
    PhaseRange r;
    r.phase = it->second;
    r.parent = parent;
    r.step = step_;
    r.host_start_ns = now;
    id = int64_t(ranges_.size());
    ranges_.push_back(r);
    open_.push_back(id);
  }
  if (!recording_) range_opened(id);
}

void Profiler::phase_pop() {
  if (open_.empty()) return;  // a range opened before the window
  const int64_t id = open_.back();
  if (!recording_) range_closed(id);
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  PhaseRange& r = ranges_[id];
  r.host_end_ns = now;
  if (spans_ == DeviceSpans::SameAsHost) {
    r.device_start_ns = r.host_start_ns;
    r.device_end_ns = now;
  }
  open_.pop_back();
}

void Profiler::deliver(Activity a) {
  std::lock_guard<std::mutex> lock(mutex_);
  deliver_locked(a);
}

void Profiler::deliver(Activity a, int64_t recorded) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (a.range >= 0 && a.range < int64_t(ranges_.size())) a.range = replayed_range(a.range, recorded);
  deliver_locked(a);
}

int64_t Profiler::replayed_range(int64_t launch, int64_t recorded) {
  if (recorded < 0 || recorded >= int64_t(recorded_.size())) return launch;
  if (auto it = replayed_.find({launch, recorded}); it != replayed_.end()) return it->second;
  const PhaseRange& r = recorded_[recorded];
  int64_t parent = launch;
  if (r.parent >= 0) parent = replayed_range(launch, r.parent);
  else if (r.phase == ranges_[launch].phase) return replayed_[{launch, recorded}] = launch;
  PhaseRange copy;
  copy.phase = r.phase;
  copy.parent = parent;
  copy.step = ranges_[launch].step;
  ranges_.push_back(copy);
  return replayed_[{launch, recorded}] = int64_t(ranges_.size()) - 1;
}

void Profiler::deliver_locked(Activity a) {
  if (a.range >= int64_t(ranges_.size())) a.range = -1;  // an id from an earlier window
  if (a.range >= 0) {
    const PhaseRange& r = ranges_[a.range];
    a.phase = r.phase;
    a.step = r.step;
  } else {
    a.phase = -1;
    a.step = -1;
    ++unattributed_;
  }
  if (spans_ == DeviceSpans::FromActivities)
    for (int64_t k = a.range; k >= 0; k = ranges_[k].parent) {
      PhaseRange& r = ranges_[k];
      r.device_start_ns = r.device_start_ns < 0 ? a.start_ns : std::min(r.device_start_ns, a.start_ns);
      r.device_end_ns = std::max(r.device_end_ns, a.end_ns);
    }
  ++activities_;
  if (sink_) sink_->on_activity(a);
}

int32_t Profiler::intern_name(const std::string& name, ActivityKind kind) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = name_ids_.try_emplace(name, int32_t(names_.size()));
  if (added) {
    names_.push_back(name);
    name_kinds_.push_back(kind);
  }
  return it->second;
}

void Profiler::set_device_span(int64_t range, int64_t start_ns, int64_t end_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  ranges_[range].device_start_ns = start_ns;
  ranges_[range].device_end_ns = end_ns;
}

namespace {

// Two marks per range, on timers of kMarksPerTimer marks made as needed and kept for the next
// window (making one creates its events): mark 0 of the first is the window's start, range r
// opens at mark 1 + 2r and closes at 2 + 2r. The marks are read once, at the end of the window.
class PhaseEventProfiler final : public Profiler {
 public:
  PhaseEventProfiler(Device& device, Ops& ops, std::string note)
      : Profiler(DeviceSpans::SetByTracer, std::move(note)), device_(device), ops_(ops) {}
  std::string method() const override { return "phase events"; }
  bool traces_activities() const override { return false; }
  Ops& ops() override { return ops_; }

 protected:
  void begin_window() override {
    window_start_ns_ = now_ns();
    mark(0);
  }
  void end_window() override {
    for (int64_t r = 0; r < int64_t(ranges().size()); ++r) {
      const double open_ms = elapsed_ms(1 + 2 * r), close_ms = elapsed_ms(2 + 2 * r);
      set_device_span(r, window_start_ns_ + int64_t(open_ms * 1e6), window_start_ns_ + int64_t(close_ms * 1e6));
    }
  }
  int64_t now_ns() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void range_opened(int64_t range) override { mark(1 + 2 * range); }
  void range_closed(int64_t range) override { mark(2 + 2 * range); }

 private:
  static constexpr int64_t kMarksPerTimer = 4096;
  void mark(int64_t index) {
    while (int64_t(timers_.size()) <= index / kMarksPerTimer)
      timers_.push_back(device_.make_timer(int(kMarksPerTimer)));
    timers_[index / kMarksPerTimer]->mark(int(index % kMarksPerTimer));
  }
  // From the window's start to mark `index` (waits for it).
  double elapsed_ms(int64_t index) {
    return timers_[index / kMarksPerTimer]->elapsed_ms(*timers_[0], 0, int(index % kMarksPerTimer));
  }

  Device& device_;
  Ops& ops_;
  std::vector<std::unique_ptr<Timer>> timers_;
  int64_t window_start_ns_ = 0;
};

}  // namespace

std::unique_ptr<Profiler> make_phase_event_profiler(Device& device, Ops& ops, std::string note) {
  return std::make_unique<PhaseEventProfiler>(device, ops, std::move(note));
}

}  // namespace llmhpc

// NVTX ranges for Nsight and CUPTI, and the phases of llmhpc's own profiler. With the CUDA
// toolkit they are nvtx3 (header-only, near-free when no tool listens); without it they
// compile to nothing for NVTX.
//
// A range is also a phase: while a PhaseListener is installed (the profiler's window, mode
// profile), it hears every range open and close, so phases are written once, in the model,
// and both Nsight and llmhpc's profiler see the same ones. Without a listener a range costs
// one atomic load and a branch more than NVTX alone.
#pragma once
#if defined(LLMHPC_WITH_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif
#include <atomic>
#include <string>

namespace llmhpc {

// Hears the ranges of the thread that installed it (the model's thread: ranges are opened and
// closed there only). Ranges nest: every phase_pop closes the latest open phase_push.
class PhaseListener {
 public:
  virtual void phase_push(const char* name) = 0;
  virtual void phase_pop() = 0;

 protected:
  ~PhaseListener() = default;
};

namespace detail {
inline std::atomic<PhaseListener*> g_phase_listener{nullptr};
}  // namespace detail

// Installs `listener` (nullptr removes it). At most one at a time; install and remove it
// outside any range, so that it hears whole ranges.
inline void set_phase_listener(PhaseListener* listener) {
  detail::g_phase_listener.store(listener, std::memory_order_release);
}
inline PhaseListener* phase_listener() { return detail::g_phase_listener.load(std::memory_order_acquire); }

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if defined(LLMHPC_WITH_CUDA)
    nvtxRangePushA(name);
#endif
    listener_ = phase_listener();
    if (listener_) listener_->phase_push(name);
  }
  explicit NvtxRange(const std::string& name) : NvtxRange(name.c_str()) {}
  ~NvtxRange() {
    // Only the listener that heard the push hears the pop, and only while it is installed: a
    // range opened before it or closed after it was removed is not a phase it knows.
    if (listener_ && listener_ == phase_listener()) listener_->phase_pop();
#if defined(LLMHPC_WITH_CUDA)
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  PhaseListener* listener_;
};

}  // namespace llmhpc

#include "src/core/cuda/event_timer.h"

#include <string>
#include <vector>

#include "src/core/cuda/check.h"

namespace llmhpc {
namespace {

class EventTimer final : public Timer {
 public:
  EventTimer(cudaStream_t stream, int n) : stream_(stream), events_(size_t(n)) {
    CUDA_CHECK(cudaGetDevice(&device_));
    for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void mark(int index) override { CUDA_CHECK(cudaEventRecord(event(index), stream_)); }
  int marks() const override { return int(events_.size()); }
  double elapsed_ms(const Timer& origin, int from, int to) override {
    const cudaEvent_t start = timer_event(origin, from);
    LLMHPC_CHECK(dynamic_cast<const EventTimer&>(origin).device_ == device_,
                 "a GPU timer compared with a timer on another GPU");
    CUDA_CHECK(cudaEventSynchronize(start));  // on another stream it may still be ahead
    CUDA_CHECK(cudaEventSynchronize(event(to)));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, event(to)));
    return ms;
  }

  static cudaEvent_t timer_event(const Timer& timer, int index) {
    const EventTimer* t = dynamic_cast<const EventTimer*>(&timer);
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    LLMHPC_CHECK(t != nullptr && t->device_ == device, "a GPU timer compared with a timer on another clock");
    return t->event(index);
  }

 private:
  cudaEvent_t event(int index) const {
    LLMHPC_CHECK(index >= 0 && index < marks(), "timer mark " + std::to_string(index) + " out of range");
    return events_[size_t(index)];
  }

  cudaStream_t stream_;
  int device_ = 0;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

std::unique_ptr<Timer> make_event_timer(cudaStream_t stream, int num_marks) {
  return std::make_unique<EventTimer>(stream, num_marks);
}

cudaEvent_t timer_event(const Timer& timer, int index) { return EventTimer::timer_event(timer, index); }

}  // namespace llmhpc

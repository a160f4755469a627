// One timer interface for compute and communication: marks recorded in the order of a
// stream, and the time between any two of them.
//
// A Timer holds a fixed number of marks. mark(i) records point i in the order of the
// timer's stream: on a GPU, a CUDA event recorded on a cudaStream_t (src/core/cuda/
// event_timer.h), so it costs the host nothing and measures when the device got there; on
// the host, the steady clock when mark() is called. elapsed_ms() waits for the two marks it
// reads and nothing else, so a loop can mark every iteration and read the times once at its end.
//
// Timers on one clock can be compared: the compute stream's timer and the communicator's
// (both CUDA events of one GPU, or both host clocks) share a time axis, so the time from a
// mark on one to a mark on the other is defined. That is what measuring how much of the
// communication the backward pass hides needs.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

namespace llmhpc {

class Timer {
 public:
  virtual ~Timer() = default;
  // Records mark `index` (0 <= index < marks()) in the order of this timer's stream.
  virtual void mark(int index) = 0;
  virtual int marks() const = 0;
  // Milliseconds from mark `from` of `origin` to mark `to` of this timer; waits until both
  // marks were reached. `origin` must be on the same clock (checked): this timer, or one made
  // for another stream of the same device.
  virtual double elapsed_ms(const Timer& origin, int from, int to) = 0;
  // From mark `from` to mark `to` of this timer.
  double elapsed_ms(int from, int to) { return elapsed_ms(*this, from, to); }
};

// The host's steady clock: every HostTimer shares it.
class HostTimer final : public Timer {
 public:
  explicit HostTimer(int num_marks) : marks_(size_t(num_marks)) {}
  void mark(int index) override;
  int marks() const override { return int(marks_.size()); }
  double elapsed_ms(const Timer& origin, int from, int to) override;

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

inline std::unique_ptr<Timer> make_host_timer(int num_marks) { return std::make_unique<HostTimer>(num_marks); }

}  // namespace llmhpc

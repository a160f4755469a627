// What a data-parallel step's collectives did on their communicator's stream (modes ddp and
// train): their device time per step (comm_busy_ms) and the last steps' timeline (timeline_*:
// the compute stream's phases beside every data-parallel and tensor-parallel collective's span,
// what Nsight Systems draws for the streams; analysis/timeline.py reads it).
//
// The steps alternate between two step timers, and a step's collectives are taken during the
// next step, once that one is enqueued and the host would only wait for the device (run_step's
// while_device_runs): by then the host may wait for them, since the next forward, which a
// sharded optimizer's last all-gathers overlap, is already on the device; and the step's timer
// still holds its marks, so each span is placed on its clock. Taken between two steps, they
// hold the next forward back while the host waits for a sharded step's last all-gathers and
// reads the spans (xl zero1 on the copy engines, 2 H200: 2.4 ms a step). The events cost
// nothing measurable (one H200, xl bf16 bucketed: 219.5 ms a step timed, 219.6-219.9 untimed).
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "src/io/recorder.h"
#include "src/model/train_step.h"

namespace llmhpc {

// The latest kSteps steps' spans, in ms from the first of them: a record's timeline_* datasets.
class StepTimeline {
 public:
  static constexpr int64_t kSteps = 4;  // a few steps: enough to see one repeat, small beside the step times

  // Step `s` began `start_ms` after the first step; its phases, from its times (the step's marks
  // follow one another: run_step). `micro_batches` above 1: forward and backward as one phase.
  void add_step(int64_t s, double start_ms, const StepTimes& t, int micro_batches = 1);
  // An operation of step `s`, in ms after the first step began.
  void add(int64_t s, const char* stream, std::string name, uint64_t bytes, double start_ms, double end_ms);
  // The timeline_* datasets into `r` (nothing without steps).
  void record(Record& r);

 private:
  struct Row {
    int64_t step;
    const char* stream;
    std::string name;
    int64_t bytes;
    double start_ms, end_ms;
  };
  void drop_older();
  std::vector<Row> rows_;
  std::vector<std::pair<int64_t, double>> starts_;  // the steps' starts
  int64_t latest_ = 0;
  size_t kept_ = 1024;  // rows once the older steps are dropped: compaction happens at twice that
};

// The device time of the data-parallel collectives of each step (Communicator::take_busy_spans):
// the group's and, under hybrid sharding, the replicas'; their spans on `timeline` where the
// backend measures them (nccl). Times the communicators' operations while it lives.
class DataParallelBusy {
 public:
  DataParallelBusy(Communicator& comm, Communicator* replicas, StepTimeline& timeline, int micro_batches = 1);
  ~DataParallelBusy();
  DataParallelBusy(const DataParallelBusy&) = delete;
  DataParallelBusy& operator=(const DataParallelBusy&) = delete;
  bool measured() const { return measured_; }
  // Before a step runs on `timer`: takes the step that last ran on it, if settle_previous()
  // has not.
  void step_begins(Timer& timer);
  // Takes the steps before the current one: call once the current step is enqueued
  // (run_step's while_device_runs).
  void settle_previous();
  // Its times, and the tensor-parallel group's collectives in it (from its timer's mark 0). What
  // the communicators run after this and before the next step (a checkpoint's gathers) belongs to
  // no step: neither counted nor drawn.
  void step_ended(const StepTimes& t, std::vector<OperationSpan> tensor_parallel = {});
  // Every step's device time, once the last steps' operations are complete
  // (Communicator::synchronize).
  const std::vector<double>& finish();

 private:
  struct Step {
    std::vector<uint64_t> marks;  // the communicators' busy marks when it began
    Timer* timer;                 // holding its marks until the step after next begins
    std::vector<uint64_t> end;    // the busy marks when it ended: what follows is outside the steps
    StepTimes times;
    std::vector<OperationSpan> tensor_parallel;
  };
  std::vector<uint64_t> marks() const;
  // The oldest step's operations (those issued before `next`), placed on the timeline from its
  // start; the next step's start from its.
  void settle_oldest(const std::vector<uint64_t>& next);

  StepTimeline& timeline_;
  const int micro_batches_;
  std::vector<Communicator*> comms_;
  std::deque<Step> steps_;  // begun, not taken yet: at most two
  std::vector<double> per_step_;
  double start_ms_ = 0;  // the oldest step's start, from the first step's
  bool measured_ = false;
};

}  // namespace llmhpc

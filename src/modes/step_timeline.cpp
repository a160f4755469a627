#include "src/modes/step_timeline.h"

#include <algorithm>
#include <cmath>

namespace llmhpc {

void StepTimeline::add_step(int64_t s, double start_ms, const StepTimes& t, int micro_batches) {
  starts_.emplace_back(s, start_ms);
  const bool merged = micro_batches > 1;  // the micro-batches' forwards and backwards alternate
  double at = start_ms;
  for (const auto& [name, ms] :
       {std::pair{merged ? "forward and backward" : "forward", merged ? t.forward_ms + t.backward_ms : t.forward_ms},
        {"backward", merged ? NAN : t.backward_ms},
        {"gradient wait", t.sync_ms},
        {"optimizer", t.optimizer_ms},
        {"parameter wait", t.param_sync_ms}})
    if (std::isfinite(ms)) add(s, "compute", name, 0, at, at + ms), at += ms;
}

void StepTimeline::add(int64_t s, const char* stream, std::string name, uint64_t bytes, double start_ms,
                       double end_ms) {
  rows_.push_back({s, stream, std::move(name), int64_t(bytes), start_ms, end_ms});
  latest_ = std::max(latest_, s);
  if (rows_.size() >= 2 * kept_) drop_older();  // bounded over a long run
}

void StepTimeline::record(Record& r) {
  drop_older();
  if (rows_.empty()) return;
  const double origin = starts_.empty() ? 0 : starts_.front().second;  // the steps in order
  std::vector<int64_t> step, bytes;
  std::vector<std::string> stream, name;
  std::vector<double> start, end;
  for (Row& row : rows_) {
    step.push_back(row.step), stream.emplace_back(row.stream), name.push_back(row.name);
    bytes.push_back(row.bytes), start.push_back(row.start_ms - origin), end.push_back(row.end_ms - origin);
  }
  r.add("timeline_step", step)
      .add("timeline_stream", stream)
      .add("timeline_name", name)
      .add("timeline_bytes", bytes)
      .add("timeline_start_ms", start)
      .add("timeline_end_ms", end);
}

void StepTimeline::drop_older() {
  const int64_t first = latest_ - kSteps + 1;
  rows_.erase(std::remove_if(rows_.begin(), rows_.end(), [&](const Row& r) { return r.step < first; }), rows_.end());
  starts_.erase(std::remove_if(starts_.begin(), starts_.end(), [&](const auto& p) { return p.first < first; }),
                starts_.end());
  kept_ = std::max<size_t>(kept_, rows_.size());
}

DataParallelBusy::DataParallelBusy(Communicator& comm, Communicator* replicas, StepTimeline& timeline,
                                   int micro_batches)
    : timeline_(timeline), micro_batches_(micro_batches) {
  for (Communicator* c : {&comm, replicas})
    if (c) comms_.push_back(c), c->time_operations(true);
  measured_ = comm.busy_measured();  // false where the backend does not measure it
}

DataParallelBusy::~DataParallelBusy() {
  for (Communicator* c : comms_) c->time_operations(false);
}

void DataParallelBusy::step_begins(Timer& timer) {
  if (steps_.size() == 2) settle_oldest(steps_[1].marks);
  steps_.push_back({marks(), &timer, {}, {}, {}});
}

void DataParallelBusy::settle_previous() {
  while (steps_.size() > 1) settle_oldest(steps_[1].marks);
}

void DataParallelBusy::step_ended(const StepTimes& t, std::vector<OperationSpan> tensor_parallel) {
  steps_.back().times = t;
  steps_.back().tensor_parallel = std::move(tensor_parallel);
  steps_.back().end = marks();
}

const std::vector<double>& DataParallelBusy::finish() {
  for (Communicator* c : comms_) c->synchronize();
  while (!steps_.empty()) settle_oldest(steps_.size() > 1 ? steps_[1].marks : marks());
  return per_step_;
}

std::vector<uint64_t> DataParallelBusy::marks() const {
  std::vector<uint64_t> m;
  for (const Communicator* c : comms_) m.push_back(c->busy_mark());
  return m;
}

void DataParallelBusy::settle_oldest(const std::vector<uint64_t>& next) {
  const Step& oldest = steps_.front();
  const int64_t step = int64_t(per_step_.size());
  const double start = start_ms_;
  if (measured_) {
    timeline_.add_step(step, start, oldest.times, micro_batches_);
    for (const OperationSpan& s : oldest.tensor_parallel)
      timeline_.add(step, "tensor parallel", s.name, s.bytes, start + s.start_ms, start + s.end_ms);
  }
  double ms = 0;
  for (size_t i = 0; i < comms_.size(); ++i) {
    for (OperationSpan& s : comms_[i]->take_busy_spans(oldest.end.empty() ? next[i] : oldest.end[i], oldest.timer, 0)) {
      ms += s.end_ms - s.start_ms;
      timeline_.add(step, i == 0 ? "communication" : "replicas", std::move(s.name), s.bytes, start + s.start_ms,
                    start + s.end_ms);
    }
    comms_[i]->take_busy_spans(next[i]);  // between this step's end and the next's start: no step's
  }
  per_step_.push_back(ms);
  if (steps_.size() > 1 && measured_) start_ms_ += steps_[1].timer->elapsed_ms(*oldest.timer, 0, 0);
  steps_.pop_front();
}

}  // namespace llmhpc

// Collectives timed alone and beside the model's step (src/modes/collectives_beside_step.h).
#include "src/modes/collectives_beside_step.h"

#include <algorithm>

#include "src/core/stats.h"

namespace llmhpc {
namespace {

// Issues the collectives when backward reports its first final gradients, as a data-parallel
// strategy issues its first bucket: each waits for the compute enqueued before it, so they run
// beside the rest of backward, where the gradients' collectives run.
class IssueWithBackward final : public ParallelHooks {
 public:
  explicit IssueWithBackward(std::function<void()> issue) : issue_(std::move(issue)) {}
  void gradients_final(int64_t, int64_t) override {
    if (!issue_) return;
    const std::function<void()> issue = std::move(issue_);
    issue_ = nullptr;
    issue();
  }

 private:
  std::function<void()> issue_;
};

}  // namespace

const std::vector<Collective>& collectives_beside_step() {
  static const std::vector<Collective> kinds = {Collective::AllReduce, Collective::ReduceScatter,
                                                Collective::AllGather};
  return kinds;
}

std::vector<CollectiveBesideStep> time_collectives_beside_step(const Runtime& rt, Communicator& comm, Allocator& alloc,
                                                               DType dtype, const std::vector<uint64_t>& sizes,
                                                               double step_ms, Timer& timer,
                                                               const std::function<double(ParallelHooks*)>& step) {
  std::vector<CollectiveBesideStep> out;
  comm.time_operations(true);
  for (Collective c : collectives_beside_step())
    for (uint64_t requested : sizes) {
      const CollectiveShape shape = collective_shape(c, requested, dtype, comm.size());
      const Buffer send(alloc, dtype, Shape{int64_t(shape.total_elements)}, "comm.send");
      const Buffer recv(alloc, dtype, Shape{int64_t(shape.total_elements)}, "comm.recv");
      Operation op;
      op.collective = c;
      op.count = shape.count;
      op.dtype = dtype;
      const Call call = make_call(op, comm.rank(), send.tensor().data, recv.tensor().data);
      CollectiveBesideStep r;
      r.collective = c;
      r.bytes = shape.bytes;
      comm.barrier();
      for (int k = 0; k < kAloneOps; ++k) issue(comm, call, /*blocking=*/false);
      std::vector<double> alone;
      const std::vector<OperationSpan> alone_spans = comm.take_busy_spans(comm.busy_mark());
      for (size_t k = kWarmOps; k < alone_spans.size(); ++k)
        alone.push_back(alone_spans[k].end_ms - alone_spans[k].start_ms);
      r.alone_us = alone.empty() ? NAN : median(alone) * 1e3;
      const double slowest_alone_ms = rt.reduce_all(alone.empty() ? 0.0 : median(alone), HostReduce::Max);
      r.issued = slowest_alone_ms > 0 ? std::clamp(int64_t(std::llround(kShareOfStep * step_ms / slowest_alone_ms)),
                                                   int64_t(4), kMaxBeside)
                                      : 4;
      comm.barrier();
      IssueWithBackward hooks([&] {
        for (int64_t k = 0; k < r.issued; ++k) issue(comm, call, /*blocking=*/false);
      });
      const double took = step(&hooks);
      std::vector<double> beside;
      for (const OperationSpan& s : comm.take_busy_spans(comm.busy_mark(), &timer, 0))
        if (s.start_ms >= 0 && s.end_ms <= took) beside.push_back(s.end_ms - s.start_ms);
      r.within = int64_t(beside.size());
      r.beside_us = beside.empty() ? NAN : median(beside) * 1e3;
      out.push_back(r);
    }
  comm.time_operations(false);
  return out;
}

}  // namespace llmhpc

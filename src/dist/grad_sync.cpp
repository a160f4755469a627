#include "src/dist/grad_sync.h"

#include "src/core/check.h"
#include "src/core/units.h"
#include "src/dist/reducer.h"
#include "src/model/params.h"

namespace llmhpc {

const std::vector<SyncStrategy>& all_sync_strategies() {
  static const std::vector<SyncStrategy> all = {SyncStrategy::None, SyncStrategy::Naive, SyncStrategy::Flat,
                                                SyncStrategy::Overlap, SyncStrategy::Bucketed};
  return all;
}

const char* sync_strategy_name(SyncStrategy s) {
  switch (s) {
    case SyncStrategy::None: return "none";
    case SyncStrategy::Naive: return "naive";
    case SyncStrategy::Flat: return "flat";
    case SyncStrategy::Overlap: return "overlap";
    case SyncStrategy::Bucketed: return "bucketed";
  }
  LLMHPC_FATAL("unknown SyncStrategy");
}

SyncStrategy parse_sync_strategy(const std::string& text) {
  std::vector<std::string> names;
  for (SyncStrategy s : all_sync_strategies()) {
    if (text == sync_strategy_name(s)) return s;
    names.push_back(sync_strategy_name(s));
  }
  require_choice(text, names, "ddp");  // throws: text is none of them
  LLMHPC_FATAL("unreachable");
}

// Each strategy is a plan (which ranges one collective covers) and a time to issue them.
std::unique_ptr<GradientSync> make_gradient_sync(SyncStrategy strategy, Communicator& comm, Tensor flat_grads,
                                                 std::vector<ParamSpan> params, double bucket_mb) {
  for (const ParamSpan& p : params)
    LLMHPC_CHECK(p.end <= flat_grads.numel(), "parameter " + p.name + " lies beyond the gradient buffer");
  switch (strategy) {
    case SyncStrategy::None:
      return make_reducer(strategy, comm, flat_grads, {}, IssueTime::AfterBackward);
    case SyncStrategy::Naive:
      return make_reducer(strategy, comm, flat_grads, plan_per_tensor(params), IssueTime::AfterBackward);
    case SyncStrategy::Flat:
      return make_reducer(strategy, comm, flat_grads, plan_flat(params), IssueTime::AfterBackward);
    case SyncStrategy::Overlap:
      return make_reducer(strategy, comm, flat_grads, plan_per_tensor(params), IssueTime::WhenReady);
    case SyncStrategy::Bucketed:
      return make_reducer(strategy, comm, flat_grads, plan_buckets(params, dtype_size(flat_grads.dtype), bucket_mb),
                          IssueTime::WhenReady);
  }
  LLMHPC_FATAL("unknown SyncStrategy");
}

std::vector<ParamSpan> param_spans(const ParameterLayout& layout) {
  std::vector<ParamSpan> spans;
  for (const ParamInfo& p : layout.params()) spans.push_back({p.name, p.offset, p.offset + p.shape.numel(), true});
  return spans;
}

void broadcast_parameters(Communicator& comm, Tensor flat_params) {
  comm.broadcast(flat_params.data, flat_params.data, size_t(flat_params.numel()), flat_params.dtype, /*root=*/0);
}

}  // namespace llmhpc

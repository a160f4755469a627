#include "comm/collectives.h"

#include "src/core/check.h"
#include "src/core/units.h"

namespace llmhpc {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllGather: return "allgather";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> all = {Collective::AllReduce, Collective::ReduceScatter,
                                              Collective::AllGather, Collective::Broadcast};
  return all;
}

Collective parse_collective(const std::string& name, const std::string& option) {
  std::vector<std::string> names;
  for (Collective c : all_collectives()) {
    if (name == collective_name(c)) return c;
    names.push_back(collective_name(c));
  }
  throw UsageError("--" + option + " '" + name + "': must be one of " + join(names, ", "));
}

bool is_reduction(Collective c) { return c == Collective::AllReduce || c == Collective::ReduceScatter; }

CollectiveShape collective_shape(Collective c, size_t requested_bytes, DType dtype, int nranks) {
  const size_t elements = requested_bytes / dtype_size(dtype);
  CollectiveShape s;
  if (c == Collective::ReduceScatter || c == Collective::AllGather) {
    s.count = elements / size_t(nranks);  // equal chunks: round down, as nccl-tests does
    s.total_elements = s.count * size_t(nranks);
  } else {
    s.count = elements;
    s.total_elements = elements;
  }
  s.bytes = s.total_elements * dtype_size(dtype);
  return s;
}

double bus_factor(Collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather: return (n - 1) / n;
    case Collective::Broadcast: return 1.0;
  }
  return 1.0;
}

}  // namespace llmhpc

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
  static const std::vector<Collective> all = {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                                              Collective::Broadcast};
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

const char* placement_name(Placement p) { return p == Placement::OutOfPlace ? "outofplace" : "inplace"; }

size_t largest_buffer_elements(Collective c, size_t count, int nranks) {
  return c == Collective::ReduceScatter || c == Collective::AllGather ? count * size_t(nranks) : count;
}

Call make_call(const Operation& op, int rank, void* send, void* recv) {
  char* base = static_cast<char*>(recv);
  char* chunk = base + op.count * dtype_size(op.dtype) * size_t(rank);
  Call call{op.collective, send, recv, op.count, op.dtype, op.op, op.root};
  if (op.placement == Placement::InPlace) {
    if (op.collective == Collective::ReduceScatter) {
      call.send = base;
      call.recv = chunk;
    } else if (op.collective == Collective::AllGather) {
      call.send = chunk;
    } else {
      call.send = recv;
    }
  }
  return call;
}

CommHandle issue(Communicator& comm, const Call& c, bool blocking) {
  switch (c.collective) {
    case Collective::AllReduce:
      if (!blocking) return comm.all_reduce_async(c.send, c.recv, c.count, c.dtype, c.op);
      comm.all_reduce(c.send, c.recv, c.count, c.dtype, c.op);
      return {};
    case Collective::ReduceScatter:
      if (!blocking) return comm.reduce_scatter_async(c.send, c.recv, c.count, c.dtype, c.op);
      comm.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op);
      return {};
    case Collective::AllGather:
      if (!blocking) return comm.all_gather_async(c.send, c.recv, c.count, c.dtype);
      comm.all_gather(c.send, c.recv, c.count, c.dtype);
      return {};
    case Collective::Broadcast:
      if (!blocking) return comm.broadcast_async(c.send, c.recv, c.count, c.dtype, c.root);
      comm.broadcast(c.send, c.recv, c.count, c.dtype, c.root);
      return {};
  }
  return {};
}

CollectiveShape collective_shape(Collective c, size_t requested_bytes, DType dtype, int nranks) {
  const size_t elements = requested_bytes / dtype_size(dtype);
  CollectiveShape s;
  // The largest buffer holds `elements` (reduce-scatter and all-gather: equal chunks, rounded
  // down as nccl-tests does).
  s.count = elements / largest_buffer_elements(c, 1, nranks);
  s.total_elements = largest_buffer_elements(c, s.count, nranks);
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

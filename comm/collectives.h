// The four collectives as the comm benchmark calls and measures them: names, one call in the
// layouts of comm/communicator.h, how a message size becomes element counts, and nccl-tests'
// bandwidth definitions (doc/PERFORMANCE.md there).
//
// The size S a user asks for is the size of the largest buffer of the operation: the
// all-reduce and broadcast buffer, the reduce-scatter input, the all-gather output.
// Sizes are rounded down to whole elements, and for reduce-scatter and all-gather to a
// multiple of the rank count (equal chunks), exactly as nccl-tests does: S = 1000 B of
// float on 3 ranks moves 83 elements per rank, 996 B in all.
//
//   algbw = bytes / time                        (bytes: the rounded S)
//   busbw = algbw * factor, factor: all-reduce 2(n-1)/n, reduce-scatter and all-gather
//           (n-1)/n, broadcast 1.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/core/dtype.h"

namespace llmhpc {

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast };

const char* collective_name(Collective c);  // "allreduce", "reducescatter", ...
// Throws UsageError naming `option` for an unknown name.
Collective parse_collective(const std::string& name, const std::string& option);
const std::vector<Collective>& all_collectives();
bool is_reduction(Collective c);

enum class Placement { OutOfPlace, InPlace };
const char* placement_name(Placement p);  // "outofplace", "inplace"

// One collective call without its buffers: what make_call lays out and comm/verifiable.h
// makes inputs for. Counts are the communicator's, so any count fits (the benchmark's come
// from collective_shape, the tests pass their own).
struct Operation {
  Collective collective = Collective::AllReduce;
  size_t count = 0;  // per rank for reduce-scatter and all-gather (comm/communicator.h)
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;  // all-reduce and reduce-scatter
  int root = 0;                 // broadcast
  Placement placement = Placement::OutOfPlace;
};

// Elements of the largest buffer of a call: count * nranks for the reduce-scatter input and
// the all-gather output, count otherwise. make_call wants send and recv of this size.
size_t largest_buffer_elements(Collective c, size_t count, int nranks);

// An operation with its buffers, as the communicator takes it.
struct Call {
  Collective collective;
  const void* send;
  void* recv;
  size_t count;
  DType dtype;
  ReduceOp op;
  int root;
};

// The call in the layout of comm/communicator.h for the operation's placement, on two
// buffers of largest_buffer_elements each. In place everything lives in `recv` (`send` is
// not used): reduce-scatter's result lands in this rank's chunk of it, all-gather's input
// is read from there.
Call make_call(const Operation& op, int rank, void* send, void* recv);

// The call through the communicator's blocking form, or its async form (the handle returned).
CommHandle issue(Communicator& comm, const Call& call, bool blocking);

struct CollectiveShape {
  size_t count = 0;           // the count passed to the call (per rank for reduce-scatter/all-gather)
  size_t total_elements = 0;  // elements of the largest buffer
  size_t bytes = 0;           // total_elements * element size: what algbw counts
};

CollectiveShape collective_shape(Collective c, size_t requested_bytes, DType dtype, int nranks);

double bus_factor(Collective c, int nranks);

// GB/s (1e9 bytes per second), as nccl-tests reports them.
inline double algbw_gbs(size_t bytes, double time_us) { return double(bytes) / (time_us * 1e3); }

}  // namespace llmhpc

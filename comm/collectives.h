// The four collectives as the comm benchmark measures them: names, how a message size
// becomes element counts, and nccl-tests' bandwidth definitions (doc/PERFORMANCE.md there).
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

#include "src/core/dtype.h"

namespace llmhpc {

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast };

const char* collective_name(Collective c);  // "allreduce", "reducescatter", ...
// Throws UsageError naming `option` for an unknown name.
Collective parse_collective(const std::string& name, const std::string& option);
const std::vector<Collective>& all_collectives();
bool is_reduction(Collective c);

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

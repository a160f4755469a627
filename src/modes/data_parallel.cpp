#include "src/modes/data_parallel.h"

#include "src/core/units.h"
#include "src/modes/options.h"

namespace llmhpc {

void add_data_parallel_options(po::options_description& desc, bool sweep) {
  const std::string list = sweep ? " (a comma-separated list sweeps)" : "";
  desc.add_options()
      ("ddp", po::value<std::string>()->default_value(sweep ? "none,naive,flat,overlap,bucketed" : "auto"),
       ("gradient synchronisation over ranks: none | naive | flat | overlap | bucketed | auto (bucketed on "
        "several ranks, none on one)" + list + (sweep ? "; none: no communication, the compute-only baseline" : ""))
           .c_str())
      ("bucket-mb", po::value<std::string>()->default_value("25"),
       ("bucketed: bucket capacity in MiB, as PyTorch's bucket_cap_mb (a real number > 0)" + list).c_str());
}

std::vector<SyncStrategy> sync_strategies(const po::variables_map& vm, int world_size) {
  std::vector<SyncStrategy> out;
  for (const std::string& s : split_list(opt_string(vm, "ddp"), "ddp"))
    out.push_back(s == "auto" ? (world_size > 1 ? SyncStrategy::Bucketed : SyncStrategy::None)
                              : parse_sync_strategy(s));
  return out;
}

std::vector<double> bucket_sizes_mb(const po::variables_map& vm) {
  std::vector<double> out;
  for (const std::string& s : split_list(opt_string(vm, "bucket-mb"), "bucket-mb")) {
    const double mb = parse_double(s, "bucket-mb");
    if (!(mb > 0)) throw UsageError("--bucket-mb '" + s + "': must be a number of MiB greater than 0 (e.g. 25, or 0.05)");
    out.push_back(mb);
  }
  return out;
}

std::unique_ptr<Communicator> make_gradient_communicator(const Runtime& rt, const po::variables_map& vm, Device& dev) {
  std::unique_ptr<Communicator> comm;
  collective_check(rt, [&] {
    const std::string backend = resolve_backend(vm, dev.kind());
    if (backend == "mpi" && dev.kind() == DeviceKind::Cuda)
      throw UsageError("--backend mpi reduces host buffers, but the model's gradients are on the GPU: use --backend "
                       "nccl (or auto) with --device cuda, or --device cpu with mpi");
    if (backend == "nccl" && dev.kind() != DeviceKind::Cuda)
      throw UsageError("--backend nccl needs GPUs: run with --device cuda (or auto on a host with GPUs)");
    CommOptions o;
    o.backend = backend == "nccl" ? CommBackend::Nccl : CommBackend::Mpi;
    o.gpu = dev.ordinal();
    o.compute_stream = dev.native_stream();
    comm = make_communicator(o);
  });
  return comm;
}

LocalBatch local_batch(int64_t global_batch, int rank, int world_size) {
  if (global_batch % world_size != 0)
    throw UsageError("--batch-size " + std::to_string(global_batch) + " is the global batch and must divide by the " +
                     std::to_string(world_size) + " ranks (each takes an equal share of its sequences)");
  const int64_t count = global_batch / world_size;
  return {int64_t(rank) * count, count};
}

}  // namespace llmhpc

// The one factory for communicators: the only place that knows whether the NCCL backend
// was compiled in (LLMHPC_WITH_CUDA).
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "src/core/check.h"
#if defined(LLMHPC_WITH_CUDA)
#include "comm/cuda/nccl_communicator.h"
#endif

namespace llmhpc {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

const char* comm_backend_name(CommBackend backend) { return backend == CommBackend::Mpi ? "mpi" : "nccl"; }

double Communicator::take_busy_ms(uint64_t mark) {
  if (!busy_measured()) return std::numeric_limits<double>::quiet_NaN();
  double ms = 0;
  for (const OperationSpan& s : take_busy_spans(mark)) ms += s.end_ms - s.start_ms;
  return ms;
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options) {
  if (options.backend == CommBackend::Mpi) return make_mpi_communicator(options.parent);
#if defined(LLMHPC_WITH_CUDA)
  return make_nccl_communicator(options);
#else
  throw UsageError("{backend} nccl: this llmhpc was built without CUDA and NCCL (no nvcc at build time)");
#endif
}

std::vector<std::pair<std::string, std::string>> comm_library_versions() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(text, &len));
  std::string mpi(text, size_t(len));
  mpi = mpi.substr(0, mpi.find_first_of("\n,"));  // "Open MPI v4.1.6"
  std::vector<std::pair<std::string, std::string>> out = {{"mpi_library_version", mpi}};
#if defined(LLMHPC_WITH_CUDA)
  out.emplace_back("nccl_version", nccl_version());
#endif
  return out;
}

Attrs comm_environment() {
  Attrs out;
  for (const auto& [name, version] : comm_library_versions()) out.emplace_back(name, version);
  out.emplace_back("environment_variables", launch_settings(environ));
  return out;
}

std::string launch_settings(const char* const* env) {
  static const char* const kPrefixes[] = {"NCCL_", "OMPI_MCA_", "UCX_"};
  static const char* const kNames[] = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "SLURM_JOB_ID",
                                       "SLURM_NTASKS",         "SLURM_NNODES",    "SLURM_NTASKS_PER_NODE"};
  // What mpirun sets in every rank to wire the job up (ids, URIs, temporary folders): new each
  // run and no setting of the user's, so not kept.
  static const char* const kPlumbing[] = {"OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                                          "OMPI_MCA_shmem_RUNTIME_QUERY_hint"};
  std::vector<std::string> kept;
  for (; env && *env; ++env) {
    const std::string entry(*env);
    const std::string name = entry.substr(0, entry.find('='));
    bool keep = std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
    for (const char* prefix : kPrefixes) keep = keep || name.rfind(prefix, 0) == 0;
    for (const char* prefix : kPlumbing) keep = keep && name.rfind(prefix, 0) != 0;
    if (keep) kept.push_back(entry);
  }
  std::sort(kept.begin(), kept.end());
  std::string out;
  for (const std::string& k : kept) out += (out.empty() ? "" : "\n") + k;
  return out;
}

bool nccl_compiled() {
#if defined(LLMHPC_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace llmhpc

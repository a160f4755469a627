#include "src/core/check.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace llmhpc {
namespace {
int g_rank = -1;
std::string g_host = "?";
std::string g_device = "none";
}  // namespace

void set_fatal_context_rank(int rank, const std::string& host) {
  g_rank = rank;
  g_host = host;
}

void set_fatal_context_device(const std::string& device) { g_device = device; }

void fatal(const char* file, int line, const std::string& call, const std::string& what) {
  std::fprintf(stderr, "llmhpc: fatal error on rank %d (host %s, device %s)\n  at %s:%d\n", g_rank, g_host.c_str(),
               g_device.c_str(), file, line);
  if (!call.empty()) std::fprintf(stderr, "  failing call: %s\n", call.c_str());
  if (!what.empty()) std::fprintf(stderr, "  %s\n", what.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

}  // namespace llmhpc

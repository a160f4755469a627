// One fatal path for the whole program, and the error types that are not fatal.
//
// fatal() prints rank, host, device, file:line and the failing call, then aborts the
// MPI job, so no rank is left waiting in a collective. Every CHECK macro (CUDA, cuBLAS,
// NCCL, MPI, HDF5) is built on LLMHPC_CHECK. Errors a caller can recover from, or that
// the user caused, are exceptions instead:
//   UsageError   - bad options or input files; main() prints it on rank 0, exit code 2.
//   AgreedError  - a UsageError inside a mode that every rank reaches at the same point, from a
//                  value they computed together (the global loss): no abort, rank 0 says it.
//   OutOfMemory  - an allocation did not fit; a sweep records status "oom" and goes on.
#pragma once
#include <stdexcept>
#include <string>

namespace llmhpc {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct AgreedError : UsageError {
  using UsageError::UsageError;
};

struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Who we are, for fatal messages. Set once by the runtime and the device.
void set_fatal_context_rank(int rank, const std::string& host);
void set_fatal_context_device(const std::string& device);

[[noreturn]] void fatal(const char* file, int line, const std::string& call, const std::string& what);

}  // namespace llmhpc

#define LLMHPC_FATAL(what) ::llmhpc::fatal(__FILE__, __LINE__, "", (what))

// The one check macro: `cond` false is a bug or a broken environment, never user input.
#define LLMHPC_CHECK(cond, what)                                     \
  do {                                                               \
    if (!(cond)) ::llmhpc::fatal(__FILE__, __LINE__, #cond, (what)); \
  } while (0)

// Return-code checks for C APIs: `ok` is the success test for the returned value `rc`.
#define LLMHPC_CHECK_CALL(call, rc_type, ok, describe)               \
  do {                                                               \
    rc_type llmhpc_rc_ = (call);                                     \
    if (!(ok)) ::llmhpc::fatal(__FILE__, __LINE__, #call, describe); \
  } while (0)

#define MPI_CHECK(call) LLMHPC_CHECK_CALL(call, int, llmhpc_rc_ == MPI_SUCCESS, ::llmhpc::mpi_error_string(llmhpc_rc_))

namespace llmhpc {
std::string mpi_error_string(int rc);
}

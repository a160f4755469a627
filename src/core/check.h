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
//   AgreedOutOfMemory - an OutOfMemory every rank reached at the same point, having agreed on it
//                  in a collective: no abort, rank 0 says it (exit code 3).
//   WriteFailed  - the system refused a write (a full disk, a quota, a file size limit): exit code
//                  5; AgreedWriteFailed, the same agreed by every rank (rank 0 says it, no abort).
#pragma once
#include <functional>
#include <stdexcept>
#include <string>

namespace llmhpc {

// Layers below the command line name a configuration field in braces: "{bucket_mb} 0: must be
// greater than 0". The command line's layer says once how each field is spelt there
// (set_field_names), so the user reads the flag they typed and no lower layer
// knows a flag. Without a namer a field reads as its bare name.
void set_field_names(std::function<std::string(const std::string& field)> name);
// `text` with every {field} (lower-case letters, digits, '_' and '-') named.
std::string name_fields(const std::string& text);
// The token that names `field` in a message.
inline std::string field(const std::string& name) { return "{" + name + "}"; }

struct UsageError : std::runtime_error {
  explicit UsageError(const std::string& what) : std::runtime_error(name_fields(what)) {}
};

struct AgreedError : UsageError {
  using UsageError::UsageError;
};

struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct AgreedOutOfMemory : OutOfMemory {
  using OutOfMemory::OutOfMemory;
};

// `error_number`: the system's errno (ENOSPC, EDQUOT, EFBIG, ...), 0 where it is not known;
// `file`: the file being written.
struct WriteFailed : std::runtime_error {
  WriteFailed(const std::string& what, std::string file, int error_number)
      : std::runtime_error(name_fields(what)), file(std::move(file)), error_number(error_number) {}
  std::string file;
  int error_number;
};

struct AgreedWriteFailed : WriteFailed {
  explicit AgreedWriteFailed(const std::string& what) : WriteFailed(what, "", 0) {}
};

// The system's reason for `error_number` as a message's words: "no space left on device".
std::string system_reason(int error_number);

// Who we are, for fatal messages. Set once by the runtime and the device.
void set_fatal_context_rank(int rank, const std::string& host);
void set_fatal_context_device(const std::string& device);

[[noreturn]] void fatal(const char* file, int line, const std::string& call, const std::string& what);
// An error that is not a bug (out of memory on this rank) where other ranks may be waiting for
// this one: says so with this rank and host, then aborts the MPI job with `code`.
[[noreturn]] void abort_job(const std::string& what, int code);
// A file being written that is no result until it is renamed into place (a rank file's working
// copy, a checkpoint's): while its RemoveOnFatal lives, fatal(), abort_job() and the watchdog's
// abort remove it before they end the job, so a write that fails (a full disk, a file size limit)
// leaves only what was published. Any thread.
class RemoveOnFatal {
 public:
  explicit RemoveOnFatal(std::string path);
  ~RemoveOnFatal();
  RemoveOnFatal(const RemoveOnFatal&) = delete;
  RemoveOnFatal& operator=(const RemoveOnFatal&) = delete;

 private:
  std::string path_;
};
// Removes those files: the job is ending.
void remove_unpublished_files();
// The watchdog is ending the job (src/core/watchdog.h): a fatal error after this is the abort's
// consequence (an MPI call failing as the launcher ends the other ranks), so fatal() says nothing and
// waits for the watchdog's MPI_Abort instead of racing it with its own.
void note_job_aborting();

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

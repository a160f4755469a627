// The collective watchdog: no rank waits forever in a collective.
//
// Every collective this process issues (the communicators' and the runtime's host
// reductions) registers here when it is issued and is marked complete when it is; one thread
// checks, every poll interval, the oldest operation not yet complete against --comm-timeout
// and the error sources the communicators add (NCCL's asynchronous error). On a timeout or an
// error it prints which operation (name, bytes, sequence number, the configuration and step
// it was issued in) with this rank's last enqueued and last completed sequence numbers, runs
// the communicators' abort hooks (ncclCommAbort) and ends the job with MPI_Abort. What
// PyTorch's ProcessGroupNCCL watchdog does, with its desync report's numbers printed by
// every rank.
//
// MPI_Abort from the watchdog thread: the runtime asks for MPI_THREAD_FUNNELED (only the
// main thread calls MPI), and the main thread is the one that is stuck. MPI_Abort is the one
// call made from elsewhere: Open MPI's and MPICH's abort hand the job to the launcher
// (PMIx/PMI) and exit without the library's locks. In case it does not return, an alarm
// ends the process kAbortDeadlineS later (a rank that exits ends an mpirun job too). The
// communicators' aborts get kAbortHooksS of that: ncclCommAbort may wait on a peer that never
// answers (a stopped process), and the job must end within --comm-timeout + 30 s.
//
// Operations complete in two ways: the host marks them (mpi: the call or the handle's wait
// returned), or the watchdog polls them (nccl: a CUDA event recorded after the call). The
// sequence numbers count every registered operation of this process from 1; "last completed"
// is the highest number up to which every operation is complete.
//
// Fault injection (tests only; docs/design.md, "Reliability"): the environment variable
// LLMHPC_FAULT, e.g. "rank=1,op=40,action=stall" or "rank=2,config=2,step=3,action=signal:9",
// makes one rank exit (action=exit[:code], default code 7), raise a signal
// (action=signal[:number], default 9) or stall (action=stall: sleep forever) just before it
// issues the first collective that is at least its op-th, in at least its config-th
// configuration (set_context calls, from 1) and at or after step `step` (each condition
// optional, at least one given). The fault is announced on stderr first.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace llmhpc {

class Watchdog {
 public:
  static constexpr int kAbortHooksS = 5;
  static constexpr int kAbortDeadlineS = 15;

  // One operation in flight. Created by begin(); the issuer calls launched() once the work
  // is enqueued (polled completion) or complete() when the host saw it finish.
  struct Op {
    enum State : int { Issued, Launched, Done };
    uint64_t seq = 0;
    const char* name = "";     // "allreduce", "barrier", ...
    const char* backend = "";  // "nccl", "mpi", "mpi (host)"
    uint64_t bytes = 0;
    int64_t step = -1;
    std::shared_ptr<const std::string> context;  // the configuration it was issued in
    std::chrono::steady_clock::time_point issued;
    std::shared_ptr<void> token;         // what poll() looks at (a CUDA event); kept alive here
    int (*poll)(void* token) = nullptr;  // 1 complete, 0 not yet, -1 failed
    std::atomic<int> state{Issued};
  };
  using OpPtr = std::shared_ptr<Op>;

  // A communicator's part: `error` is polled every round ("" = fine; else the watchdog fails
  // with that text), `abort` runs before the job is aborted, `prepare` once per round on the
  // watchdog thread before any poll (cudaSetDevice). Any may be empty.
  struct Monitor {
    std::function<std::string()> error;
    std::function<void()> abort;
    std::function<void()> prepare;
  };

  static Watchdog& instance();

  // Starts the thread (timeout_s > 0) and reads LLMHPC_FAULT. Throws UsageError on a
  // malformed LLMHPC_FAULT. Call once, on every rank, after MPI is up.
  void start(double timeout_s, int rank);
  // Stops the thread; operations still registered are forgotten.
  void stop();
  bool enabled() const { return timeout_s_ > 0; }
  double timeout_s() const { return timeout_s_; }

  // Where the ranks are, for reports: the configuration (a record's name) and the step.
  void set_context(const std::string& context);
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

  // Registers an operation about to be issued; null when the watchdog is off. Injects the
  // configured fault when this is its operation.
  OpPtr begin(const char* name, const char* backend, uint64_t bytes);
  static void launched(const OpPtr& op, std::shared_ptr<void> token, int (*poll)(void*));
  static void complete(const OpPtr& op) {
    if (op) op->state.store(Op::Done, std::memory_order_release);
  }

  int add_monitor(Monitor monitor);
  void remove_monitor(int id);

  // Reports `what` (about `op`, which may be null) and aborts the job. Any thread.
  [[noreturn]] void fail(const std::string& what, const Op* op);

  uint64_t last_enqueued() const { return enqueued_.load(); }
  uint64_t last_completed() const { return completed_.load(); }

  struct State;  // the thread's and the registry's (watchdog.cpp)

 private:
  Watchdog();
  void run();
  void inject(const Op& op);
  std::string describe(const Op& op) const;

  double timeout_s_ = 0;
  int rank_ = -1;
  std::atomic<int64_t> step_{-1};
  std::atomic<uint64_t> enqueued_{0}, completed_{0};
  std::unique_ptr<State> state_;
};

// Registers a host-side collective for its scope (the runtime's MPI reductions).
class WatchedCall {
 public:
  WatchedCall(const char* name, uint64_t bytes) : op_(Watchdog::instance().begin(name, "mpi (host)", bytes)) {}
  ~WatchedCall() { Watchdog::complete(op_); }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  Watchdog::OpPtr op_;
};

}  // namespace llmhpc

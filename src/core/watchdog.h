// The collective watchdog: no rank waits forever in a collective.
//
// Every collective this process issues (the communicators' and the runtime's host
// reductions) registers here when it is issued and is marked complete when it is; one thread
// checks, every poll interval, the oldest operation not yet complete against --comm-timeout
// and the error sources the communicators add (NCCL's asynchronous error). On a timeout or an
// error it asks every other rank how far it got (src/core/progress_board.h: a side channel
// that needs nothing from the stuck main threads), then prints, in one write, which operation
// (name, bytes, sequence number, the configuration and step it was issued in) with this rank's
// last enqueued and last completed sequence numbers, and which ranks had and had not issued
// that collective (one not reached and inside no collective named as in its own work or
// stopped, on its host) and which did not answer, with their hosts, and where this thread went
// without running for more than kAskS while the collective waited (the process stopped or
// starved: the others have likely reported and ended), that too; keeps that report in the rank
// file (set_on_abort: only where no HDF5 file is open within a second, io/h5.h's
// library_lock), goes on answering the other ranks' watchdogs until those that were inside a
// collective when asked say they have reported too, or for one asking window at most (kAskS:
// theirs fire about when its own does), then ends the job with MPI_Abort. What PyTorch's
// ProcessGroupNCCL watchdog and its desync report do.
//
// The rank that holds the others up, inside no collective (stalled in its own work), never fires:
// its watchdog sees nothing in flight. Asked by a firing rank, it asks back, learns which
// collective another rank's watchdog fired on (RankProgress::fired_on) and, where it has not
// issued that one, prints one line and keeps the same report from its side in its rank file
// (note_hang_elsewhere), so that every rank's file says how the job ended; the firing ranks wait
// for it as for one inside a collective (answer_while_others_report).
//
// The abort path calls nothing that the main thread may be inside: no NCCL, no CUDA, no
// thread that starts or ends, and HDF5 only under the lock every open file holds. The main
// thread is still in the stuck collective (an NCCL call waiting for room in its queue,
// cudaStreamSynchronize, an MPI call); ncclCommAbort from this
// thread freed what that call was using, and glibc found the heap damaged when a thread then
// exited ("tcache_thread_shutdown(): unaligned tcache chunk detected", SIGABRT, exit 134
// instead of 4). Ending the process ends its GPU work as well (the driver tears the context
// down), so the watchdog prints, asks, and calls MPI_Abort (Open MPI's hands the job to the
// launcher and leaves with _exit); should MPI_Abort return or hang, _exit(4) or the alarm's
// handler (also _exit(4), kAbortDeadlineS later) ends the process: no destructors, no atexit
// handlers, the documented exit code 4. The job ends within --comm-timeout + 30 s.
//
// MPI_Abort from the watchdog thread: the runtime asks for MPI_THREAD_FUNNELED (only the
// main thread calls MPI), and the main thread is the one that is stuck. MPI_Abort is the one
// call made from elsewhere: Open MPI's and MPICH's abort hand the job to the launcher
// (PMIx/PMI) and exit without the library's locks.
//
// Arrivals (for straggler analysis, docs/hdf5-schema.md "Arrivals"): for each step (set_step)
// of the current configuration the host times, on one clock across ranks (rank 0's monotonic
// clock: this rank's plus the offset measured at start-up, Runtime::clock_offset), of the
// step's start, its first and its last collective's issue, and how many it issued; the last
// kArrivalSteps steps are kept. Recorded whether or not the watchdog's thread runs.
//
// Operations complete in two ways: the host marks them (mpi: the call or the handle's wait
// returned), or the watchdog polls them (nccl: a CUDA event recorded after the call). The
// sequence numbers count every registered operation of this process from 1; "last completed"
// is the highest number up to which every operation is complete.
//
// Fault injection (tests only; docs/design.md, "Reliability"): the environment variable
// LLMHPC_FAULT, e.g. "rank=1,op=40,action=stall" or "rank=2,config=2,step=3,action=signal:9",
// makes one rank exit (action=exit[:code], default code 7), raise a signal as if sent from
// outside, to its handlers if it has them (action=signal[:number], default 9) or stall
// (action=stall: sleep forever) just before it issues the first collective that is at least
// its op-th, in at least its config-th configuration (set_context calls, from 1) and at or
// after step `step` (each condition optional, at least one given; a step as the mode's
// arrival_step counts it: train's optimizer step from 1, ddp's and memory's from 0 with the
// warm-up); or, with action=delay:MS, sleep MS milliseconds before each of its collectives from
// then on (a slow rank, for the straggler report); or, with action=diverge, issue a barrier of
// every rank in its place (ranks whose calls no longer match, as when one takes a path the
// others do not: each waits for the other's collective); or, with action=oom, throw
// OutOfMemory in its place (one rank out of memory). The fault is announced on stderr
// first. Refused at start-up (UsageError, naming the part): a rank outside the world, op or
// config below 1, a step below 0, an exit code outside 1..255, a signal outside 1..SIGRTMAX, a
// delay outside 1 ms..1 h, an unknown key or action, no rank or no condition. With the watchdog
// off (--comm-timeout 0) a stall or diverge fault is noted at start: only the launcher ends that
// job. A run that ends well without its fault firing says so (warn_if_fault_unfired). Several
// faults, each for another rank, go in one LLMHPC_FAULT with ';' between them
// ("rank=0,step=1,action=delay:20;rank=1,step=1,action=delay:22": every rank works 20 ms per
// collective, rank 1 10% longer). A stalled rank has not issued the collective (its last issued
// number is the one before), as a rank stuck in computation would.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llmhpc {

struct RankAnswer;  // src/core/progress_board.h

class Watchdog {
 public:
  static constexpr int kAbortDeadlineS = 15;
  static constexpr double kAskS = 2.0;  // how long a firing watchdog waits for the other ranks' answers
  static constexpr size_t kArrivalSteps = size_t(1) << 16;
  static constexpr const char* kHostBackend = "mpi (host)";  // the runtime's own reductions (WatchedCall)

  // One operation in flight. Created by begin(); the issuer calls launched() once the work
  // is enqueued (polled completion) or complete() when the host saw it finish.
  struct Op {
    enum State : int { Issued, Launched, Done };
    uint64_t seq = 0;
    const char* name = "";     // "allreduce", "barrier", ...
    const char* backend = "";  // "nccl", "mpi", "mpi (host)"
    uint64_t bytes = 0;
    std::shared_ptr<const std::vector<int>> group;  // the world ranks it runs among (null: every rank)
    int64_t step = -1;
    std::shared_ptr<const std::string> context;  // the configuration it was issued in
    std::chrono::steady_clock::time_point issued;
    std::shared_ptr<void> token;         // what poll() looks at (a CUDA event); kept alive here
    int (*poll)(void* token) = nullptr;  // 1 complete, 0 not yet, -1 failed
    std::atomic<int> state{Issued};
  };
  using OpPtr = std::shared_ptr<Op>;

  // A communicator's part: `error` is polled every round ("" = fine; else the watchdog fails
  // with that text), `prepare` once per round on the watchdog thread before any poll
  // (cudaSetDevice). Either may be empty.
  struct Monitor {
    std::function<std::string()> error;
    std::function<void()> prepare;
  };

  // One step's collectives as this rank issued them (seconds on the common clock).
  struct StepArrival {
    int64_t index = 0;        // the step's place among the configuration's steps (set_step calls), from 0
    int64_t step = 0;         // set_step's value
    double start_s = 0;       // set_step's call
    double first_s = 0;       // the first collective's issue
    double last_s = 0;        // the last collective's issue
    int64_t collectives = 0;  // issued in the step
  };

  static Watchdog& instance();

  // Reads LLMHPC_FAULT (every rank parses every fault: UsageError on a malformed or
  // out-of-range one) and, with timeout_s > 0, starts the thread and opens the progress board
  // (several ranks: collective over MPI_COMM_WORLD). Call once, on every rank, after MPI is up.
  void start(double timeout_s, int rank, int world_size);
  // Stops the thread; operations still registered are forgotten.
  void stop();
  // After a run that ended well: says so on stderr where this rank's LLMHPC_FAULT never fired (its
  // op, config or step never came), as a test that believes it injected a fault would pass on nothing.
  void warn_if_fault_unfired() const;
  bool enabled() const { return timeout_s_ > 0; }
  double timeout_s() const { return timeout_s_; }

  // Where the ranks are, for reports: the configuration (a record's name) and the step.
  void set_context(const std::string& context);
  // A step begins (>= 0) or the rank is between steps (-1). From the thread that issues collectives.
  void set_step(int64_t step);

  // The common clock: this rank's steady clock plus `offset_s` is rank 0's (Runtime::clock_offset).
  void set_clock_offset(double offset_s) { clock_offset_s_ = offset_s; }
  double common_time(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double>(t.time_since_epoch()).count() + clock_offset_s_;
  }
  // The current configuration's steps that issued collectives, oldest first (at most
  // kArrivalSteps, the latest). From the thread that issues collectives.
  std::vector<StepArrival> arrivals() const;

  // Registers an operation about to be issued and notes its arrival; null when the watchdog
  // is off. Injects the configured fault (before registering) when this is its operation.
  // From the thread that issues collectives (one per process).
  // `group`: the world ranks taking part (a communicator of some of them), null for every rank.
  OpPtr begin(const char* name, const char* backend, uint64_t bytes,
              std::shared_ptr<const std::vector<int>> group = nullptr);
  static void launched(const OpPtr& op, std::shared_ptr<void> token, int (*poll)(void*));
  static void complete(const OpPtr& op) {
    if (op) op->state.store(Op::Done, std::memory_order_release);
  }

  int add_monitor(Monitor monitor);
  void remove_monitor(int id);

  // What a firing watchdog found: the stuck collective, and which ranks had issued it, which
  // had not and which gave no answer (empty with one rank or no progress board), each with
  // its host; `text` is the report as printed.
  struct HangReport {
    std::string what;  // "no progress within --comm-timeout 3.0 s: collective #31 allreduce (...)"
    uint64_t collective = 0;
    std::vector<int> reached, not_reached, no_answer;
    // Ranks that issued the stuck collective's number as another call (name, backend or bytes):
    // the ranks' calls no longer match, so neither side's completes.
    std::vector<int> mismatched;
    std::vector<std::string> not_reached_hosts, no_answer_hosts;  // each host once
    // Where the collective runs among some ranks (a tensor-parallel or data-parallel group):
    // those ranks, and the others of them that had not issued it or gave no answer, the ones
    // it waits for. Sequence numbers count every collective of a rank, so a rank outside the
    // group that has not reached the number is held up elsewhere (by a rank of its own groups).
    std::vector<int> group, waited_for;
    // How long this rank's watchdog went without running (more than kAskS) while the stuck
    // collective waited (0: it ran on time): a process stopped (SIGSTOP, a debugger) or starved
    // of CPU fires late, after the other ranks reported and ended, and finds them not answering.
    // Their reports are the ones to trust.
    double late_s = 0;
    // The rank whose watchdog fired: this rank's own, or, in the report of a rank that had not
    // issued the collective and was inside none (note_hang_elsewhere), the rank that found it.
    int fired_on_rank = -1;
    std::string text;
  };
  // Called by fail() on its thread once the report is printed, before the job is aborted, to
  // keep the report with the results (main.cpp: the rank file). It must give up rather than
  // wait for the main thread, which may be stuck; the abort's deadline bounds it anyway.
  // Empty: nothing is kept. Any thread.
  void set_on_abort(std::function<void(const HangReport&)> keep);

  // Reports `what` (about `op`, which may be null) and aborts the job. Any thread.
  [[noreturn]] void fail(const std::string& what, const Op* op);

  // This rank gave up its configuration (set_context) part-way (`what`: "out of memory
  // (...)"), before whichever collectives came next, and is about to join the ranks' agreement
  // on how it went (a host reduction). A rank that went on into the next collective, e.g. of a
  // tensor-parallel group whose other ranks did not run out of memory, waits there for this
  // rank, which will not come: asked over the progress board, a rank that stays inside a
  // collective past this rank's last (its last completed this rank's last issued) for kAskS
  // means the job cannot go on, and it ends now (fail(), exit 4) rather than after
  // --comm-timeout. Returns once every other rank that answers is at a host reduction or
  // settling too (one that does not answer, stopped or ended, is the watchdog's); or after
  // --comm-timeout, or at once with the watchdog off, one rank or no board. Issuing thread.
  void settle_after_failure(const std::string& what);

  uint64_t last_enqueued() const { return enqueued_.load(); }
  uint64_t last_completed() const { return completed_.load(); }

  struct State;  // the thread's and the registry's (watchdog.cpp)

 private:
  Watchdog();
  void run();
  void inject(const Op& op);
  void note_arrival(std::chrono::steady_clock::time_point now);
  std::string describe(const Op& op) const;
  std::vector<RankAnswer> ask_the_ranks(HangReport& report, const Op* op) const;
  void note_hang_elsewhere();
  void keep_report(const HangReport& report);
  void answer_while_others_report(const std::vector<RankAnswer>& answers) const;

  double timeout_s_ = 0;
  int rank_ = -1;
  std::atomic<int64_t> step_{-1};
  std::atomic<uint64_t> enqueued_{0}, completed_{0};
  double clock_offset_s_ = 0;
  std::unique_ptr<State> state_;
};

// For a report whose stuck collective runs among `report.group`: the ranks of it that the
// collective waits for, into report.waited_for, and the report's line that says so ("    its
// group: ranks 1,3; of them it waits for rank 1\n"). Those are, `self` aside, the ranks that had
// not issued it or gave no answer, and those whose host issued it while their collectives
// completed less far than this rank's (`done`, its last completed): NCCL's calls only enqueue,
// so a rank held up in another group's collective issues this one all the same.
std::string group_waits(Watchdog::HangReport& report, int self, uint64_t done, const std::vector<RankAnswer>& answers);

// Registers a host-side collective for its scope (the runtime's MPI reductions).
class WatchedCall {
 public:
  // `group`: the world ranks taking part (a group Runtime's), null for every rank.
  WatchedCall(const char* name, uint64_t bytes, std::shared_ptr<const std::vector<int>> group = nullptr)
      : op_(Watchdog::instance().begin(name, Watchdog::kHostBackend, bytes, std::move(group))) {}
  ~WatchedCall() { Watchdog::complete(op_); }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  Watchdog::OpPtr op_;
};

}  // namespace llmhpc

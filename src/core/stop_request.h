// A graceful stop asked for by a signal. Slurm sends SIGTERM at a job's time limit (and any
// signal chosen with `#SBATCH --signal=USR1@SECONDS` before it), Open MPI's mpirun forwards
// SIGUSR1 and SIGUSR2 to every rank, and an interactive user presses Ctrl-C. A mode that runs
// for long (train) installs the handlers, asks stop_signal() between steps, agrees on it with
// the other ranks in a collective it makes anyway, saves what it has and throws Interrupted;
// main marks the rank files "interrupted" and exits with 128 + the signal, as a shell reports a
// process the signal killed. Those handlers only note the signal. SIGTERM's and SIGINT's act once:
// another one more than kSameSignalMs later ends the process at once (Ctrl-C twice; Slurm's
// SIGKILL follows SIGTERM after KillWait anyway), while one sooner is the same stop delivered
// twice (GNU timeout passes a signal to its command and to its process group) and is ignored;
// SIGUSR1 may come twice (jobs/train.sh sends it to the launcher and to its ranks).
#pragma once
#include <functional>
#include <string>

namespace llmhpc {

// SIGTERM, SIGINT, SIGUSR1.
void install_stop_handlers();
// What the stop's thread writes before the process ends (main.cpp: the rank file), from a thread
// of its own while the main thread goes on, and may be stuck in a collective: each must give up
// rather than wait for it long. `mark` at once: the files interrupted. `if_not_kept` after the
// main thread had kStopWaitMs to keep its steps (KeepBeforeStop) and did not: stuck in a
// collective, or in a longer step (the steps it kept in memory before, Recorder::keep_if_ended).
struct StopKeeper {
  std::function<void(int signal)> mark, if_not_kept;
};
// Until a mode installs the handlers above, SIGTERM and SIGINT end the process as uncaught
// would (exit status 128 + the signal), and with `speak` (rank 0) first print "llmhpc:
// <signal> <notice>" on stderr, so that a user who pressed Ctrl-C during a sweep is told where
// the results are. Before it ends, `keep` runs (either part may be empty). The process ends
// when it has, or kStopDeadlineS after the signal whatever it does; another SIGTERM or SIGINT
// more than kSameSignalMs later ends it at once. A signal ignored when the process started
// stays ignored.
void install_stop_notice(bool speak, const std::string& notice, StopKeeper keep = {});
// Whether install_stop_notice's handler has taken a signal: the process is ending by it.
bool stop_noticed();
// Replaces (empty: removes) install_stop_notice's `keep`; waits for one that is running.
void set_stop_keeper(StopKeeper keep);
// How long `keep` may wait for the main thread to let go of a file (main.cpp), and how long after
// the signal the process ends whatever `keep` does. Under mpirun, Open MPI kills the ranks one
// second after it passes them SIGTERM: a keeper still waiting then is cut short, and its file
// stays as it was ("running").
constexpr int kStopWaitMs = 2000;
// A second SIGTERM or SIGINT within this of the first is a copy of it, not a second stop.
constexpr int kSameSignalMs = 500;
constexpr int kStopDeadlineS = 5;
// The steps a mode measured before a signal outside train, kept by the main thread: while a
// KeepBeforeStop lives (a sweep's configuration running its steps: src/modes/sweep.h), the stop's
// thread, once it has marked the file (install_stop_notice's `keep.mark`), gives the main thread up to
// kStopWaitMs to reach its next step and keep its steps there (at_step) before it ends the
// process. Between two steps the arrays are whole, which they are not from another thread
// mid-step; and the file is marked first because under mpirun a rank has a second, less than a
// long step. One at a time.
class KeepBeforeStop {
 public:
  KeepBeforeStop();
  ~KeepBeforeStop();
  KeepBeforeStop(const KeepBeforeStop&) = delete;
  KeepBeforeStop& operator=(const KeepBeforeStop&) = delete;
  // Between two steps: returns at once while no stop is noticed. Else, once the stop's thread has
  // marked the file, runs `keep` with the signal (where that thread still waits for it) and does
  // not return: that thread ends the process.
  void at_step(const std::function<void(int signal)>& keep);
};
// 0, or the first of those signals received since install_stop_handlers().
int stop_signal();
// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int signal);

// Thrown by a mode that stopped early on a signal, after it saved its state.
struct Interrupted {
  int signal;
  std::string what;  // the rank file's status: "interrupted: ..."
};

}  // namespace llmhpc

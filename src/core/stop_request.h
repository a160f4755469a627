// A graceful stop asked for by a signal. Slurm sends SIGTERM at a job's time limit (and any
// signal chosen with `#SBATCH --signal=USR1@SECONDS` before it), Open MPI's mpirun forwards
// SIGUSR1 and SIGUSR2 to every rank, and an interactive user presses Ctrl-C. A mode that runs
// for long (train) installs the handlers, asks stop_signal() between steps, agrees on it with
// the other ranks in a collective it makes anyway, saves what it has and throws Interrupted;
// main marks the rank files "interrupted" and exits with 128 + the signal, as a shell reports a
// process the signal killed. Those handlers only note the signal. SIGTERM's and SIGINT's act once:
// the same signal again ends the process at once (Slurm's SIGKILL follows SIGTERM after KillWait
// anyway); SIGUSR1 may come twice (jobs/train.sh sends it to the launcher and to its ranks).
#pragma once
#include <string>

namespace llmhpc {

// SIGTERM, SIGINT, SIGUSR1.
void install_stop_handlers();
// Until a mode installs the handlers above, SIGTERM and SIGINT end the process as uncaught
// (the rank files keep every finished record; the one being written reads as interrupted),
// and with `speak` (rank 0) first print "llmhpc: <signal> <notice>" on stderr, so that a
// user who pressed Ctrl-C during a sweep is told where the results are. A signal ignored
// when the process started stays ignored.
void install_stop_notice(bool speak, const std::string& notice);
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

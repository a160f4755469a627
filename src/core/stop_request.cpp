#include "src/core/stop_request.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <mutex>
#include <thread>

namespace llmhpc {
namespace {

volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_noticed = 0;  // the signal notice_and_end took, 0 before

// When the first SIGTERM or SIGINT came (CLOCK_MONOTONIC, ns; 0 before). Lock-free, so a handler
// may use it.
std::atomic<int64_t> g_first_signal_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "read and written in signal handlers");

// In a handler of SIGTERM or SIGINT: whether this one is the first, a copy of it (within
// kSameSignalMs: one action delivered twice), or a second stop asked for, which ends the process
// at once as the signal's default action (Ctrl-C twice).
enum class Arrival { First, Copy, Again };
Arrival arrival() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  const int64_t now = int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
  int64_t first = 0;
  if (g_first_signal_ns.compare_exchange_strong(first, now)) return Arrival::First;
  return now - first < int64_t(kSameSignalMs) * 1000000 ? Arrival::Copy : Arrival::Again;
}

// In the signal's handler: the process ends by its default action, as with no handler (a
// handler's own signal is blocked while it runs: unblocked, the raised one is delivered at once).
[[noreturn]] void end_at_once(int signal) {
  std::signal(signal, SIG_DFL);
  sigset_t own;
  sigemptyset(&own);
  sigaddset(&own, signal);
  std::raise(signal);
  sigprocmask(SIG_UNBLOCK, &own, nullptr);
  _exit(128 + signal);  // not reached: the default action of SIGTERM and SIGINT ends the process
}

extern "C" void note_signal(int signal) {
  // SIGUSR1 may come twice and never ends the process (a job script may send it to the launcher
  // and to the ranks).
  if (signal != SIGUSR1) {
    const Arrival a = arrival();
    if (a == Arrival::Again) end_at_once(signal);
    if (a == Arrival::Copy) return;
  }
  if (g_signal == 0) g_signal = signal;
}

char g_notice[1024];  // set before the handler is installed; written by it alone
bool g_speak = false;
// The keeper's thread reads the signal from this pipe; -1 before it runs.
int g_keeper_pipe[2] = {-1, -1};
std::mutex g_keeper_mutex;               // guards g_keeper, held while it runs
StopKeeper& g_keeper = *new StopKeeper;  // never destroyed: the thread may outlive it

// KeepBeforeStop's hand-over between the main thread and the stop's: where the main thread is,
// whether the stop's thread has marked the file, and whether it has stopped waiting for the main
// thread (which then keeps nothing).
enum class MainThread { Elsewhere, Measuring, Keeping, Kept };
std::mutex g_hand_mutex;
std::condition_variable g_hand_changed;
MainThread g_main = MainThread::Elsewhere;
bool g_marked = false, g_waits_no_more = false;

// The stop's thread, once it has marked the file: while the main thread measures steps it can
// keep, up to kStopWaitMs for it to keep them. Past that (a long step, or a collective another
// rank never joins) it keeps no more. Whether the main thread kept its steps.
bool wait_for_main_thread() {
  std::unique_lock<std::mutex> lock(g_hand_mutex);
  g_marked = true;
  g_hand_changed.notify_all();
  g_hand_changed.wait_for(lock, std::chrono::milliseconds(kStopWaitMs),
                          [] { return g_main == MainThread::Elsewhere || g_main == MainThread::Kept; });
  g_waits_no_more = true;
  return g_main == MainThread::Kept;
}

// One part of the keeper, on the stop's thread.
void run_keeper(std::function<void(int)> StopKeeper::*part, int signal, const char* what) {
  std::lock_guard<std::mutex> hold(g_keeper_mutex);
  try {
    if (g_keeper.*part) (g_keeper.*part)(signal);
  } catch (const std::exception& e) {  // the file cannot be written: the signal ends the run all the same
    std::fprintf(stderr, "llmhpc: could not %s: %s\n", what, e.what());
  }
}

// The process ends as the signal's default action has it (so its exit status says the signal).
[[noreturn]] void end_by(int signal) {
  std::signal(signal, SIG_DFL);
  kill(getpid(), signal);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the signal ends the process before this ends
  std::_Exit(128 + signal);
}

void keep_and_end() {
  unsigned char byte = 0;
  while (read(g_keeper_pipe[0], &byte, 1) != 1) {
  }
  const int signal = byte;
  std::thread([signal] {  // the deadline, whatever the keeper does
    std::this_thread::sleep_for(std::chrono::seconds(kStopDeadlineS));
    end_by(signal);
  })
      .detach();
  // Marked first: under mpirun a rank has a second before it is killed, and a step may take longer.
  run_keeper(&StopKeeper::mark, signal, "mark the rank file interrupted");
  if (!wait_for_main_thread())
    run_keeper(&StopKeeper::if_not_kept, signal, "keep the steps measured before the signal");
  end_by(signal);
}

// Async-signal-safe: write(2) of strings made beforehand, then the signal to the keeper's
// thread, or the default action where there is none.
extern "C" void notice_and_end(int signal) {
  const Arrival a = arrival();
  if (a == Arrival::Again) end_at_once(signal);
  if (a == Arrival::Copy) return;
  g_noticed = signal;
  if (g_speak) {
    // After a pending "[k/n] ...". Rank 0 speaks: the launcher's SIGTERM also follows another rank's abort.
    const char* name = signal == SIGINT ? "\nllmhpc: SIGINT "
                                        : "\nllmhpc: SIGTERM (from the launcher or the scheduler: a time limit, "
                                          "a cancel, or another rank's abort above) ";
    ssize_t ignored = write(STDERR_FILENO, name, std::strlen(name));
    ignored = write(STDERR_FILENO, g_notice, std::strlen(g_notice));
    (void)ignored;
  }
  if (g_keeper_pipe[1] >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signal);
    if (write(g_keeper_pipe[1], &byte, 1) == 1) return;
  }
  end_at_once(signal);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = note_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
}

void set_stop_keeper(StopKeeper keep) {
  std::lock_guard<std::mutex> hold(g_keeper_mutex);
  g_keeper = std::move(keep);
}

void install_stop_notice(bool speak, const std::string& notice, StopKeeper keep) {
  std::snprintf(g_notice, sizeof g_notice, "%s\n", notice.c_str());
  g_speak = speak;
  set_stop_keeper(std::move(keep));
  if (g_keeper_pipe[0] < 0 && pipe2(g_keeper_pipe, O_CLOEXEC) == 0) std::thread(keep_and_end).detach();
  struct sigaction action = {};
  action.sa_handler = notice_and_end;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT}) {
    struct sigaction old = {};
    sigaction(signal, nullptr, &old);
    // An ignored signal stays ignored (a script's background job ignores SIGINT): what ended the
    // process before ends it now.
    if (old.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  }
}

KeepBeforeStop::KeepBeforeStop() {
  std::lock_guard<std::mutex> lock(g_hand_mutex);
  g_main = MainThread::Measuring;
}

KeepBeforeStop::~KeepBeforeStop() {
  {
    std::lock_guard<std::mutex> lock(g_hand_mutex);
    g_main = MainThread::Elsewhere;
  }
  g_hand_changed.notify_all();
}

void KeepBeforeStop::at_step(const std::function<void(int signal)>& keep) {
  const int signal = g_noticed;
  if (!signal) return;
  bool mine = false;
  {
    std::unique_lock<std::mutex> lock(g_hand_mutex);
    // After the stop's thread has marked the file, so that its mark does not replace the steps.
    g_hand_changed.wait_for(lock, std::chrono::seconds(kStopDeadlineS), [] { return g_marked; });
    if (g_main == MainThread::Measuring && !g_waits_no_more) {
      g_main = MainThread::Keeping;
      mine = true;
    }
  }
  if (mine) {
    try {
      keep(signal);
    } catch (const std::exception& e) {  // the stop goes on, the file as marked
      std::fprintf(stderr, "llmhpc: the steps measured so far could not be kept: %s\n", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(g_hand_mutex);
      g_main = MainThread::Kept;
    }
    g_hand_changed.notify_all();
  }
  // The stop's thread ends the process, kStopDeadlineS after the signal at the latest.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

int stop_signal() { return int(g_signal); }

bool stop_noticed() { return g_noticed != 0; }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
  }
  return "signal " + std::to_string(signal);
}

}  // namespace llmhpc

#include "src/core/stop_request.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

namespace llmhpc {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void note_signal(int signal) {
  if (g_signal == 0) g_signal = signal;
}

char g_notice[1024];  // set before the handler is installed; written by it alone
bool g_speak = false;

// Async-signal-safe: write(2) of strings made beforehand, then the default action.
extern "C" void notice_and_end(int signal) {
  if (g_speak) {
    // After a pending "[k/n] ...". Rank 0 speaks: the launcher's SIGTERM also follows another rank's abort.
    const char* name = signal == SIGINT ? "\nllmhpc: SIGINT "
                                        : "\nllmhpc: SIGTERM (from the launcher or the scheduler: a time limit, "
                                          "a cancel, or another rank's abort above) ";
    ssize_t ignored = write(STDERR_FILENO, name, std::strlen(name));
    ignored = write(STDERR_FILENO, g_notice, std::strlen(g_notice));
    (void)ignored;
  }
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = note_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) {
    // SIGTERM and SIGINT once (a second one acts as uncaught: Ctrl-C twice kills); SIGUSR1
    // always, since a job script may send it both to the launcher and to the ranks.
    action.sa_flags = SA_RESTART | (signal == SIGUSR1 ? 0 : SA_RESETHAND);
    sigaction(signal, &action, nullptr);
  }
}

void install_stop_notice(bool speak, const std::string& notice) {
  std::snprintf(g_notice, sizeof g_notice, "%s\n", notice.c_str());
  g_speak = speak;
  struct sigaction action = {};
  action.sa_handler = notice_and_end;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT}) {
    struct sigaction old = {};
    sigaction(signal, nullptr, &old);
    // An ignored signal stays ignored (a script's background job ignores SIGINT): what ended the
    // process before ends it now.
    if (old.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  }
}

int stop_signal() { return int(g_signal); }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
  }
  return "signal " + std::to_string(signal);
}

}  // namespace llmhpc

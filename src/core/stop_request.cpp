#include "src/core/stop_request.h"

#include <csignal>

namespace llmhpc {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void note_signal(int signal) {
  if (g_signal == 0) g_signal = signal;
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

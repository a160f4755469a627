#include "src/core/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "src/core/check.h"
#include "src/core/table.h"
#include "src/core/units.h"

namespace llmhpc {

namespace {

// The test-only fault of LLMHPC_FAULT (see watchdog.h).
struct Fault {
  int rank = -1;
  uint64_t op = 0;     // 0: any
  int64_t step = -1;   // -1: any
  int64_t config = 0;  // 0: any
  enum Action { Exit, Signal, Stall } action = Exit;
  int code = 7;  // exit code or signal number
  bool fired = false;
};

Fault parse_fault(const std::string& text) {
  const std::string usage = "LLMHPC_FAULT='" + text +
                            "': expected rank=R,op=N|config=C|step=S,action=exit[:code]|signal[:number]|stall "
                            "(a test-only switch; unset it for real runs)";
  Fault f;
  bool when = false;
  for (const std::string& item : split_list(text, "LLMHPC_FAULT")) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw UsageError(usage);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank") {
      f.rank = int(parse_int(value, "LLMHPC_FAULT rank"));
    } else if (key == "op") {
      f.op = uint64_t(parse_int(value, "LLMHPC_FAULT op"));
      when = true;
    } else if (key == "config") {
      f.config = parse_int(value, "LLMHPC_FAULT config");
      when = true;
    } else if (key == "step") {
      f.step = parse_int(value, "LLMHPC_FAULT step");
      when = true;
    } else if (key == "action") {
      const std::string name = value.substr(0, value.find(':'));
      const bool has_code = value.find(':') != std::string::npos;
      if (name == "exit") f.action = Fault::Exit;
      else if (name == "signal") f.action = Fault::Signal, f.code = 9;
      else if (name == "stall") f.action = Fault::Stall;
      else throw UsageError(usage);
      if (has_code) f.code = int(parse_int(value.substr(value.find(':') + 1), "LLMHPC_FAULT action code"));
    } else {
      throw UsageError(usage);
    }
  }
  if (f.rank < 0 || !when) throw UsageError(usage);
  return f;
}

std::string seconds_text(double s) { return fmt(s, s < 10 ? 1 : 0) + " s"; }

}  // namespace

// Operations registered between two looks of the thread, beyond which it looks at once: ops of
// a microsecond each (a one-rank or tiny collective) would otherwise pile up by the million
// in an interval, a transient the soaks read as host memory growth.
constexpr size_t kDrainAt = 4096;

struct Watchdog::State {
  std::mutex mutex;              // guards incoming, context, monitors, stopping
  std::condition_variable wake;  // stop() wakes the thread
  std::vector<OpPtr> incoming;   // registered since the thread last looked
  std::deque<OpPtr> in_flight;   // the thread's own, oldest first
  std::shared_ptr<const std::string> context = std::make_shared<const std::string>();
  std::map<int, Monitor> monitors;
  int next_monitor = 0;
  bool stopping = false;
  std::thread thread;
  std::unique_ptr<Fault> fault;
  std::atomic<bool> failing{false};
  int64_t configs = 0;  // set_context calls so far: the configuration a fault may name
};

Watchdog::Watchdog() : state_(std::make_unique<State>()) {}

Watchdog& Watchdog::instance() {
  static Watchdog* w = new Watchdog();  // never destroyed: the thread may outlive static destructors
  return *w;
}

void Watchdog::start(double timeout_s, int rank) {
  rank_ = rank;
  if (const char* text = std::getenv("LLMHPC_FAULT"); text && *text)
    state_->fault = std::make_unique<Fault>(parse_fault(text));
  if (timeout_s <= 0) return;
  timeout_s_ = timeout_s;
  state_->stopping = false;
  state_->thread = std::thread([this] { run(); });
}

void Watchdog::stop() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
  state_->in_flight.clear();
  state_->incoming.clear();
  timeout_s_ = 0;
}

void Watchdog::set_context(const std::string& context) {
  auto text = std::make_shared<const std::string>(context);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->context = std::move(text);
  ++state_->configs;
  step_.store(-1, std::memory_order_relaxed);  // a new configuration has taken no step yet
}

Watchdog::OpPtr Watchdog::begin(const char* name, const char* backend, uint64_t bytes) {
  if (!enabled() && !state_->fault) return nullptr;
  auto op = std::make_shared<Op>();
  op->seq = enqueued_.fetch_add(1) + 1;
  op->name = name;
  op->backend = backend;
  op->bytes = bytes;
  op->step = step_.load(std::memory_order_relaxed);
  op->issued = std::chrono::steady_clock::now();
  bool drain = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    op->context = state_->context;
    if (enabled()) state_->incoming.push_back(op);
    drain = state_->incoming.size() == kDrainAt;
  }
  if (drain) state_->wake.notify_all();
  if (state_->fault) inject(*op);
  return enabled() ? op : nullptr;
}

void Watchdog::launched(const OpPtr& op, std::shared_ptr<void> token, int (*poll)(void*)) {
  if (!op) return;
  op->token = std::move(token);
  op->poll = poll;
  op->state.store(Op::Launched, std::memory_order_release);
}

int Watchdog::add_monitor(Monitor monitor) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->monitors.emplace(state_->next_monitor, std::move(monitor));
  return state_->next_monitor++;
}

void Watchdog::remove_monitor(int id) {
  std::lock_guard<std::mutex> lock(state_->mutex);  // waits for a round that is using it
  state_->monitors.erase(id);
}

void Watchdog::inject(const Op& op) {
  Fault& f = *state_->fault;
  if (f.fired || f.rank != rank_ || (f.op && op.seq < f.op) || (f.config && state_->configs < f.config) ||
      (f.step >= 0 && op.step < f.step))
    return;
  f.fired = true;
  const char* what = f.action == Fault::Exit ? "exits" : f.action == Fault::Signal ? "raises signal" : "stalls";
  std::fprintf(stderr,
               "llmhpc: fault injection (test only, LLMHPC_FAULT): rank %d %s%s before collective #%llu %s (%s, %llu "
               "bytes) at step %lld of '%s'\n",
               rank_, what, f.action == Fault::Stall ? "" : (" " + std::to_string(f.code)).c_str(),
               (unsigned long long)op.seq, op.name, op.backend, (unsigned long long)op.bytes, (long long)op.step,
               op.context->c_str());
  std::fflush(stderr);
  if (f.action == Fault::Exit) std::_Exit(f.code);
  if (f.action == Fault::Signal) {
    std::signal(f.code, SIG_DFL);
    std::raise(f.code);
    std::_Exit(128 + f.code);  // a signal whose default is to go on
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::string Watchdog::describe(const Op& op) const {
  std::string s = "collective #" + std::to_string(op.seq) + " " + op.name + " (" + op.backend + ", " +
                  std::to_string(op.bytes) + " bytes)";
  if (!op.context->empty()) s += " in '" + *op.context + "'";
  if (op.step >= 0) s += " at step " + std::to_string(op.step);
  const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - op.issued).count();
  return s + ", issued " + seconds_text(age) + " ago";
}

void Watchdog::fail(const std::string& what, const Op* op) {
  if (state_->failing.exchange(true)) {  // another thread is already at it
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  note_job_aborting();  // what the aborted communicators make fail is no news: fatal() waits
  const auto began = std::chrono::steady_clock::now();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr,
               "llmhpc: watchdog on rank %d (host %s): %s%s\n"
               "  rank %d: last enqueued collective #%llu, last completed #%llu\n"
               "  aborting the communicators and the job (MPI_Abort)\n",
               rank_, host, what.c_str(), op ? (": " + describe(*op)).c_str() : "", rank_,
               (unsigned long long)enqueued_.load(), (unsigned long long)completed_.load());
  std::fflush(stderr);
  std::signal(SIGALRM, SIG_DFL);
  alarm(kAbortDeadlineS);  // if MPI_Abort itself hangs, the process still ends
  std::vector<std::function<void()>> aborts;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);  // nobody fails while holding it
    for (auto& [id, m] : state_->monitors)
      if (m.abort) aborts.push_back(m.abort);
  }
  // The communicators' aborts run on a thread of their own and get kAbortHooksS: an abort that
  // waits on a peer which will never answer (a stopped process) must not hold the job's end.
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([aborts, done] {
    for (auto& abort : aborts) abort();
    done->store(true);
  }).detach();
  while (!done->load() && std::chrono::steady_clock::now() - began < std::chrono::seconds(kAbortHooksS))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::fprintf(stderr, "  rank %d: communicators %s after %.1f s; MPI_Abort\n", rank_,
               done->load() ? "aborted" : "still aborting", took);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::_Exit(4);
}

void Watchdog::run() {
  State& s = *state_;
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  // Often enough that a timeout is seen within a tenth of it (and at most 200 ms late).
  const auto interval = std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 0.01, 0.2));
  for (;;) {
    std::vector<Monitor> monitors;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.wake.wait_for(lock, interval, [&] { return s.stopping || s.incoming.size() >= kDrainAt; });
      if (s.stopping) return;
      for (OpPtr& op : s.incoming) s.in_flight.push_back(std::move(op));
      s.incoming.clear();
      for (auto& [id, m] : s.monitors) monitors.push_back(m);
    }
    for (const Monitor& m : monitors)
      if (m.prepare) m.prepare();
    // Retire the complete prefix; ops of several streams may finish out of order, so only
    // the oldest unfinished one matters for the timeout.
    while (!s.in_flight.empty()) {
      Op& op = *s.in_flight.front();
      int st = op.state.load(std::memory_order_acquire);
      if (st == Op::Launched && op.poll) {
        const int r = op.poll(op.token.get());
        if (r < 0) fail("the device reported an error while this collective ran", &op);
        if (r > 0) st = Op::Done;
      }
      if (st != Op::Done) break;
      completed_.store(op.seq);
      s.in_flight.pop_front();
    }
    for (const Monitor& m : monitors) {
      if (!m.error) continue;
      const std::string error = m.error();
      if (!error.empty()) fail(error, s.in_flight.empty() ? nullptr : s.in_flight.front().get());
    }
    if (!s.in_flight.empty()) {
      const Op& oldest = *s.in_flight.front();
      if (std::chrono::steady_clock::now() - oldest.issued > timeout)
        fail(name_fields("no progress within {comm_timeout} ") + seconds_text(timeout_s_), &oldest);
    }
  }
}

}  // namespace llmhpc

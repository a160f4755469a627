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
#include "src/core/host.h"
#include "src/core/progress_board.h"
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
  enum Action { Exit, Signal, Stall, Delay, Diverge, Oom } action = Exit;
  int code = 7;  // exit code, signal number or milliseconds of delay
  bool fired = false;
};

// One rank's fault; the ranks' count bounds its rank (a fault for no rank would never fire).
Fault parse_fault(const std::string& text, int world_size) {
  const std::string usage =
      "expected rank=R,op=N|config=C|step=S,action=exit[:code]|signal[:number]|stall|delay:MS|diverge|oom[;another "
      "rank's fault] (a test-only switch; unset it for real runs)";
  // What was wrong, then the whole form.
  const auto bad = [&](const std::string& what) {
    return UsageError("LLMHPC_FAULT='" + text + "': " + what + "; " + usage);
  };
  // A whole number in [low, high] for `what`.
  const auto number = [&](const std::string& value, const std::string& what, int64_t low, int64_t high) {
    int64_t n = 0;
    try {
      n = parse_int(value, "LLMHPC_FAULT " + what);
    } catch (const UsageError&) {
      throw bad(what + " '" + value + "' is not a whole number");
    }
    if (n < low || n > high)
      throw bad(what + " " + value + " is outside " + std::to_string(low) + ".." + std::to_string(high));
    return n;
  };
  Fault f;
  bool when = false;
  for (const std::string& item : split_list(text, "LLMHPC_FAULT")) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw bad("'" + item + "' is no key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank") {
      f.rank = int(number(value, "rank", 0, world_size - 1));
    } else if (key == "op") {
      f.op = uint64_t(number(value, "op", 1, INT64_MAX));
      when = true;
    } else if (key == "config") {
      f.config = number(value, "config", 1, INT64_MAX);
      when = true;
    } else if (key == "step") {
      f.step = number(value, "step", 0, INT64_MAX);
      when = true;
    } else if (key == "action") {
      const std::string name = value.substr(0, value.find(':'));
      const bool has_code = value.find(':') != std::string::npos;
      if (name == "exit") f.action = Fault::Exit;
      else if (name == "signal") f.action = Fault::Signal, f.code = 9;
      else if (name == "stall") f.action = Fault::Stall;
      else if (name == "diverge") f.action = Fault::Diverge;
      else if (name == "oom") f.action = Fault::Oom;
      else if (name == "delay" && has_code) f.action = Fault::Delay;
      else throw bad(name == "delay" ? "delay needs its milliseconds, e.g. delay:20" : "unknown action '" + name + "'");
      const std::string code = value.substr(value.find(':') + 1);
      if (has_code && f.action == Fault::Exit) f.code = int(number(code, "exit code", 1, 255));
      else if (has_code && f.action == Fault::Signal) f.code = int(number(code, "signal", 1, SIGRTMAX));
      else if (has_code && f.action == Fault::Delay) f.code = int(number(code, "delay (ms)", 1, 3600 * 1000));
      else if (has_code) throw bad(name + " takes no ':" + code + "'");
    } else {
      throw bad("unknown key '" + key + "'");
    }
  }
  if (f.rank < 0) throw bad("no rank=R");
  if (!when) throw bad("no op=N, config=C or step=S: when to act");
  return f;
}

// A steady-clock time in seconds, as the thread's gaps are kept (State::gap_end_s).
double steady_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

std::string seconds_text(double s) { return fmt(s, s < 10 ? 1 : 0) + " s"; }
// "allreduce (nccl, 4000 bytes)": a call as the reports name it.
std::string call_text(const std::string& name, const std::string& backend, uint64_t bytes) {
  return name + " (" + backend + ", " + std::to_string(bytes) + " bytes)";
}

}  // namespace

// Operations registered between two looks of the thread, beyond which it looks at once: ops of
// a microsecond each (a one-rank or tiny collective) would otherwise pile up by the million
// in an interval, a transient the soaks would read as host memory growth. Past kWaitAt (about
// 5 MB of them) the issuing thread waits for it: on a loaded machine the thread may get no core
// for tens of milliseconds, while one rank's no-op all-reduces run at 5 million a second.
constexpr size_t kDrainAt = 4096;
constexpr size_t kWaitAt = 8 * kDrainAt;

struct Watchdog::State {
  std::mutex mutex;               // guards incoming, context, last, monitors, stopping
  std::condition_variable wake;   // stop() wakes the thread
  std::condition_variable taken;  // the thread took `incoming` (or stops): begin() waits for it past kWaitAt
  std::vector<OpPtr> incoming;    // registered since the thread last looked
  std::deque<OpPtr> in_flight;    // the thread's own, oldest first
  std::shared_ptr<const std::string> context = std::make_shared<const std::string>();
  // The last issued call, set with its number (enqueued_): a rank asked how far it got answers
  // with both of one call (ask_the_ranks compares them).
  struct {
    const char* name = "";
    const char* backend = "";
    uint64_t bytes = 0;
    std::shared_ptr<const std::vector<int>> group;
  } last;
  std::map<int, Monitor> monitors;
  int next_monitor = 0;
  bool stopping = false;
  std::thread thread;
  std::unique_ptr<Fault> fault;
  std::atomic<bool> failing{false};
  std::atomic<bool> reported{false};  // fail() has printed and kept its report: RankProgress::reported
  std::atomic<bool> settling{false};  // in settle_after_failure: RankProgress::settling
  std::atomic<uint64_t> fired_on{0};  // fail()'s collective: RankProgress::fired_on
  std::atomic<uint64_t> asked{0};     // questions the board has answered: run() asks back once they come
  bool noted = false;                 // note_hang_elsewhere has kept its report (the watchdog's thread)
  // The thread's last gap longer than an asking window (kAskS): how long it did not run, and
  // when it ran again (steady clock, seconds); fail() reports it where it ended after the stuck
  // collective was issued.
  std::atomic<double> gap_s{0}, gap_end_s{0};
  int64_t configs = 0;  // set_context calls so far: the configuration a fault may name
  // The arrival log (the issuing thread's own): a ring of the latest kArrivalSteps steps.
  std::vector<StepArrival> ring;
  size_t ring_next = 0, ring_count = 0;
  int64_t step_index = -1;   // the current step's place in this configuration
  bool step_logged = false;  // the current step has its entry in the ring
  std::chrono::steady_clock::time_point step_start;
  ProgressBoard board;
  std::mutex keep_mutex;  // guards on_abort
  std::function<void(const HangReport&)> on_abort;
};

Watchdog::Watchdog() : state_(std::make_unique<State>()) {}

Watchdog& Watchdog::instance() {
  static Watchdog* w = new Watchdog();  // never destroyed: the thread may outlive static destructors
  return *w;
}

void Watchdog::start(double timeout_s, int rank, int world_size) {
  rank_ = rank;
  if (const char* text = std::getenv("LLMHPC_FAULT"); text && *text) {
    // Several faults, ';' between them, at most one per rank: this rank keeps its own. Every
    // rank parses all of them, so that each refuses a bad one alike.
    std::string rest = text;
    std::vector<int> ranks;
    for (size_t end = 0; end != std::string::npos; rest = rest.substr(end + 1)) {
      end = rest.find(';');
      if (rest.substr(0, end).find_first_not_of(" \t") == std::string::npos)
        throw UsageError("LLMHPC_FAULT='" + std::string(text) + "': an empty fault before or after a ';'");
      const Fault f = parse_fault(rest.substr(0, end), world_size);
      if (std::find(ranks.begin(), ranks.end(), f.rank) != ranks.end())
        throw UsageError("LLMHPC_FAULT='" + std::string(text) + "': two faults for rank " + std::to_string(f.rank) +
                         " (one per rank)");
      ranks.push_back(f.rank);
      if (f.rank == rank) state_->fault = std::make_unique<Fault>(f);
    }
  }
  if (timeout_s <= 0) {
    const Fault* f = state_->fault.get();
    if (f && (f->action == Fault::Stall || f->action == Fault::Diverge))
      std::fprintf(stderr,
                   "llmhpc: note: LLMHPC_FAULT %s rank %d with the watchdog off (--comm-timeout 0): nothing ends the "
                   "job then but its launcher\n",
                   f->action == Fault::Stall ? "stalls" : "diverges", rank);
    return;
  }
  timeout_s_ = timeout_s;
  if (world_size > 1) {
    const std::string closed = state_->board.open(rank, world_size, [this] {
      RankProgress p;
      p.completed = completed_.load();
      p.step = step_.load(std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(state_->mutex);  // the number and its call together (begin)
      p.issued = enqueued_.load();
      p.last_name = state_->last.name;
      p.last_backend = state_->last.backend;
      p.last_bytes = state_->last.bytes;
      if (state_->last.group) p.last_group = rank_ranges(*state_->last.group);
      p.context = *state_->context;
      p.reported = state_->reported.load();
      p.settling = state_->settling.load();
      p.fired_on = state_->fired_on.load();
      state_->asked.fetch_add(1);
      return p;
    });
    if (!closed.empty())
      std::fprintf(stderr, "llmhpc: note: rank %d: %s; a hang report cannot include this rank's answer\n", rank,
                   closed.c_str());
  }
  state_->stopping = false;
  state_->thread = std::thread([this] { run(); });
}

void Watchdog::warn_if_fault_unfired() const {
  if (state_->fault && !state_->fault->fired)
    std::fprintf(stderr,
                 "llmhpc: LLMHPC_FAULT for rank %d never fired: the run reached no collective at its op, config and "
                 "step\n",
                 rank_);
}

void Watchdog::stop() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  state_->taken.notify_all();
  state_->thread.join();
  state_->board.close();
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
  state_->ring_next = state_->ring_count = 0;
  state_->step_index = -1;
  state_->step_logged = false;
}

void Watchdog::set_step(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  State& s = *state_;
  s.step_logged = false;
  if (step < 0) return;
  ++s.step_index;
  s.step_start = std::chrono::steady_clock::now();
}

void Watchdog::note_arrival(std::chrono::steady_clock::time_point now) {
  State& s = *state_;
  const int64_t step = step_.load(std::memory_order_relaxed);
  if (step < 0) return;
  if (s.ring.empty()) s.ring.resize(kArrivalSteps);
  const double t = common_time(now);
  if (!s.step_logged) {
    s.ring[s.ring_next] = {s.step_index, step, common_time(s.step_start), t, t, 0};
    s.ring_next = (s.ring_next + 1) % s.ring.size();
    s.ring_count = std::min(s.ring_count + 1, s.ring.size());
    s.step_logged = true;
  }
  StepArrival& a = s.ring[(s.ring_next + s.ring.size() - 1) % s.ring.size()];
  a.last_s = t;
  ++a.collectives;
}

std::vector<Watchdog::StepArrival> Watchdog::arrivals() const {
  const State& s = *state_;
  std::vector<StepArrival> out;
  out.reserve(s.ring_count);
  for (size_t k = 0; k < s.ring_count; ++k)
    out.push_back(s.ring[(s.ring_next + s.ring.size() - s.ring_count + k) % s.ring.size()]);
  return out;
}

Watchdog::OpPtr Watchdog::begin(const char* name, const char* backend, uint64_t bytes,
                                std::shared_ptr<const std::vector<int>> group) {
  if (!enabled() && !state_->fault) {
    note_arrival(std::chrono::steady_clock::now());
    return nullptr;
  }
  auto op = std::make_shared<Op>();
  op->name = name;
  op->backend = backend;
  op->bytes = bytes;
  op->group = std::move(group);
  op->step = step_.load(std::memory_order_relaxed);
  if (state_->fault) {  // before the collective counts as issued: a stalled rank has not reached it
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      op->context = state_->context;
    }
    op->seq = enqueued_.load() + 1;
    inject(*op);
  }
  op->issued = std::chrono::steady_clock::now();
  note_arrival(op->issued);
  bool drain = false;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->seq = enqueued_.fetch_add(1) + 1;
    state_->last = {name, backend, bytes, op->group};
    op->context = state_->context;
    if (enabled()) state_->incoming.push_back(op);
    drain = state_->incoming.size() == kDrainAt;
    if (state_->incoming.size() >= kWaitAt) {
      state_->wake.notify_all();
      state_->taken.wait(lock, [&] { return state_->incoming.size() < kDrainAt || state_->stopping; });
    }
  }
  if (drain) state_->wake.notify_all();
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
  if (f.fired && f.action == Fault::Delay) {  // a slow rank: every collective from the first on
    std::this_thread::sleep_for(std::chrono::milliseconds(f.code));
    return;
  }
  if (f.fired || f.rank != rank_ || (f.op && op.seq < f.op) || (f.config && state_->configs < f.config) ||
      (f.step >= 0 && op.step < f.step))
    return;
  f.fired = true;
  const std::string code = std::to_string(f.code);
  const std::string what = f.action == Fault::Exit      ? "exits " + code + " before collective"
                           : f.action == Fault::Signal  ? "raises signal " + code + " before collective"
                           : f.action == Fault::Stall   ? "stalls before collective"
                           : f.action == Fault::Diverge ? "issues a barrier of every rank instead of collective"
                           : f.action == Fault::Oom     ? "runs out of memory before collective"
                                                        : "sleeps " + code + " ms before each collective from";
  // On a line of its own, as the watchdog's report: rank 0's progress line may be half written.
  std::fprintf(stderr, "\nllmhpc: fault injection (test only, LLMHPC_FAULT): rank %d %s #%llu %s (%s, %llu bytes)%s\n",
               rank_, what.c_str(), (unsigned long long)op.seq, op.name, op.backend, (unsigned long long)op.bytes,
               op.step < 0 ? "" : (" at step " + std::to_string(op.step) + " of '" + *op.context + "'").c_str());
  std::fflush(stderr);
  if (f.action == Fault::Exit) std::_Exit(f.code);
  if (f.action == Fault::Oom) throw OutOfMemory("an allocation did not fit (injected by LLMHPC_FAULT, a test)");
  if (f.action == Fault::Signal) {  // as if sent from outside: the process's own handlers see it
    std::raise(f.code);
    return;  // a handler that noted it (train stops after the step), or a signal that goes on
  }
  if (f.action == Fault::Delay) {
    std::this_thread::sleep_for(std::chrono::milliseconds(f.code));
    return;
  }
  if (f.action == Fault::Diverge) {  // this number as another collective, which the others never join
    WatchedCall barrier("barrier", 0);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::string Watchdog::describe(const Op& op) const {
  std::string s = "collective #" + std::to_string(op.seq) + " " + call_text(op.name, op.backend, op.bytes);
  if (op.group) s += " among ranks " + rank_ranges(*op.group);
  if (!op.context->empty()) s += " in '" + *op.context + "'";
  if (op.step >= 0) s += " at step " + std::to_string(op.step);
  const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - op.issued).count();
  return s + ", issued " + seconds_text(age) + " ago";
}

namespace {
extern "C" void abort_deadline(int) { _exit(4); }  // async-signal-safe: no destructors, no atexit

// Whether a rank's last issued collective is `op` as this rank issued it: the same name and
// backend, and under NCCL, whose collectives take the same count on every rank, the same bytes
// (a gather's or a host broadcast's bytes differ by rank).
bool same_call(const RankProgress& theirs, const Watchdog::Op& op) {
  if (theirs.last_name != op.name || theirs.last_backend != op.backend) return false;
  return std::string(op.backend).rfind("nccl", 0) != 0 || theirs.last_bytes == op.bytes;
}
}  // namespace

// Which ranks had issued collective report.collective, which had not (with where they are),
// which did not answer, and which issued that number as another collective than `op` (when
// known), into `report`; nothing with one rank.
std::vector<RankAnswer> Watchdog::ask_the_ranks(HangReport& report, const Op* op) const {
  if (!state_->board.opened()) return {};
  const uint64_t seq = report.collective;
  const auto began = std::chrono::steady_clock::now();
  const std::vector<RankAnswer> answers = state_->board.ask_all(kAskS);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::vector<const RankAnswer*> behind, other;
  auto note_host = [](std::vector<std::string>& hosts, const std::string& host) {
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
  };
  // This rank issued the collective, unless it gave its configuration up before it
  // (settle_after_failure).
  const bool self_behind = enqueued_.load() < seq;
  if (self_behind) {
    report.not_reached.push_back(rank_);
    note_host(report.not_reached_hosts, host_name());
  } else {
    report.reached.push_back(rank_);
  }
  for (const RankAnswer& a : answers) {
    if (!a.answered) {
      report.no_answer.push_back(a.rank);
      note_host(report.no_answer_hosts, a.host);
    } else if (a.progress.issued >= seq) {
      report.reached.push_back(a.rank);
      if (op && a.progress.issued == seq && !same_call(a.progress, *op)) other.push_back(&a);
    } else {
      behind.push_back(&a);
      report.not_reached.push_back(a.rank);
      note_host(report.not_reached_hosts, a.host);
    }
  }
  std::sort(report.reached.begin(), report.reached.end());
  std::sort(report.not_reached.begin(), report.not_reached.end());
  std::string s = "  collective #" + std::to_string(seq) + " on every rank (each rank's watchdog asked, " +
                  fmt(took, 1) + " s):\n    reached (issued it): " +
                  (report.reached.empty()
                       ? std::string("none")
                       : std::string(report.reached.size() > 1 ? "ranks " : "rank ") + rank_ranges(report.reached)) +
                  "\n";
  if (self_behind)
    s += "    not reached: rank " + std::to_string(rank_) + " on " + host_name() + " (this rank, last issued #" +
         std::to_string(enqueued_.load()) + ")\n";
  constexpr size_t kListed = 16;
  for (size_t k = 0; k < behind.size() && k < kListed; ++k) {
    const RankAnswer& a = *behind[k];
    const RankProgress& p = a.progress;
    s += "    not reached: rank " + std::to_string(a.rank) + " on " + a.host + " (last issued #" +
         std::to_string(p.issued) + (p.last_name.empty() ? "" : " " + p.last_name) +
         (p.last_group.empty() ? "" : " among ranks " + p.last_group) + ", last completed #" +
         std::to_string(p.completed) + (p.step >= 0 ? ", now at step " + std::to_string(p.step) : "") +
         (p.context.empty() ? "" : " of '" + p.context + "'") + ")" +
         (p.completed == p.issued ? ": inside no collective, so in its own work (computation, I/O, its data) or "
                                    "stopped: look at it on " +
                                        a.host
                                  : "") +
         "\n";
  }
  if (behind.size() > kListed) {
    std::vector<int> rest;
    for (size_t k = kListed; k < behind.size(); ++k) rest.push_back(behind[k]->rank);
    s += "    not reached, too: ranks " + rank_ranges(rest) + "\n";
  }
  if (behind.empty() && !self_behind) s += "    not reached: none of the ranks that answered\n";
  for (size_t k = 0; k < other.size(); ++k) {
    const RankAnswer& a = *other[k];
    report.mismatched.push_back(a.rank);
    if (k < kListed)
      s += "    issued differently: rank " + std::to_string(a.rank) + " on " + a.host + " issued #" +
           std::to_string(seq) + " as " +
           call_text(a.progress.last_name, a.progress.last_backend, a.progress.last_bytes) + ", this rank as " +
           call_text(op->name, op->backend, op->bytes) + "\n";
  }
  if (!other.empty())
    s += "    the ranks' collectives no longer match, so none of them completes: some ranks took another path "
         "(an error or a branch that only they saw) before #" +
         std::to_string(seq) + "\n";
  if (!report.no_answer.empty()) {
    const std::vector<std::string>& hosts = report.no_answer_hosts;  // where they run: the node to look at
    std::string on;
    for (size_t k = 0; k < hosts.size() && k < kListed; ++k) on += (k ? "," : "") + hosts[k];
    if (hosts.size() > kListed) on += ",...";
    s += "    no answer: rank" + std::string(report.no_answer.size() > 1 ? "s " : " ") + rank_ranges(report.no_answer) +
         " on " + on;
    for (const RankAnswer& a : answers)
      if (!a.answered) {  // the reason of the first, as an example
        s += " (rank " + std::to_string(a.rank) + ": " + a.why + ")";
        break;
      }
    s += "\n";
  }
  if (!report.group.empty()) s += group_waits(report, rank_, completed_.load(), answers);
  report.text += s;
  return answers;
}

std::string group_waits(Watchdog::HangReport& report, int self, uint64_t done, const std::vector<RankAnswer>& answers) {
  auto in = [](const std::vector<int>& v, int r) { return std::find(v.begin(), v.end(), r) != v.end(); };
  std::string behind_device;
  report.waited_for.clear();
  for (int r : report.group) {
    if (r == self) continue;
    if (in(report.not_reached, r) || in(report.no_answer, r)) {
      report.waited_for.push_back(r);
      continue;
    }
    for (const RankAnswer& a : answers)
      if (a.rank == r && a.answered && a.progress.completed < done) {
        report.waited_for.push_back(r);
        behind_device += "; rank " + std::to_string(r) + " issued it, but its collectives completed only up to #" +
                         std::to_string(a.progress.completed);
      }
  }
  std::sort(report.waited_for.begin(), report.waited_for.end());
  return "    its group: ranks " + rank_ranges(report.group) + "; of them it waits for " +
         (report.waited_for.empty()
              ? std::string("none (every rank of it issued it)")
              : std::string(report.waited_for.size() > 1 ? "ranks " : "rank ") + rank_ranges(report.waited_for)) +
         behind_device + "\n";
}

void Watchdog::settle_after_failure(const std::string& what) {
  if (!enabled() || !state_->board.opened()) return;
  state_->settling.store(true);
  const uint64_t mine = enqueued_.load();
  std::string context;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    context = *state_->context;
  }
  const auto start = std::chrono::steady_clock::now();
  struct Waiting {  // a rank seen inside a collective past this rank's last, since when
    uint64_t issued = 0, completed = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::map<int, Waiting> waiting;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    bool settled = true;
    for (const RankAnswer& a : state_->board.ask_all(0.5)) {
      const RankProgress& p = a.progress;
      // Not answering (ended, stopped, no board): nothing to tell; failed too, or at the agreement.
      if (!a.answered || p.settling || (p.last_backend == kHostBackend && p.issued > p.completed)) continue;
      settled = false;
      if (p.issued <= mine || p.completed != mine) {
        waiting.erase(a.rank);
        continue;
      }
      Waiting& w = waiting[a.rank];
      if (w.issued != p.issued || w.completed != p.completed) w = {p.issued, p.completed, now};
      if (std::chrono::duration<double>(now - w.since).count() < kAskS) continue;
      state_->settling.store(false);
      fail("'" + context + "': " + what + " on rank " + std::to_string(rank_) + " after its collective #" +
               std::to_string(mine) + ", while rank " + std::to_string(a.rank) + " on " + a.host + " went on into #" +
               std::to_string(mine + 1) +
               (p.issued == mine + 1 ? " " + call_text(p.last_name, p.last_backend, p.last_bytes) : "") +
               " and waits there for rank " + std::to_string(rank_) +
               ", which will not issue it: the ranks gave the configuration up at different points, and the job "
               "cannot go on",
           nullptr);
    }
    if (settled || std::chrono::duration<double>(now - start).count() > timeout_s_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  state_->settling.store(false);
}

// The ranks that were inside a collective when asked (`answers`) fire about now and ask this
// rank too: it goes on answering them (the board's thread) until each says it has reported or
// has ended (refuses the connection), or for one asking window (kAskS) at most; gone at once,
// it would be named as not answering (seen in 2 of 4 hangs on 3 fake nodes). A rank slow to
// answer again is still waited for. Waiting for the window whole made every hang 2 s longer.
void Watchdog::answer_while_others_report(const std::vector<RankAnswer>& answers) const {
  if (!state_->board.opened()) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kAskS));
  // Inside a collective (their own watchdog fires), or behind this one's and inside none (they
  // note it: note_hang_elsewhere).
  const uint64_t fired_on = state_->fired_on.load();
  std::vector<int> waiting;
  for (const RankAnswer& a : answers) {
    const RankProgress& p = a.progress;
    if (a.answered && !p.reported && (p.issued > p.completed || p.issued < fired_on)) waiting.push_back(a.rank);
  }
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (waiting.empty() || left <= 0) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.05, left)));
    for (const RankAnswer& a : state_->board.ask(waiting, std::clamp(left - 0.05, 0.01, 0.5)))
      if ((a.answered && a.progress.reported) || a.refused)
        waiting.erase(std::remove(waiting.begin(), waiting.end(), a.rank), waiting.end());
  }
}

// Run on the watchdog's thread after this rank was asked. A rank inside no collective, whose
// own watchdog therefore never fires, looks for another whose watchdog fired on a collective
// this rank has not issued; it then asks every rank as a firing watchdog does, prints one line,
// keeps that report in its file (the status names the firing rank) and says it has reported.
// Once: the job is ending. Without it, a stalled rank's file read "running".
void Watchdog::note_hang_elsewhere() {
  State& s = *state_;
  const uint64_t mine = enqueued_.load();
  if (s.noted || s.failing.load() || completed_.load() != mine) return;
  const RankAnswer* fired = nullptr;
  const std::vector<RankAnswer> answers = s.board.ask_all(0.5);
  for (const RankAnswer& a : answers)
    if (a.answered && a.progress.fired_on > mine && (!fired || a.progress.fired_on < fired->progress.fired_on))
      fired = &a;
  if (!fired) return;
  s.noted = true;
  const RankProgress& theirs = fired->progress;
  const int64_t step = step_.load();
  std::string context;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    context = *s.context;
  }
  HangReport report;
  report.collective = theirs.fired_on;
  report.fired_on_rank = fired->rank;
  const std::string stuck =
      "collective #" + std::to_string(theirs.fired_on) +
      (theirs.issued == theirs.fired_on ? " " + call_text(theirs.last_name, theirs.last_backend, theirs.last_bytes) +
                                              (theirs.last_group.empty() ? "" : " among ranks " + theirs.last_group)
                                        : "");
  report.what = "rank " + std::to_string(fired->rank) + "'s, on " + fired->host + ", found no progress in " + stuck +
                "; this rank had not issued it (last issued #" + std::to_string(mine) +
                ", inside no collective: in its own work, computation, I/O or its data" +
                (context.empty() ? "" : ", in '" + context + "'") +
                (step >= 0 ? " at step " + std::to_string(step) : "") + ")";
  report.text =
      "llmhpc: rank " + std::to_string(rank_) + " (host " + host_name() + "): the watchdog of " + report.what + "\n";
  ask_the_ranks(report, nullptr);
  const std::string printed = "\nllmhpc: rank " + std::to_string(rank_) + " (host " + host_name() +
                              "): had not issued collective #" + std::to_string(theirs.fired_on) + ", on which rank " +
                              std::to_string(fired->rank) + "'s watchdog fired: inside no collective, in its own work" +
                              (step >= 0 ? " at step " + std::to_string(step) : "") +
                              " (its rank file keeps the report)\n";
  (void)!::write(STDERR_FILENO, printed.data(), printed.size());
  keep_report(report);
}

// The printed report into the rank file (set_on_abort), then RankProgress::reported: the other
// ranks' watchdogs stop waiting for this one.
void Watchdog::keep_report(const HangReport& report) {
  std::function<void(const HangReport&)> keep;
  {
    std::unique_lock<std::mutex> lock(state_->keep_mutex, std::try_to_lock);  // never wait on the main thread
    if (lock.owns_lock()) keep = state_->on_abort;
  }
  if (keep) {
    try {
      keep(report);
    } catch (...) {  // the report is printed: a file that cannot take it changes nothing here
    }
  }
  state_->reported.store(true);
}

void Watchdog::set_on_abort(std::function<void(const HangReport&)> keep) {
  std::lock_guard<std::mutex> lock(state_->keep_mutex);
  state_->on_abort = std::move(keep);
}

void Watchdog::fail(const std::string& what, const Op* op) {
  if (state_->failing.exchange(true)) {  // another thread is already at it
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  note_job_aborting();  // what fails on other threads now is no news: fatal() waits
  // Should anything below hang (MPI_Abort included), the process still ends, with code 4.
  struct sigaction deadline = {};
  deadline.sa_handler = abort_deadline;
  sigemptyset(&deadline.sa_mask);
  sigaction(SIGALRM, &deadline, nullptr);
  alarm(kAbortDeadlineS);
  const std::string host = host_name();
  HangReport report;
  // Late: the thread did not run for a while since the stuck collective was issued (without
  // one, within the last --comm-timeout), so the others asked meanwhile and may have ended.
  const double since = op ? steady_seconds(op->issued) : steady_seconds(std::chrono::steady_clock::now()) - timeout_s_;
  if (state_->gap_s.load() > 0 && state_->gap_end_s.load() > since) report.late_s = state_->gap_s.load();
  report.what = what + (op ? ": " + describe(*op) : "");
  report.collective = op ? op->seq : completed_.load() + 1;
  if (op && op->group) report.group = *op->group;
  report.fired_on_rank = rank_;
  state_->fired_on.store(report.collective);  // before asking: the ranks that have not issued it note it
  report.text = "llmhpc: watchdog on rank " + std::to_string(rank_) + " (host " + host + "): " + report.what +
                "\n  rank " + std::to_string(rank_) + ": last enqueued collective #" +
                std::to_string(enqueued_.load()) + ", last completed #" + std::to_string(completed_.load()) + "\n";
  if (report.late_s > 0)
    report.text += "  rank " + std::to_string(rank_) + ": its watchdog went " + seconds_text(report.late_s) +
                   " without running while the collective waited (the process was stopped or had no CPU): the other "
                   "ranks asked it meanwhile, "
                   "reported and may have ended; their reports are the ones to trust\n";
  const std::vector<RankAnswer> answers = ask_the_ranks(report, op);
  // One write, starting a line of its own: rank 0's progress line may be half written (log_root
  // flushes it as it goes), and a launcher merges every rank's streams into one, where the
  // reports of ranks that fire together must not interleave.
  const std::string printed =
      "\n" + report.text + "  rank " + std::to_string(rank_) + ": aborting the job (MPI_Abort)\n";
  for (size_t at = 0; at < printed.size();) {
    const ssize_t n = ::write(STDERR_FILENO, printed.data() + at, printed.size() - at);
    if (n <= 0) break;
    at += size_t(n);
  }
  keep_report(report);
  answer_while_others_report(answers);
  remove_unpublished_files();
  MPI_Abort(MPI_COMM_WORLD, 4);
  _exit(4);
}

void Watchdog::run() {
  State& s = *state_;
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  // Often enough that a timeout is seen within a tenth of it (and at most 200 ms late).
  const auto interval = std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 0.01, 0.2));
  auto looked = std::chrono::steady_clock::now();
  uint64_t asked_seen = 0;
  for (;;) {
    std::vector<Monitor> monitors;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.wake.wait_for(lock, interval, [&] { return s.stopping || s.incoming.size() >= kDrainAt; });
      if (s.stopping) return;
      // Not run for longer than the others wait for an answer: stopped or starved (HangReport::late_s).
      const auto now = std::chrono::steady_clock::now();
      const double gap = std::chrono::duration<double>(now - looked).count() - interval.count();
      if (gap > kAskS) {
        s.gap_s.store(gap);
        s.gap_end_s.store(steady_seconds(now));
      }
      looked = now;
      for (OpPtr& op : s.incoming) s.in_flight.push_back(std::move(op));
      s.incoming.clear();
      for (auto& [id, m] : s.monitors) monitors.push_back(m);
    }
    s.taken.notify_all();
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
    } else if (const uint64_t asked = s.asked.load(); asked != asked_seen) {
      asked_seen = asked;
      note_hang_elsewhere();
    }
  }
}

}  // namespace llmhpc

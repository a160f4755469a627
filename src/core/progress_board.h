// Where every rank's collectives stand, readable by the other ranks without the help of the
// rank's main thread: the watchdog's side channel for its hang report (src/core/watchdog.h).
//
// When a collective hangs, the main threads are stuck inside it (mpi: in an MPI call, so the
// world communicator cannot take a question; the runtime asks for MPI_THREAD_FUNNELED
// anyway), and the rank that holds the others up may be computing, stalled or stopped. So each
// rank listens on a TCP socket of its own, answered by a small thread: on a connection it
// writes this rank's progress (the last collective it issued, the last it saw complete, its
// step and configuration) and closes. The sockets' addresses (every IPv4 address of the host,
// the port) are exchanged once at start-up with MPI_Allgather. A rank whose watchdog fires asks
// every other rank at once and waits at most a given time: a rank that answers says how far
// it got; a stopped process (SIGSTOP) never answers (the kernel accepts the connection, nobody
// writes), a process that ended refuses it. Works the same under the mpi and nccl backends and
// across nodes wherever the ranks' hosts reach each other over TCP; where a socket cannot be
// opened the board stays closed and the report says so.
//
// Each answer carries a token drawn by rank 0 for the run and the rank's number, so a reply
// from another process that happens to hold the port (another job, another network namespace
// behind the same address) is not taken for the rank's.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llmhpc {

struct RankProgress {
  uint64_t issued = 0;       // the last collective it issued (its sequence number; 0: none yet)
  uint64_t completed = 0;    // the highest number up to which all were complete
  int64_t step = -1;         // the step it is in (-1: between steps)
  std::string last_name;     // the last issued collective's name ("allreduce")
  std::string last_backend;  // its backend ("nccl", "mpi (host)")
  uint64_t last_bytes = 0;   // and its payload
  std::string last_group;    // and the ranks it runs among ("1,3"; "" for every rank)
  std::string context;       // the configuration it is in
  bool reported = false;     // its watchdog fired, or it noted another's, and has printed and kept its report
  uint64_t fired_on = 0;     // the collective its watchdog fired on (its number; 0: not fired)
  bool settling = false;     // its configuration failed; it asks where the others are (Watchdog::settle_after_failure)
};

struct RankAnswer {
  int rank = -1;
  std::string host;  // its hostname, learnt at open()
  bool answered = false;
  bool refused = false;   // not answered: its host refused every connection (the process has ended)
  RankProgress progress;  // when answered
  std::string why;        // when not: "no reply within 2.0 s", "connection refused", ...
};

class ProgressBoard {
 public:
  ProgressBoard();
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // Collective over MPI_COMM_WORLD (every rank calls it): opens this rank's socket, starts the
  // thread that answers with `progress()` (called on that thread; it must not block), and
  // learns every rank's addresses. Returns "" or why this rank's board is closed (asking still
  // works where the others' are open).
  std::string open(int rank, int world_size, std::function<RankProgress()> progress);
  // Stops the answering thread and closes the socket.
  void close();
  // Asks every other rank at once; returns one answer per other rank, in rank order, within
  // about `wait_s`. Any thread; needs nothing from MPI.
  std::vector<RankAnswer> ask_all(double wait_s) const;
  // The same, of `ranks` only: one answer per other rank among them, in rank order.
  std::vector<RankAnswer> ask(const std::vector<int>& ranks, double wait_s) const;
  bool opened() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// "0,2-5,9": ranks as ranges, for reports.
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace llmhpc

// The MPI side of every rank: start-up, who we are, and collective agreement on errors.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llmhpc {

enum class HostReduce { Sum, Min, Max };

// Everything a mode needs of the other ranks on the host side goes through here (or through
// a Communicator for device buffers): modes never call MPI themselves.
struct Runtime {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the ranks of this node (MPI_COMM_TYPE_SHARED)
  int local_size = 1;
  std::string hostname;
  MPI_Comm node_comm = MPI_COMM_NULL;
  // The ranks this Runtime's collectives are over: every rank, or a group of them (group()),
  // and that group's world ranks for the watchdog's reports (null: every rank).
  MPI_Comm comm = MPI_COMM_WORLD;
  std::shared_ptr<const std::vector<int>> world_ranks;

  bool is_root() const { return rank == 0; }
  // Whether this Runtime's ranks are on more than one node (the same answer on each of them).
  bool spans_nodes() const { return local_size < world_size; }

  // Collective over every rank.
  void barrier() const;
  // Element-wise reduction of every rank's values (all ranks pass vectors of one length).
  std::vector<double> reduce_all(const std::vector<double>& mine, HostReduce op) const;
  double reduce_all(double mine, HostReduce op) const;
  int64_t reduce_all(int64_t mine, HostReduce op) const;
  // The sum of every rank's `mine`, added in rank order: bitwise the same on every rank (MPI's
  // own reduction may add in a different order on each, and a sharded optimizer's ranks must
  // agree on the gradient norm they clip by).
  double sum_in_rank_order(double mine) const;
  // `value` as rank `root` has it, on every rank.
  std::string broadcast(const std::string& value, int root = 0) const;
  // The ranks that pass the same `color`, in rank order, as a new MPI communicator (collective:
  // every rank calls it); give it back with free_split(). What a communicator over some of the
  // ranks is made from (CommOptions::parent).
  MPI_Comm split(int color) const;
  static void free_split(MPI_Comm& comm);
  // The ranks that pass the same `color` as a Runtime of their own: rank and world_size within
  // the group, its node the group's ranks on this one (local_rank, local_size), every collective
  // above over its ranks only (what data parallelism runs over under tensor parallelism).
  // Collective; give it back with free_group().
  Runtime group(int color) const;
  static void free_group(Runtime& group) {
    free_split(group.comm);
    free_split(group.node_comm);
  }
  // Every rank's `mine` (any lengths) to rank 0, which gets them one at a time in rank order
  // through `take` (rank, values), so it never holds more than one rank's besides its own;
  // `take` runs on rank 0 only. What a sharded optimizer's state takes to one file.
  void gather_to_root(const std::vector<float>& mine,
                      const std::function<void(int rank, const std::vector<float>& values)>& take) const;

  // Collective over the node: the CPUs this rank may run on (its affinity mask: a launcher may
  // have bound it, as Open MPI binds each of at most 2 ranks to one core) divided among the
  // node's ranks whose masks overlap it; at least 1. What its thread pool should use.
  // `allowed`: this rank's CPUs; `node_allowed`: those of any rank of the node (their masks' union).
  int cpu_share(int* allowed = nullptr, int* node_allowed = nullptr) const;

  // This rank's steady clock against rank 0's, from round trips to rank 0 (NTP's estimate from
  // the round trip of least delay): rank 0's clock reads this rank's plus offset_s, within
  // +- uncertainty_s (half that round trip). At least `round_trips`, and up to 8 times as many
  // while the fastest took over kQuickRoundTripS: ranks that share cores wait for the
  // scheduler's slices, and 8 round trips on 2 busy cores left 5 ms of uncertainty, more than
  // the lateness of a rank 10% slower on a 50 ms step. Rank 0: 0 and 0. Collective.
  struct ClockOffset {
    double offset_s = 0, uncertainty_s = 0;
  };
  static constexpr double kQuickRoundTripS = 100e-6;
  ClockOffset clock_offset(int round_trips = 8) const;
  // MPI_Init_thread (FUNNELED), ranks, node-local rank; registers rank and host for fatal().
  static Runtime init(int* argc, char*** argv);
  void finalize();
};

// The world ranks of `comm`'s ranks, in its rank order, for the watchdog's reports (which ranks
// a stuck collective waits for); null where they are every world rank in order. Not collective.
std::shared_ptr<const std::vector<int>> world_ranks_of(MPI_Comm comm);

// Raised on every rank to leave main() cleanly with `code` after the message was printed.
struct ExitRequest {
  int code;
};

// Collective: every rank passes its own error ("" = fine). If any rank failed, rank 0
// prints the lowest failing rank's message ("llmhpc: error: ...") and every rank throws
// ExitRequest with that rank's `code` (3 where it ran out of memory, 2 for bad input: one exit
// code for the job). Use it at the points where ranks may disagree (files, devices).
void agree_or_exit(const Runtime& rt, const std::string& local_error, int code = 2);

// printf to stdout on rank 0 only, flushed (progress of long runs must show up at once).
void log_root(const Runtime& rt, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace llmhpc

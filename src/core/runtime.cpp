#include "src/core/runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdarg>
#include <cstdio>
#include <thread>
#include <vector>

#include "src/core/check.h"
#include "src/core/host.h"
#include "src/core/watchdog.h"

namespace llmhpc {

Runtime Runtime::init(int* argc, char*** argv) {
  Runtime rt;
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rt.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &rt.world_size));
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rt.rank, MPI_INFO_NULL, &rt.node_comm));
  MPI_CHECK(MPI_Comm_rank(rt.node_comm, &rt.local_rank));
  MPI_CHECK(MPI_Comm_size(rt.node_comm, &rt.local_size));
  rt.hostname = host_name();
  set_fatal_context_rank(rt.rank, rt.hostname);
  // Errors are ours to report: MPI returns codes and MPI_CHECK turns them into fatal().
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  return rt;
}

int Runtime::cpu_share(int* allowed, int* node_allowed) const {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0)  // unknown: every CPU of the host
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()) && c < CPU_SETSIZE; ++c)
      CPU_SET(c, &mine);
  std::vector<cpu_set_t> all(static_cast<size_t>(local_size));
  MPI_CHECK(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, node_comm));
  int sharing = 0;
  cpu_set_t any;
  CPU_ZERO(&any);
  for (cpu_set_t& other : all) {
    cpu_set_t both;
    CPU_AND(&both, &mine, &other);
    sharing += CPU_COUNT(&both) > 0;
    CPU_OR(&any, &any, &other);
  }
  if (allowed) *allowed = CPU_COUNT(&mine);
  if (node_allowed) *node_allowed = CPU_COUNT(&any);
  return std::max(1, CPU_COUNT(&mine) / std::max(1, sharing));
}

Runtime::ClockOffset Runtime::clock_offset(int round_trips) const {
  // Rank 0 answers each rank in turn with its clock's reading until the rank says it is done (a
  // ping of 0); a rank keeps the estimate of its fastest round trip, where the reading's place
  // between sending and receiving is best known.
  using Clock = std::chrono::steady_clock;
  auto now = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  const int tag = 7412;
  WatchedCall watched("clock offset", 0, world_ranks);
  ClockOffset best;
  if (is_root()) {
    for (int r = 1; r < world_size; ++r)
      for (char ping = 1; ping != 0;) {
        MPI_CHECK(MPI_Recv(&ping, 1, MPI_CHAR, r, tag, comm, MPI_STATUS_IGNORE));
        if (ping == 0) break;
        const double t = now();
        MPI_CHECK(MPI_Send(&t, 1, MPI_DOUBLE, r, tag, comm));
      }
    return best;
  }
  double least = std::numeric_limits<double>::infinity();
  for (int k = 0; k < 8 * round_trips && (k < round_trips || least > kQuickRoundTripS); ++k) {
    const char ping = 1;
    double theirs = 0;
    const double sent = now();
    MPI_CHECK(MPI_Send(&ping, 1, MPI_CHAR, 0, tag, comm));
    MPI_CHECK(MPI_Recv(&theirs, 1, MPI_DOUBLE, 0, tag, comm, MPI_STATUS_IGNORE));
    const double back = now();
    if (back - sent < least) {
      least = back - sent;
      best = {theirs - (sent + back) / 2, least / 2};
    }
  }
  const char done = 0;
  MPI_CHECK(MPI_Send(&done, 1, MPI_CHAR, 0, tag, comm));
  return best;
}

void Runtime::finalize() {
  if (node_comm != MPI_COMM_NULL) MPI_Comm_free(&node_comm);
  // Every rank arrives here together (a rank that fails alone aborts the job instead), so a
  // barrier costs microseconds. Open MPI 4.1's MPI_Finalize now and then crashes in its PMIx
  // progress thread (https://github.com/open-mpi/ompi/issues/10117; a rank under srun
  // --mpi=pmix on fake nodes, once in about ten runs of test_fake_nodes); ompi #10313 reports
  // that a barrier before it avoids such crashes.
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
}

namespace {
MPI_Op mpi_op(HostReduce op) { return op == HostReduce::Sum ? MPI_SUM : op == HostReduce::Min ? MPI_MIN : MPI_MAX; }
}  // namespace

// Host collectives register with the watchdog too: a rank that stalls between
// configurations leaves the others in one of these.
void Runtime::barrier() const {
  WatchedCall watched("barrier", 0, world_ranks);
  MPI_CHECK(MPI_Barrier(comm));
}

std::vector<double> Runtime::reduce_all(const std::vector<double>& mine, HostReduce op) const {
  std::vector<double> out(mine.size());
  WatchedCall watched("allreduce", mine.size() * sizeof(double), world_ranks);
  MPI_CHECK(MPI_Allreduce(mine.data(), out.data(), int(mine.size()), MPI_DOUBLE, mpi_op(op), comm));
  return out;
}

double Runtime::reduce_all(double mine, HostReduce op) const { return reduce_all(std::vector<double>{mine}, op)[0]; }

int64_t Runtime::reduce_all(int64_t mine, HostReduce op) const {
  int64_t out = 0;
  WatchedCall watched("allreduce", sizeof out, world_ranks);
  MPI_CHECK(MPI_Allreduce(&mine, &out, 1, MPI_INT64_T, mpi_op(op), comm));
  return out;
}

MPI_Comm Runtime::split(int color) const {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm, color, rank, &out));
  return out;
}

void Runtime::free_split(MPI_Comm& comm) {
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

Runtime Runtime::group(int color) const {
  Runtime g = *this;
  g.comm = split(color);
  MPI_CHECK(MPI_Comm_rank(g.comm, &g.rank));
  MPI_CHECK(MPI_Comm_size(g.comm, &g.world_size));
  MPI_CHECK(MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &g.node_comm));
  MPI_CHECK(MPI_Comm_rank(g.node_comm, &g.local_rank));
  MPI_CHECK(MPI_Comm_size(g.node_comm, &g.local_size));
  g.world_ranks = world_ranks_of(g.comm);
  return g;
}

std::shared_ptr<const std::vector<int>> world_ranks_of(MPI_Comm comm) {
  int size = 0, world_size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_CHECK(MPI_Comm_group(comm, &group));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> mine(static_cast<size_t>(size)), theirs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) mine[size_t(r)] = r;
  MPI_CHECK(MPI_Group_translate_ranks(group, size, mine.data(), world, theirs.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (size == world_size && theirs == mine) return nullptr;
  return std::make_shared<const std::vector<int>>(std::move(theirs));
}

double Runtime::sum_in_rank_order(double mine) const {
  std::vector<double> all(static_cast<size_t>(world_size));
  WatchedCall watched("allgather", sizeof mine, world_ranks);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm));
  double sum = 0;
  for (double v : all) sum += v;
  return sum;
}

void Runtime::gather_to_root(const std::vector<float>& mine,
                             const std::function<void(int, const std::vector<float>&)>& take) const {
  // Point to point in pieces of at most 2^28 floats: MPI counts are ints.
  constexpr size_t kPiece = size_t(1) << 28;
  const int tag = 7411;
  WatchedCall watched("gather to rank 0", mine.size() * sizeof(float), world_ranks);
  if (!is_root()) {
    const int64_t n = int64_t(mine.size());
    MPI_CHECK(MPI_Send(&n, 1, MPI_INT64_T, 0, tag, comm));
    for (size_t at = 0; at < mine.size(); at += kPiece)
      MPI_CHECK(MPI_Send(mine.data() + at, int(std::min(kPiece, mine.size() - at)), MPI_FLOAT, 0, tag, comm));
    return;
  }
  take(0, mine);
  std::vector<float> theirs;
  for (int r = 1; r < world_size; ++r) {
    int64_t n = 0;
    MPI_CHECK(MPI_Recv(&n, 1, MPI_INT64_T, r, tag, comm, MPI_STATUS_IGNORE));
    theirs.resize(size_t(n));
    for (size_t at = 0; at < theirs.size(); at += kPiece)
      MPI_CHECK(MPI_Recv(theirs.data() + at, int(std::min(kPiece, theirs.size() - at)), MPI_FLOAT, r, tag, comm,
                         MPI_STATUS_IGNORE));
    take(r, theirs);
  }
}

void agree_or_exit(const Runtime& rt, const std::string& local_error, int code) {
  int mine = local_error.empty() ? rt.world_size : rt.rank;
  int first = rt.world_size;
  WatchedCall watched("agree on errors", sizeof mine, rt.world_ranks);
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, rt.comm));
  if (first == rt.world_size) return;
  // Bring the first failing rank's exit code, host and message to every rank; rank 0 prints them.
  const std::string got = rt.broadcast(std::to_string(code) + "\n" + rt.hostname + "\n" + local_error, first);
  const size_t code_end = got.find('\n'), host_end = got.find('\n', code_end + 1);
  if (rt.is_root()) {
    // As AgreedError's message reads where rank 0 found it; another rank is named, with its host
    // (a file missing on one node).
    const std::string host = got.substr(code_end + 1, host_end - code_end - 1);
    const std::string where = first != 0 ? " (rank " + std::to_string(first) + " on " + host + ")" : "";
    std::fprintf(stderr, "llmhpc: error%s: %s\n", where.c_str(), got.substr(host_end + 1).c_str());
    std::fflush(stderr);
  }
  throw ExitRequest{std::stoi(got.substr(0, code_end))};
}

std::string Runtime::broadcast(const std::string& value, int root) const {
  WatchedCall watched("broadcast", value.size(), world_ranks);
  int len = static_cast<int>(value.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, root, comm));
  std::string out = value;
  out.resize(size_t(len));
  MPI_CHECK(MPI_Bcast(out.data(), len, MPI_CHAR, root, comm));
  return out;
}

void log_root(const Runtime& rt, const char* fmt, ...) {
  if (!rt.is_root()) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fflush(stdout);
}

}  // namespace llmhpc

#include "src/core/progress_board.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "src/core/host.h"
#include "src/core/table.h"

namespace llmhpc {

namespace {

constexpr uint64_t kMagic = 0x4c4c4d4850435042ull;  // "LLMHPCPB"
constexpr int kMaxAddresses = 8;
constexpr size_t kMaxAttempts = 512;  // sockets open at once while asking
constexpr int32_t kReported = 1;      // Wire::flags: RankProgress::reported
constexpr int32_t kSettling = 2;      // Wire::flags: RankProgress::settling

// One rank's answer on the wire (host byte order: the ranks of a job share an architecture).
struct Wire {
  uint64_t magic;
  uint64_t token;
  int32_t rank;
  int32_t flags;  // kReported
  uint64_t issued, completed;
  int64_t step;
  char name[32];
  char backend[24];
  uint64_t bytes;
  char context[144];
  char group[64];  // rank ranges, "" for every rank
  uint64_t fired_on;
};
static_assert(sizeof(Wire) == 328, "the answer's layout");

// Where a rank listens: its host's IPv4 addresses (network order; the loopback one last) and
// its port.
struct Address {
  uint32_t ip[kMaxAddresses];
  int32_t count;
  int32_t port;   // 0: no board on that rank
  char host[64];  // its hostname: which node to look at
};

void copy_text(char* to, size_t size, const std::string& from) {
  const size_t n = std::min(size - 1, from.size());
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

// Rank ranges ("0,2-5,9") cut at a comma where they do not fit, ",..." marking the cut: a list
// cut inside a number would name a wrong rank (a strided group of 32 ranks is about 120 characters).
void copy_ranks(char* to, size_t size, const std::string& from) {
  if (from.size() < size) return copy_text(to, size, from);
  const size_t comma = from.rfind(',', size - 5);  // room for ",..." and the terminator
  copy_text(to, size, (comma == std::string::npos ? std::string() : from.substr(0, comma)) + ",...");
}

std::vector<uint32_t> host_addresses() {
  std::vector<uint32_t> outside, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
      const uint32_t ip = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
      auto& to = (a->ifa_flags & IFF_LOOPBACK) ? loopback : outside;
      if (std::find(to.begin(), to.end(), ip) == to.end()) to.push_back(ip);
    }
    freeifaddrs(list);
  }
  if (loopback.empty()) loopback.push_back(htonl(INADDR_LOOPBACK));
  outside.resize(std::min(outside.size(), size_t(kMaxAddresses - 1)));
  outside.push_back(loopback.front());
  return outside;
}

}  // namespace

struct ProgressBoard::State {
  int rank = -1, world = 1;
  uint64_t token = 0;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread server;
  std::function<RankProgress()> progress;
  std::vector<Address> addresses;  // every rank's

  void serve() {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    for (;;) {
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      if (!(fds[0].revents & POLLIN)) continue;
      const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      timeval limit{1, 0};
      setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      const RankProgress p = progress();
      Wire w{};
      w.magic = kMagic;
      w.token = token;
      w.rank = rank;
      w.flags = (p.reported ? kReported : 0) | (p.settling ? kSettling : 0);
      w.issued = p.issued;
      w.completed = p.completed;
      w.step = p.step;
      copy_text(w.name, sizeof w.name, p.last_name);
      copy_text(w.backend, sizeof w.backend, p.last_backend);
      w.bytes = p.last_bytes;
      copy_text(w.context, sizeof w.context, p.context);
      copy_ranks(w.group, sizeof w.group, p.last_group);
      w.fired_on = p.fired_on;
      (void)send(c, &w, sizeof w, MSG_NOSIGNAL);
      ::close(c);
    }
  }
};

ProgressBoard::ProgressBoard() : state_(std::make_unique<State>()) {}
ProgressBoard::~ProgressBoard() { close(); }

bool ProgressBoard::opened() const { return !state_->addresses.empty(); }

std::string ProgressBoard::open(int rank, int world_size, std::function<RankProgress()> progress) {
  State& s = *state_;
  s.rank = rank;
  s.world = world_size;
  s.progress = std::move(progress);
  std::string error;
  Address mine{};
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = 0;
  socklen_t len = sizeof any;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&any), &len) != 0 || pipe2(s.wake, O_CLOEXEC) != 0) {
    error = std::string("cannot listen on a TCP socket: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
  } else {
    s.listen_fd = fd;
    const std::vector<uint32_t> ips = host_addresses();
    mine.count = int32_t(ips.size());
    std::copy(ips.begin(), ips.end(), mine.ip);
    mine.port = ntohs(any.sin_port);
  }
  const std::string host = host_name();
  copy_text(mine.host, sizeof mine.host, host.empty() ? "?" : host);
  // The run's token: rank 0 draws it; every rank learns every address.
  uint64_t token =
      rank == 0 ? (uint64_t(std::random_device{}()) << 32) ^ uint64_t(std::random_device{}()) ^ uint64_t(getpid()) : 0;
  MPI_Bcast(&token, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  s.token = token;
  s.addresses.assign(size_t(world_size), Address{});
  MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, s.addresses.data(), int(sizeof mine), MPI_BYTE, MPI_COMM_WORLD);
  if (s.listen_fd >= 0) s.server = std::thread([&s] { s.serve(); });
  return error;
}

void ProgressBoard::close() {
  State& s = *state_;
  if (s.server.joinable()) {
    const char byte = 1;
    (void)write(s.wake[1], &byte, 1);
    s.server.join();
  }
  for (int* fd : {&s.listen_fd, &s.wake[0], &s.wake[1]})
    if (*fd >= 0) ::close(*fd), *fd = -1;
  s.addresses.clear();
}

std::vector<RankAnswer> ProgressBoard::ask_all(double wait_s) const {
  std::vector<int> others;
  for (int r = 0; r < state_->world; ++r)
    if (r != state_->rank) others.push_back(r);
  return ask(others, wait_s);
}

std::vector<RankAnswer> ProgressBoard::ask(const std::vector<int>& ranks, double wait_s) const {
  const State& s = *state_;
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  struct Peer {
    RankAnswer answer;
    int open = 0;            // attempts still open
    bool connected = false;  // some attempt connected
    bool started = false;
    bool unreachable = false;  // some attempt found no route to its host (a link down)
  };
  auto no_route = [](int err) {
    return err == ENETUNREACH || err == EHOSTUNREACH || err == ENETDOWN || err == EHOSTDOWN || err == ETIMEDOUT;
  };
  auto ended_or_cut = [](RankAnswer& a, bool unreachable) {  // every attempt failed
    a.why = unreachable ? "no route to its host (it is unreachable)" : "connection refused (the process has ended?)";
    a.refused = !unreachable;
  };
  struct Attempt {
    int fd;
    size_t peer;
    bool connected = false;
    size_t got = 0;
    Wire wire{};
  };
  std::vector<int> asked = ranks;  // in rank order, each once
  std::sort(asked.begin(), asked.end());
  asked.erase(std::unique(asked.begin(), asked.end()), asked.end());
  std::vector<Peer> peers;
  for (int r : asked)
    if (r != s.rank && r >= 0 && size_t(r) < s.addresses.size()) {
      peers.emplace_back();
      peers.back().answer.rank = r;
      peers.back().answer.host = s.addresses[size_t(r)].host;
    }
  std::vector<Attempt> attempts;
  auto finish = [&](Attempt& a) {
    if (a.fd >= 0) ::close(a.fd), a.fd = -1, --peers[a.peer].open;
  };
  size_t next = 0;  // the next peer to start
  auto start = [&](size_t i) {
    Peer& p = peers[i];
    p.started = true;
    const Address& to = s.addresses[size_t(p.answer.rank)];
    if (to.port == 0) {
      p.answer.why = "no board on that rank (it could not listen)";
      return;
    }
    for (int k = 0; k < to.count && k < kMaxAddresses; ++k) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      sockaddr_in at{};
      at.sin_family = AF_INET;
      at.sin_addr.s_addr = to.ip[k];
      at.sin_port = htons(uint16_t(to.port));
      if (connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 && errno != EINPROGRESS) {
        p.unreachable = p.unreachable || no_route(errno);
        ::close(fd);
        continue;
      }
      attempts.push_back({fd, i});
      ++p.open;
    }
    if (p.open == 0) ended_or_cut(p.answer, p.unreachable);
  };
  for (;;) {
    // Start peers while there is room, then drop finished attempts.
    size_t live = 0;
    for (const Attempt& a : attempts) live += a.fd >= 0;
    while (next < peers.size() && live + kMaxAddresses <= kMaxAttempts) {
      start(next++);
      live = 0;
      for (const Attempt& a : attempts) live += a.fd >= 0;
    }
    attempts.erase(std::remove_if(attempts.begin(), attempts.end(), [](const Attempt& a) { return a.fd < 0; }),
                   attempts.end());
    const auto now = Clock::now();
    if ((attempts.empty() && next == peers.size()) || now >= deadline) break;
    std::vector<pollfd> fds;
    for (const Attempt& a : attempts) fds.push_back({a.fd, short(a.connected ? POLLIN : POLLOUT), 0});
    const int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    if (poll(fds.data(), fds.size(), std::min(ms, 50)) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      Attempt& a = attempts[k];
      Peer& p = peers[a.peer];
      if (!fds[k].revents) continue;
      if (p.answer.answered) {
        finish(a);
        continue;
      }
      if (!a.connected) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          p.unreachable = p.unreachable || no_route(err);
          finish(a);
          continue;
        }
        a.connected = p.connected = true;
        continue;
      }
      const ssize_t n = recv(a.fd, reinterpret_cast<char*>(&a.wire) + a.got, sizeof a.wire - a.got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        finish(a);
        continue;
      }
      a.got += size_t(n);
      if (a.got < sizeof a.wire) continue;
      const Wire& w = a.wire;
      if (w.magic == kMagic && w.token == s.token && w.rank == p.answer.rank) {
        p.answer.answered = true;
        p.answer.progress.issued = w.issued;
        p.answer.progress.completed = w.completed;
        p.answer.progress.step = w.step;
        p.answer.progress.last_name.assign(w.name, strnlen(w.name, sizeof w.name));
        p.answer.progress.last_backend.assign(w.backend, strnlen(w.backend, sizeof w.backend));
        p.answer.progress.last_bytes = w.bytes;
        p.answer.progress.context.assign(w.context, strnlen(w.context, sizeof w.context));
        p.answer.progress.last_group.assign(w.group, strnlen(w.group, sizeof w.group));
        p.answer.progress.reported = (w.flags & kReported) != 0;
        p.answer.progress.settling = (w.flags & kSettling) != 0;
        p.answer.progress.fired_on = w.fired_on;
      }
      finish(a);
    }
    for (Attempt& a : attempts)  // a peer answered: its other attempts go
      if (a.fd >= 0 && peers[a.peer].answer.answered) finish(a);
  }
  std::vector<RankAnswer> out;
  for (Peer& p : peers) {
    if (!p.answer.answered && p.answer.why.empty()) {
      const std::string waited = fmt(wait_s, 1) + " s";
      if (!p.started) p.answer.why = "not asked: the " + waited + " ran out first";
      else if (p.connected)
        p.answer.why = "no reply within " + waited + " (a stopped process accepts and never answers)";
      else if (p.open > 0) p.answer.why = "no connection within " + waited + " (its host is unreachable?)";
      else ended_or_cut(p.answer, p.unreachable);
    }
    out.push_back(std::move(p.answer));
  }
  for (Attempt& a : attempts) finish(a);
  return out;
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::vector<int> r = ranks;
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(r[i]) + (j > i ? "-" + std::to_string(r[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace llmhpc

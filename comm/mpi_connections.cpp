#include "comm/mpi_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "comm/nccl_log.h"
#include "src/core/units.h"

namespace llmhpc {

namespace {

// "0100007F" (IPv4) or 32 hex digits (IPv6), as the kernel prints an address in /proc/net/tcp:
// each 32-bit word of the address in network order, printed as a host integer; so each word
// read back as a host integer lays out the address's bytes again, on any byte order.
std::string address_text(const std::string& hex) {
  if (hex.size() != 8 && hex.size() != 32) return "";
  unsigned char bytes[16];
  for (size_t word = 0; word < hex.size() / 8; ++word) {
    const uint32_t value = uint32_t(std::strtoul(hex.substr(word * 8, 8).c_str(), nullptr, 16));
    std::memcpy(bytes + 4 * word, &value, 4);
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(hex.size() == 8 ? AF_INET : AF_INET6, bytes, text, sizeof text) == nullptr) return "";
  std::string out = text;
  if (out.rfind("::ffff:", 0) == 0 && out.find('.') != std::string::npos) out.erase(0, 7);  // IPv4 in IPv6
  return out;
}

bool loopback(const std::string& address) { return address.rfind("127.", 0) == 0 || address == "::1"; }

// Each established connection of one of `inodes` in a /proc/net/tcp text: (local, remote) address.
std::vector<std::pair<std::string, std::string>> established(const std::string& table,
                                                             const std::set<unsigned long>& inodes) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, skip;
    unsigned long inode = 0;
    fields >> slot >> local >> remote >> state;
    for (int i = 0; i < 5; ++i) fields >> skip;  // tx:rx queues, timer, retransmits, uid, timeout
    fields >> inode;
    if (!fields || state != "01" || inodes.count(inode) == 0) continue;  // 01: TCP_ESTABLISHED
    out.emplace_back(address_text(local.substr(0, local.find(':'))), address_text(remote.substr(0, remote.find(':'))));
  }
  return out;
}

std::string file_text(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<unsigned long> socket_inodes() {
  std::set<unsigned long> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (const dirent* entry = readdir(dir)) {
    char target[64] = {};
    const std::string link = std::string("/proc/self/fd/") + entry->d_name;
    if (readlink(link.c_str(), target, sizeof target - 1) > 0 && std::strncmp(target, "socket:[", 8) == 0)
      out.insert(std::strtoul(target + 8, nullptr, 10));
  }
  closedir(dir);
  return out;
}

std::map<std::string, std::string> host_addresses() {
  std::map<std::string, std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const int family = a->ifa_addr->sa_family;
    const void* address =
        family == AF_INET    ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
        : family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr)
                             : nullptr;
    if (address != nullptr && inet_ntop(family, address, text, sizeof text) != nullptr) out.emplace(text, a->ifa_name);
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

Attrs MpiConnections::attrs() const {
  Attrs out;
  if (!transports.empty()) out.emplace_back("mpi_transports", join(transports, ","));
  if (!interfaces.empty()) out.emplace_back("mpi_interfaces", join(interfaces, ","));
  return out;
}

MpiConnections read_mpi_connections(const ProcessView& view) {
  // Shared memory: Open MPI maps its own segment and, once it has talked to them, those of the
  // node's other ranks (vader_segment.HOST.JOB.RANK in Open MPI 4, sm_segment.* in 5).
  std::set<std::string> segments;
  bool verbs = false;
  std::istringstream lines(view.maps);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t path = line.find(" /");
    if (path == std::string::npos) continue;
    const std::string file = line.substr(path + 1);
    const std::string name = file.substr(file.rfind('/') + 1);
    if (name.rfind("vader_segment.", 0) == 0 || name.rfind("sm_segment.", 0) == 0) segments.insert(name);
    if (file.rfind("/dev/infiniband/uverbs", 0) == 0) verbs = true;
  }
  MpiConnections out;
  if (segments.size() > 1) append_once(out.transports, "shared memory");
  bool tcp = false;
  for (const std::string* table : {&view.tcp, &view.tcp6}) {
    for (const auto& [local, remote] : established(*table, view.socket_inodes)) {
      if (remote.empty() || loopback(remote) || view.host_addresses.count(remote) != 0) continue;
      tcp = true;
      const auto named = view.host_addresses.find(local);
      if (named != view.host_addresses.end()) append_once(out.interfaces, named->second);
    }
  }
  if (tcp) append_once(out.transports, "tcp");
  if (verbs) append_once(out.transports, "verbs");
  return out;
}

ProcessView this_process() {
  ProcessView view;
  view.maps = file_text("/proc/self/maps");
  view.tcp = file_text("/proc/self/net/tcp");
  view.tcp6 = file_text("/proc/self/net/tcp6");
  view.socket_inodes = socket_inodes();
  view.host_addresses = host_addresses();
  return view;
}

Attrs mpi_connections() { return nccl_started() ? Attrs{} : read_mpi_connections(this_process()).attrs(); }

}  // namespace llmhpc

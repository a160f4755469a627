// How the MPI library reached this rank's peers, as the operating system shows it: MPI's own
// interfaces name only the transports a user asked for (Open MPI's MPI_T gives the btl and
// pml selections, "^openib"), not the ones it opened. At the run's end this process's memory
// maps and sockets say it: another rank's shared-memory segment mapped (Open MPI's vader or sm
// transport), a TCP connection to another host's address (its interface named), an InfiniBand
// verbs device mapped (openib, UCX, libfabric).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/core/attrs.h"

namespace llmhpc {

struct MpiConnections {
  std::vector<std::string> transports;  // "shared memory", "tcp", "verbs": each once, in that order
  std::vector<std::string> interfaces;  // the interfaces of the TCP connections, "eth0": each once

  // mpi_transports and mpi_interfaces (comma-separated), those that were seen.
  Attrs attrs() const;
};

// What the process shows (the texts of /proc/self/maps, /proc/self/net/tcp and tcp6), the
// inodes of its own sockets (/proc/self/fd), and this host's addresses with their interfaces
// ("10.0.0.2" -> "eth0"): established connections of other sockets (another process's in the
// same network namespace) and connections to this host's own addresses (a launcher's daemon)
// are not MPI's peers.
struct ProcessView {
  std::string maps, tcp, tcp6;
  std::set<unsigned long> socket_inodes;
  std::map<std::string, std::string> host_addresses;
};
MpiConnections read_mpi_connections(const ProcessView& view);
// This process's, now (Linux's /proc and getifaddrs; what cannot be read is left empty).
ProcessView this_process();

// This process's, now; empty where NCCL was started in it (its bootstrap and socket transport
// open TCP connections of their own, which cannot be told from MPI's) or nothing is readable.
Attrs mpi_connections();

}  // namespace llmhpc

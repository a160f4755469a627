// NCCL's account of how it connected the ranks, read from its own log: the network it chose
// ("Socket", "IB"), the interfaces that network uses, and the transport of each channel between
// two ranks (P2P over NVLink or PCIe, SHM, NET), which NCCL reports nowhere else. NCCL prints
// nothing by default (NCCL_DEBUG unset), so before its first call capture_nccl_log() points
// its INFO output of the init and net subsystems at a file of this process; a user's own
// NCCL_DEBUG or NCCL_DEBUG_FILE is left as it is, and then nothing is read.
#pragma once
#include <string>
#include <vector>

#include "src/core/attrs.h"

namespace llmhpc {

struct NcclConnections {
  std::string network;                  // "Socket", "IB"
  std::vector<std::string> interfaces;  // "eth0", "mlx5_0": each once, in the order NCCL named them
  // "P2P/CUMEM/read", "SHM/direct/direct", "NET/Socket": each channel's "via ...", its
  // device numbers left out, each once
  std::vector<std::string> transports;

  // Takes what one line of NCCL's log says (lines of other kinds are ignored).
  void add_line(const std::string& line);
  // nccl_network, nccl_interfaces and nccl_transports (comma-separated), those that were seen.
  Attrs attrs() const;
};

// Before NCCL's first call in this process: unless NCCL_DEBUG or NCCL_DEBUG_FILE is set, sets
// NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET and NCCL_DEBUG_FILE to a file of this process in
// TMPDIR (or /tmp). Returns whether it did (once per process; later calls return the same).
bool capture_nccl_log();
// Whether NCCL was started in this process (capture_nccl_log was called, before its first call).
bool nccl_started();
// Reads what NCCL logged since the last read (a communicator's init: the network; its first
// collectives: the channels, which NCCL connects then). The first read removes the file's name
// (NCCL keeps it open), so that no file outlives the process, even one killed. Nothing without
// capture_nccl_log().
void read_nccl_log();
// What NCCL logged until now (NcclConnections::attrs); empty where nothing was captured.
Attrs nccl_connections();

}  // namespace llmhpc

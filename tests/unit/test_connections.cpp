// How the ranks were connected, as the rank files record it. MPI's (comm/mpi_connections.h):
// read from what the process shows, texts as Linux writes /proc/self/maps and
// /proc/self/net/tcp{,6} (lines taken from Open MPI 4.1 ranks) and the process's own view.
// NCCL's (comm/nccl_log.h): what its INFO lines say is read into the network, interfaces and
// transports; the log goes to a file of the process, which leaves no name behind, and a user's
// own NCCL_DEBUG is left alone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/mpi_connections.h"
#include "comm/nccl_log.h"

namespace llmhpc {
namespace {

std::string attr(const Attrs& attrs, const std::string& name) {
  for (const auto& [key, value] : attrs)
    if (key == name) return std::get<std::string>(value);
  return "(absent)";
}

const char* kTcpHeader =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

// A rank on node0 (10.77.0.2) with 2 ranks of its node and 1 on node1 (10.77.0.3).
ProcessView two_nodes() {
  ProcessView v;
  v.maps = "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234 /usr/bin/llmhpc\n"
           "7f2c10000000-7f2c10400000 rw-s 00000000 00:1a 200 /dev/shm/vader_segment.node0.0.43e00001.0\n"
           "7f2c10400000-7f2c10800000 rw-s 00000000 00:1a 201 /dev/shm/vader_segment.node0.0.43e00001.1\n"
           "7f2c11000000-7f2c11001000 rw-s 00000000 00:2b 9 /tmp/ompi.node0.0/pid.7/pmix_dstor_ds21_7/smseg-1-0\n"
           "7ffd1e3c0000-7ffd1e3e1000 rw-p 00000000 00:00 0                          [stack]\n";
  v.tcp = std::string(kTcpHeader) +
          // to the launcher's daemon on loopback
          "   5: 0100007F:C7D2 0100007F:8313 01 00000000:00000000 00:00000000 00000000     0        0 11 3 0 20 4\n"
          // MPI's listening socket
          "   2: 00000000:0403 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12 1 0 100 0\n"
          // to node1's rank (10.77.0.3:1026), from 10.77.0.2
          "  47: 02004D0A:E6AD 03004D0A:0402 01 00000000:00000016 00:00000000 00000000     0        0 13 2 0 20 4\n"
          // another process's connection to node1 (not one of ours)
          "  48: 02004D0A:E6AE 03004D0A:0402 01 00000000:00000000 00:00000000 00000000     0        0 99 2 0 20 4\n";
  v.tcp6 = std::string(kTcpHeader) +
           "   1: 00000000000000000000000000000000:0401 00000000000000000000000000000000:0000 0A "
           "00000000:00000000 00:00000000 00000000     0        0 14 1 0 100 0\n";
  v.socket_inodes = {11, 12, 13, 14};
  v.host_addresses = {{"127.0.0.1", "lo"}, {"10.77.0.2", "eth0"}, {"::1", "lo"}};
  return v;
}

TEST(MpiConnections, SharedMemoryWithinANodeAndTcpToAnother) {
  const Attrs a = read_mpi_connections(two_nodes()).attrs();
  EXPECT_EQ(attr(a, "mpi_transports"), "shared memory,tcp");
  EXPECT_EQ(attr(a, "mpi_interfaces"), "eth0");
}

TEST(MpiConnections, OwnSegmentAloneIsNoSharedMemory) {
  ProcessView v = two_nodes();
  v.maps = "7f2c10000000-7f2c10400000 rw-s 00000000 00:1a 200 /dev/shm/vader_segment.node1.0.43e00001.0\n";
  EXPECT_EQ(attr(read_mpi_connections(v).attrs(), "mpi_transports"), "tcp");
}

TEST(MpiConnections, ConnectionsWithinThisHostAreNotPeersOnAnother) {
  ProcessView v = two_nodes();
  v.host_addresses.emplace("10.77.0.3", "eth1");  // the peer's address is this host's own
  EXPECT_EQ(attr(read_mpi_connections(v).attrs(), "mpi_transports"), "shared memory");
  EXPECT_EQ(attr(read_mpi_connections(v).attrs(), "mpi_interfaces"), "(absent)");
  v.socket_inodes = {11, 12, 14};  // or the connection to node1 is not this process's
  v.host_addresses.erase("10.77.0.3");
  EXPECT_EQ(attr(read_mpi_connections(v).attrs(), "mpi_transports"), "shared memory");
}

TEST(MpiConnections, Ipv6AndIpv4MappedPeers) {
  ProcessView v;
  // fd00::2 -> fd00::3, and ::ffff:10.77.0.2 -> ::ffff:10.77.0.3, both established.
  v.tcp6 = std::string(kTcpHeader) +
           "   0: 000000FD000000000000000002000000:D431 000000FD000000000000000003000000:0402 01 "
           "00000000:00000000 00:00000000 00000000     0        0 21 1 0 20 4\n"
           "   1: 0000000000000000FFFF000002004D0A:D432 0000000000000000FFFF000003004D0A:0402 01 "
           "00000000:00000000 00:00000000 00000000     0        0 22 1 0 20 4\n";
  v.socket_inodes = {21, 22};
  v.host_addresses = {{"fd00::2", "eth1"}, {"10.77.0.2", "eth0"}};
  const Attrs a = read_mpi_connections(v).attrs();
  EXPECT_EQ(attr(a, "mpi_transports"), "tcp");
  EXPECT_EQ(attr(a, "mpi_interfaces"), "eth1,eth0");
}

TEST(MpiConnections, VerbsDevicesMapped) {
  ProcessView v;
  v.maps = "7f2c12000000-7f2c12001000 rw-s 00000000 00:06 400 /dev/infiniband/uverbs0\n";
  EXPECT_EQ(attr(read_mpi_connections(v).attrs(), "mpi_transports"), "verbs");
}

TEST(MpiConnections, NothingSeenIsNothingRecorded) { EXPECT_TRUE(read_mpi_connections(ProcessView{}).attrs().empty()); }

// The live view reads what Linux shows: a TCP connection this process made over loopback is
// among its sockets and established in its table, and loopback is named lo. NCCL was not
// started yet (the tests below start it), so the process's connections are read.
TEST(MpiConnections, ThisProcessIsReadFromProc) {
  const int server = socket(AF_INET, SOCK_STREAM, 0), client = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(server, 1), 0);
  ASSERT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&address), &size), 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  struct stat info {};
  ASSERT_EQ(fstat(client, &info), 0);
  const ProcessView view = this_process();
  EXPECT_EQ(view.socket_inodes.count(info.st_ino), 1u);
  EXPECT_NE(view.tcp.find(" 01 "), std::string::npos) << view.tcp;
  EXPECT_NE(view.tcp.find(" " + std::to_string(info.st_ino) + " "), std::string::npos) << view.tcp;
  EXPECT_EQ(view.host_addresses.count("127.0.0.1") ? view.host_addresses.at("127.0.0.1") : "", "lo");
  EXPECT_NE(view.maps.find("/"), std::string::npos);
  EXPECT_FALSE(nccl_started());
  EXPECT_EQ(attr(mpi_connections(), "mpi_transports"), "(absent)") << "loopback is no peer";
  close(client);
  close(server);
}

// The first of NCCL's: the process's capture is decided once, and a forked child inherits an undecided one.
TEST(NcclLog, AUsersNcclDebugIsLeftAlone) {
  EXPECT_EXIT(
      {
        unsetenv("NCCL_DEBUG_FILE");
        setenv("NCCL_DEBUG", "WARN", 1);
        const bool captured = capture_nccl_log();
        std::exit(!captured && std::getenv("NCCL_DEBUG_FILE") == nullptr &&
                          std::string(std::getenv("NCCL_DEBUG")) == "WARN"
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(NcclLog, LinesGiveTheNetworkInterfacesAndTransports) {
  NcclConnections c;
  for (const char* line : {
           "node0:100:100 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.2<0>",
           "node0:100:100 [0] NCCL INFO NET/IB : No device found.",
           "node0:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0> [1]eth1:10.1.0.2<0>",
           "node0:100:100 [0] NCCL INFO Using network Socket",
           "node0:100:107 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
           "node0:100:107 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
           "node0:100:107 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/Socket/0",
           "node0:100:107 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/Socket/1",
           "node0:100:107 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] via P2P/direct pointer/read",
           "node0:100:107 [0] NCCL INFO Channel 00/0 : 0[0] -> 3[1] [send] via NET/IB/1/GDRDMA",
           "node0:100:100 [0] NCCL WARN Channel 09/0 : via nothing",
       })
    c.add_line(line);
  EXPECT_EQ(c.network, "Socket");
  const Attrs a = c.attrs();
  EXPECT_EQ(attr(a, "nccl_network"), "Socket");
  EXPECT_EQ(attr(a, "nccl_interfaces"), "eth0,eth1");
  EXPECT_EQ(attr(a, "nccl_transports"), "P2P/CUMEM/read,NET/Socket,P2P/direct pointer/read,NET/IB/GDRDMA");

  NcclConnections ib;
  ib.add_line("h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.2.0.1<0>");
  EXPECT_EQ(attr(ib.attrs(), "nccl_interfaces"), "mlx5_0,mlx5_1") << "[RO] is relaxed ordering, not a device";
  EXPECT_TRUE(NcclConnections{}.attrs().empty()) << "nothing seen, nothing recorded";
}

TEST(NcclLog, TheProcessLogIsReadAsNcclWritesIt) {
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_FILE");
  ASSERT_TRUE(capture_nccl_log());
  EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "INFO");
  const std::string path = std::getenv("NCCL_DEBUG_FILE");
  EXPECT_NE(path.find(std::to_string(getpid())), std::string::npos) << "a file of this process: " << path;
  read_nccl_log();  // before NCCL wrote anything: nothing, and no error
  EXPECT_TRUE(nccl_connections().empty());
  // As NCCL writes it: opened once, each line flushed, a line possibly half written at a read.
  std::FILE* nccl = std::fopen(path.c_str(), "w");
  ASSERT_NE(nccl, nullptr);
  std::fputs("h:1:1 [0] NCCL INFO Using network Socket\nh:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via ", nccl);
  std::fflush(nccl);
  read_nccl_log();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the file's name is gone after the first read";
  EXPECT_EQ(attr(nccl_connections(), "nccl_network"), "Socket");
  EXPECT_EQ(attr(nccl_connections(), "nccl_transports"), "(absent)") << "a half-written line waits";
  std::fputs("SHM/direct/direct\n", nccl);
  std::fflush(nccl);
  EXPECT_EQ(attr(nccl_connections(), "nccl_transports"), "SHM/direct/direct") << "read whole, once written";
  std::fclose(nccl);
  EXPECT_TRUE(capture_nccl_log()) << "decided once";
}

}  // namespace
}  // namespace llmhpc

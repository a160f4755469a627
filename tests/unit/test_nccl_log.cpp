// NCCL's account of its connections (comm/nccl_log.h): what its INFO lines say is read into the
// network, interfaces and transports the rank files record; the log goes to a file of the
// process, which leaves no name behind, and a user's own NCCL_DEBUG is left alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/nccl_log.h"

namespace llmhpc {
namespace {

std::string attr(const Attrs& attrs, const std::string& name) {
  for (const auto& [key, value] : attrs)
    if (key == name) return std::get<std::string>(value);
  return "(absent)";
}

// First: the process's capture is decided once, and a forked child inherits an undecided one.
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

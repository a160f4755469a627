#include "comm/nccl_log.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "src/core/units.h"

namespace llmhpc {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// "NET/Socket/0" -> "NET/Socket", "NET/IB/1/GDRDMA" -> "NET/IB/GDRDMA": the path without its
// device numbers, so that the channels of one kind read as one transport.
std::string without_device_numbers(const std::string& via) {
  std::string out, part;
  for (size_t i = 0; i <= via.size(); ++i) {
    if (i < via.size() && via[i] != '/') {
      part += via[i];
      continue;
    }
    if (!all_digits(part)) out += (out.empty() ? "" : "/") + part;
    part.clear();
  }
  return out;
}

struct Capture {
  std::mutex mutex;
  bool decided = false, captured = false;
  std::string path;
  std::FILE* file = nullptr;  // read from where the last read stopped
  NcclConnections found;
};

Capture& capture() {
  static Capture c;
  return c;
}

}  // namespace

void NcclConnections::add_line(const std::string& line) {
  const size_t info = line.find("NCCL INFO ");
  if (info == std::string::npos) return;
  const std::string text = line.substr(info + 10);
  if (text.rfind("Using network ", 0) == 0) {  // "Using network Socket"
    network = text.substr(14);
    network.erase(network.find_last_not_of(" \r\n") + 1);
    return;
  }
  // "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:...", "NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB
  // eth0:...": each device after its number in brackets ("[RO]", relaxed ordering, is none).
  if (text.rfind("NET/", 0) == 0 && text.find(" : Using [") != std::string::npos) {
    for (size_t at = text.find('['); at != std::string::npos; at = text.find('[', at + 1)) {
      const size_t name = text.find(']', at);
      if (name == std::string::npos) break;
      if (!all_digits(text.substr(at + 1, name - at - 1))) continue;
      const size_t end = text.find_first_of(":< ", name + 1);
      append_once(interfaces, text.substr(name + 1, end == std::string::npos ? std::string::npos : end - name - 1));
    }
    return;
  }
  // "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "... [send] via NET/Socket/0"
  const size_t via = text.find(" via ");
  if (text.rfind("Channel ", 0) == 0 && via != std::string::npos) {
    std::string path = text.substr(via + 5);
    path.erase(path.find_last_not_of(" \r\n") + 1);
    append_once(transports, without_device_numbers(path));
  }
}

Attrs NcclConnections::attrs() const {
  Attrs out;
  if (!network.empty()) out.emplace_back("nccl_network", network);
  if (!interfaces.empty()) out.emplace_back("nccl_interfaces", join(interfaces, ","));
  if (!transports.empty()) out.emplace_back("nccl_transports", join(transports, ","));
  return out;
}

bool capture_nccl_log() {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.decided) return c.captured;
  c.decided = true;
  if (std::getenv("NCCL_DEBUG") != nullptr || std::getenv("NCCL_DEBUG_FILE") != nullptr) return false;
  const char* tmp = std::getenv("TMPDIR");
  c.path =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/llmhpc-nccl-" + std::to_string(getpid()) + ".log";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  setenv("NCCL_DEBUG_FILE", c.path.c_str(), 1);
  c.captured = true;
  return true;
}

bool nccl_started() {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.decided;
}

void read_nccl_log() {
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.captured) return;
  if (c.file == nullptr) {
    c.file = std::fopen(c.path.c_str(), "r");
    if (c.file == nullptr) return;  // NCCL has logged nothing yet
    unlink(c.path.c_str());
  }
  char buffer[4096];
  for (;;) {
    const long start = std::ftell(c.file);
    std::string line;
    bool whole = false;
    while (!whole && std::fgets(buffer, sizeof buffer, c.file) != nullptr) {
      line += buffer;
      whole = line.back() == '\n';
    }
    if (!whole) {  // none, or one NCCL is still writing: the next read takes it from its start
      std::fseek(c.file, start, SEEK_SET);
      return;
    }
    c.found.add_line(line);
  }
}

Attrs nccl_connections() {
  read_nccl_log();  // channels connect at their first collective (NCCL_RUNTIME_CONNECT)
  Capture& c = capture();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.found.attrs();
}

}  // namespace llmhpc

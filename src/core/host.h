#pragma once
// This host's name, as the rank files, the progress board and the hang reports give it.
#include <unistd.h>

#include <string>

namespace llmhpc {

// gethostname(); empty when it fails.
inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  return host;
}

}  // namespace llmhpc

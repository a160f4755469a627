// Named values that describe a result: a record's configuration, the environment a run
// measured in. Written as HDF5 attributes by src/io; produced by any layer (the device, the
// communicator, the runtime), which is why the type lives in core.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace llmhpc {

using AttrValue = std::variant<int64_t, double, std::string>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

}  // namespace llmhpc

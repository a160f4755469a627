#include "src/core/timer.h"

#include <string>

#include "src/core/check.h"

namespace llmhpc {

void HostTimer::mark(int index) {
  LLMHPC_CHECK(index >= 0 && index < marks(), "timer mark " + std::to_string(index) + " out of range");
  marks_[size_t(index)] = std::chrono::steady_clock::now();
}

double HostTimer::elapsed_ms(const Timer& origin, int from, int to) {
  const HostTimer* o = dynamic_cast<const HostTimer*>(&origin);
  LLMHPC_CHECK(o != nullptr, "a host timer compared with a timer on another clock");
  LLMHPC_CHECK(from >= 0 && from < o->marks() && to >= 0 && to < marks(), "timer mark out of range");
  return std::chrono::duration<double, std::milli>(marks_[size_t(to)] - o->marks_[size_t(from)]).count();
}

}  // namespace llmhpc

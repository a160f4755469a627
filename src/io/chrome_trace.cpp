// The Chrome trace-event writer (src/io/chrome_trace.h).
#include "src/io/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "src/core/check.h"
#include "src/core/units.h"

namespace llmhpc {

ChromeTrace::ChromeTrace(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "w");
  if (!file_) throw UsageError("cannot write the trace '" + path_ + "': " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, size_t(1) << 20);
  std::fputs("[", file_);
}

ChromeTrace::~ChromeTrace() {
  try {
    close();
  } catch (const std::exception& e) {  // a destructor must not throw; say what is lost instead
    std::fprintf(stderr, "llmhpc: %s\n", e.what());
  }
}

void ChromeTrace::begin_event() {
  LLMHPC_CHECK(file_ != nullptr, "an event for the closed trace '" + path_ + "'");
  std::fputs(first_ ? "\n" : ",\n", file_);
  first_ = false;
}

void ChromeTrace::process_name(int64_t pid, std::string_view name) {
  begin_event();
  std::fprintf(file_, R"({"ph": "M", "name": "process_name", "pid": %lld, "tid": 0, "args": {"name": "%s"}})",
               (long long)pid, json_escape(name).c_str());
}

void ChromeTrace::thread_name(int64_t pid, int64_t tid, std::string_view name, int64_t sort_index) {
  begin_event();
  std::fprintf(file_, R"({"ph": "M", "name": "thread_name", "pid": %lld, "tid": %lld, "args": {"name": "%s"}})",
               (long long)pid, (long long)tid, json_escape(name).c_str());
  begin_event();
  std::fprintf(file_,
               R"({"ph": "M", "name": "thread_sort_index", "pid": %lld, "tid": %lld, "args": {"sort_index": %lld}})",
               (long long)pid, (long long)tid, (long long)sort_index);
}

void ChromeTrace::complete(int64_t pid, int64_t tid, std::string_view name, std::string_view category, int64_t start_ns,
                           int64_t duration_ns, std::string_view args_json) {
  if (!has_origin_) set_origin(start_ns);
  duration_ns = std::max<int64_t>(duration_ns, 0);
  begin_event();
  // Microseconds with three decimals: the nanoseconds, exactly.
  const int64_t ts = start_ns - origin_ns_;
  std::fprintf(file_,
               R"({"ph": "X", "name": "%s", "cat": "%s", "pid": %lld, "tid": %lld, )"
               R"("ts": %s%lld.%03lld, "dur": %lld.%03lld, "args": {%.*s}})",
               json_escape(name).c_str(), json_escape(category).c_str(), (long long)pid, (long long)tid,
               ts < 0 ? "-" : "", (long long)(std::llabs(ts) / 1000), (long long)(std::llabs(ts) % 1000),
               (long long)(duration_ns / 1000), (long long)(duration_ns % 1000), int(args_json.size()),
               args_json.data());
}

void ChromeTrace::close() {
  if (!file_) return;
  std::fputs("\n]\n", file_);
  const bool failed = std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) throw UsageError("writing the trace '" + path_ + "' failed");
}

}  // namespace llmhpc

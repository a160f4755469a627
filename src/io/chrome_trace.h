// A Chrome trace-event file (the "JSON Array Format" of the Trace Event Format), which
// ui.perfetto.dev and chrome://tracing open: complete events ("ph": "X", a start and a
// duration) on tracks named by process and thread metadata events.
//
// Events are written as they come (a stdio buffer, nothing kept), so a trace of millions of
// kernels needs no memory. The array form allows the closing ']' to be missing, so a run that
// dies leaves a file the viewers still open.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace llmhpc {

class ChromeTrace {
 public:
  // Creates (or truncates) `path`; throws UsageError if it cannot. Times given in ns are
  // written in microseconds from `origin_ns` (set_origin, before any event whose start comes
  // earlier; the first event's start by default). Perfetto shows times before it too.
  explicit ChromeTrace(std::string path);
  ~ChromeTrace();  // close()
  ChromeTrace(const ChromeTrace&) = delete;
  ChromeTrace& operator=(const ChromeTrace&) = delete;

  void set_origin(int64_t origin_ns) { origin_ns_ = origin_ns, has_origin_ = true; }
  // Names a process (a track group) and one of its threads (a track, ordered by `sort_index`).
  void process_name(int64_t pid, std::string_view name);
  void thread_name(int64_t pid, int64_t tid, std::string_view name, int64_t sort_index);
  // One complete event. `args_json` is the inside of its args object ("\"step\": 3"), or empty.
  void complete(int64_t pid, int64_t tid, std::string_view name, std::string_view category, int64_t start_ns,
                int64_t duration_ns, std::string_view args_json = {});
  // Ends the array and closes the file; throws UsageError if writing failed.
  void close();
  const std::string& path() const { return path_; }

 private:
  void begin_event();
  std::string path_;
  std::FILE* file_ = nullptr;
  bool first_ = true, has_origin_ = false;
  int64_t origin_ns_ = 0;
};

}  // namespace llmhpc

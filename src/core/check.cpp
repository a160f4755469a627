#include "src/core/check.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace llmhpc {
namespace {
int g_rank = -1;
std::string g_host = "?";
std::string g_device = "none";
}  // namespace

namespace {
std::function<std::string(const std::string&)>& field_namer() {
  static std::function<std::string(const std::string&)> namer;
  return namer;
}
}  // namespace

void set_field_names(std::function<std::string(const std::string& field)> name) { field_namer() = std::move(name); }

std::string name_fields(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text[i] == '{' ? text.find('}', i) : std::string::npos;
    bool is_field = end != std::string::npos && end > i + 1;
    for (size_t j = i + 1; is_field && j < end; ++j) {
      const char c = text[j];
      is_field = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    }
    if (!is_field) {
      out += text[i++];
      continue;
    }
    const std::string name = text.substr(i + 1, end - i - 1);
    out += field_namer() ? field_namer()(name) : name;
    i = end + 1;
  }
  return out;
}

void set_fatal_context_rank(int rank, const std::string& host) {
  g_rank = rank;
  g_host = host;
}

void set_fatal_context_device(const std::string& device) { g_device = device; }

namespace {
// The watchdog's thread once it ends the job; no thread's id until then.
std::atomic<std::thread::id> g_aborting_thread{};
}  // namespace

void note_job_aborting() { g_aborting_thread.store(std::this_thread::get_id()); }

namespace {
std::mutex g_unpublished_mutex;
// RemoveOnFatal's paths; never destroyed, so that a fatal error during exit still finds them.
std::vector<std::string>& g_unpublished = *new std::vector<std::string>;
}  // namespace

RemoveOnFatal::RemoveOnFatal(std::string path) : path_(std::move(path)) {
  std::lock_guard<std::mutex> hold(g_unpublished_mutex);
  g_unpublished.push_back(path_);
}

RemoveOnFatal::~RemoveOnFatal() {
  std::lock_guard<std::mutex> hold(g_unpublished_mutex);
  auto it = std::find(g_unpublished.begin(), g_unpublished.end(), path_);
  if (it != g_unpublished.end()) g_unpublished.erase(it);
}

void remove_unpublished_files() {
  std::lock_guard<std::mutex> hold(g_unpublished_mutex);
  for (const std::string& path : g_unpublished) std::remove(path.c_str());  // gone already (published): no matter
}

namespace {
[[noreturn]] void end_job(int code) {
  remove_unpublished_files();
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}
void wait_if_job_aborting() {
  // The watchdog ends the process (and its alarm, should MPI_Abort hang); but where its own
  // thread fails (writing the hang report into a full disk), this is that end.
  const std::thread::id aborting = g_aborting_thread.load();
  if (aborting != std::thread::id() && aborting != std::this_thread::get_id())
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
}  // namespace

void fatal(const char* file, int line, const std::string& call, const std::string& what) {
  wait_if_job_aborting();
  std::fprintf(stderr, "llmhpc: fatal error on rank %d (host %s, device %s)\n  at %s:%d\n", g_rank, g_host.c_str(),
               g_device.c_str(), file, line);
  if (!call.empty()) std::fprintf(stderr, "  failing call: %s\n", call.c_str());
  if (!what.empty()) std::fprintf(stderr, "  %s\n", what.c_str());
  end_job(3);
}

void abort_job(const std::string& what, int code) {
  wait_if_job_aborting();
  std::fprintf(stderr, "llmhpc: error (rank %d on %s): %s\n", g_rank, g_host.c_str(), what.c_str());
  end_job(code);
}

std::string system_reason(int error_number) {
  std::string text = std::strerror(error_number);
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z' && (text.size() < 2 || text[1] < 'A' || text[1] > 'Z'))
    text[0] = char(text[0] - 'A' + 'a');  // "No space left on device", not "I/O error"
  return text;
}

std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

}  // namespace llmhpc

// The per-rank result file (docs/hdf5-schema.md): root attributes that say who wrote it
// and how, then one group per measured configuration with raw per-iteration arrays, its
// status and its configuration as attributes.
//
// The file is created with the first record (a run that fails its checks leaves nothing
// behind) and closed between records: each record is written and flushed in one go, so
// a crash later in the run leaves every finished record readable.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace llmhpc {

using AttrValue = std::variant<int64_t, double, std::string>;

struct Record {
  std::string group;         // e.g. "bench/small_T128_B4_fp32_naive"
  std::string status = "ok";  // "ok", "oom", "error: ..."
  std::vector<std::pair<std::string, AttrValue>> attrs;
  std::vector<std::pair<std::string, std::vector<double>>> series;
  std::vector<std::pair<std::string, std::vector<int64_t>>> int_series;
  std::vector<std::pair<std::string, std::vector<std::string>>> string_series;

  Record& attr(const std::string& name, AttrValue value) {
    attrs.emplace_back(name, std::move(value));
    return *this;
  }
  Record& add(const std::string& name, std::vector<double> values) {
    series.emplace_back(name, std::move(values));
    return *this;
  }
  Record& add(const std::string& name, std::vector<int64_t> values) {
    int_series.emplace_back(name, std::move(values));
    return *this;
  }
  Record& add(const std::string& name, std::vector<std::string> values) {
    string_series.emplace_back(name, std::move(values));
    return *this;
  }
};

struct RunInfo {
  std::string mode, hostname, device_name, backend, argv, config_json, start_time;
  int64_t rank = 0, world_size = 1, local_rank = 0;
};

constexpr int64_t kSchemaVersion = 1;

class Recorder {
 public:
  Recorder(std::string path, RunInfo info) : path_(std::move(path)), info_(std::move(info)) {}
  // Writes (or replaces) one record's group; the first call creates the file with the
  // root attributes and status "running". Throws UsageError if it cannot.
  void write(const Record& record);
  // Marks the run finished: root attribute status = "complete", or "error: ..." when a
  // mode failed (then only if the file exists: a run that recorded nothing stays absent).
  void finish(const std::string& status = "complete");
  const std::string& path() const { return path_; }

 private:
  void create_once();
  std::string path_;
  RunInfo info_;
  bool created_ = false;
};

// "2026-11-22T10:31:07Z"
std::string utc_timestamp();

}  // namespace llmhpc

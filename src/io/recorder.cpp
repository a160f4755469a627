#include "src/io/recorder.h"

#include <ctime>

#include "git_sha.h"  // generated at build time (cmake/git_sha.cmake)
#include "src/io/h5.h"

namespace llmhpc {

void Recorder::create_once() {
  if (created_) return;
  const RunInfo& info = info_;
  h5::Handle f = h5::open_file(path_, h5::Mode::Create);
  const hid_t root = f.id();
  h5::write_attr(root, "mode", info.mode);
  h5::write_attr(root, "rank", info.rank);
  h5::write_attr(root, "world_size", info.world_size);
  h5::write_attr(root, "local_rank", info.local_rank);
  h5::write_attr(root, "hostname", info.hostname);
  h5::write_attr(root, "device_name", info.device_name);
  h5::write_attr(root, "backend", info.backend);
  h5::write_attr(root, "git_sha", std::string(LLMHPC_GIT_SHA));
  h5::write_attr(root, "argv", info.argv);
  h5::write_attr(root, "config_json", info.config_json);
  h5::write_attr(root, "start_time", info.start_time);
  h5::write_attr(root, "schema_version", kSchemaVersion);
  h5::write_attr(root, "status", std::string("running"));
  h5::flush(f);
  created_ = true;
}

void Recorder::write(const Record& r) {
  create_once();
  h5::Handle f = h5::open_file(path_, h5::Mode::Append);
  if (h5::exists(f.id(), r.group)) h5::remove(f.id(), r.group);
  h5::Handle g = h5::require_group(f.id(), r.group);
  h5::write_attr(g.id(), "status", r.status);
  for (const auto& [name, value] : r.attrs)
    std::visit([&, n = name](const auto& v) { h5::write_attr(g.id(), n, v); }, value);
  for (const auto& [name, values] : r.series)
    h5::write_dataset(g.id(), name, {int64_t(values.size())}, values.data());
  for (const auto& [name, values] : r.int_series)
    h5::write_dataset(g.id(), name, {int64_t(values.size())}, values.data());
  for (const auto& [name, values] : r.string_series) h5::write_strings(g.id(), name, values);
  h5::flush(f);
}

void Recorder::finish(const std::string& status) {
  if (!created_ && status != "complete") return;  // a failed run that recorded nothing leaves nothing
  create_once();
  h5::Handle f = h5::open_file(path_, h5::Mode::Append);
  h5::write_attr(f.id(), "status", status);
  h5::write_attr(f.id(), "end_time", utc_timestamp());
  h5::flush(f);
}

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace llmhpc

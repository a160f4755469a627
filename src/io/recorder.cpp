#include "src/io/recorder.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <regex>
#include <set>

#include "git_sha.h"  // generated at build time (cmake/git_sha.cmake)
#include "src/core/check.h"
#include "src/io/h5.h"

namespace llmhpc {
namespace {

// Chunks of a stream's datasets, in elements: as many as a full buffer, so that a full
// batch writes whole chunks, within bounds. Chunks of 16Ki, 64Ki and 256Ki elements wrote
// 10M rows equally fast; HDF5 allocates a partly filled chunk whole, so a short stream
// wastes up to one chunk per column (512 KiB of float64 at 64Ki; a short stream can ask
// for a smaller buffer). docs/hdf5-schema.md has the numbers and why there is no compression.
constexpr int64_t kMinChunkRows = int64_t(1) << 10;
constexpr int64_t kMaxChunkRows = int64_t(1) << 16;

const char* type_name(ColumnType type) {
  switch (type) {
    case ColumnType::Real: return "Real (floating point)";
    case ColumnType::Int: return "Int (integer)";
    case ColumnType::Text: return "Text (string)";
  }
  return "?";
}

void write_attrs(hid_t obj, const Attrs& attrs) {
  for (const auto& [name, value] : attrs)
    std::visit([&, n = name](const auto& v) { h5::write_attr(obj, n, v); }, value);
}

// Creates (or replaces) a record's group with its status and attributes.
h5::Handle new_record(hid_t file, const std::string& group, const std::string& status, const Attrs& attrs) {
  if (h5::exists(file, group)) h5::remove(file, group);
  h5::Handle g = h5::require_group(file, group);
  h5::write_attr(g.id(), "status", status);
  write_attrs(g.id(), attrs);
  return g;
}

// The root attributes: who wrote the file and how.
void write_root(hid_t root, const RunInfo& info) {
  h5::write_attr(root, "mode", info.mode);
  h5::write_attr(root, "rank", info.rank);
  h5::write_attr(root, "world_size", info.world_size);
  h5::write_attr(root, "local_rank", info.local_rank);
  h5::write_attr(root, "hostname", info.hostname);
  h5::write_attr(root, "device_name", info.device_name);
  h5::write_attr(root, "backend", info.backend);
  h5::write_attr(root, "git_sha", build_git_sha());
  h5::write_attr(root, "argv", info.argv);
  h5::write_attr(root, "config_json", info.config_json);
  h5::write_attr(root, "start_time", info.start_time);
  h5::write_attr(root, "run_id", info.run_id);
  h5::write_attr(root, "schema_version", kSchemaVersion);
  h5::write_attr(root, "hdf5_version", h5::library_version());
  write_attrs(root, info.environment);
  h5::write_attr(root, "status", std::string("running"));
}

}  // namespace

// The rank file and its working copy, path + ".tmp" in the same directory: every change is
// made to the working copy (copied from the file first), which is then flushed, closed,
// fsync'ed and renamed over the file. rename() within a directory is atomic, so the file is
// always one complete version (docs/design.md, "Reliability"). A stream's batch publishes
// the working copy while it is small (kPublishAlwaysBytes) and then each time it has grown
// by a quarter, so the copies cost a few times the file's final size, not one file per batch;
// a record, flush() and close() always publish.
struct Recorder::File {
  static constexpr uint64_t kPublishAlwaysBytes = uint64_t(16) << 20;
  std::string path, work;
  bool working = false;          // the working copy exists and is newer than the file
  uint64_t published_bytes = 0;  // the file's size at the last commit
  RemoveOnFatal unpublished;     // a run ended by a failed write leaves no working copy either

  explicit File(std::string rank_file) : path(std::move(rank_file)), work(path + ".tmp"), unpublished(work) {}

  // A working copy never committed (its write failed: a full disk) is no result: the file,
  // as last published, is.
  ~File() {
    std::error_code ec;
    if (working) std::filesystem::remove(work, ec);
  }

  // The working copy, opened for appending; `create` makes a new file instead.
  h5::Handle open(bool create = false) {
    if (create) {
      working = true;
      return h5::open_file(work, h5::Mode::Create);
    }
    if (!working) {
      std::error_code ec;
      std::filesystem::copy_file(path, work, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) {
        std::error_code ignored;
        std::filesystem::remove(work, ignored);  // what part of it was written
        // A copy cut short reads as an I/O error (libstdc++), where the file system had no room for it.
        namespace fs = std::filesystem;
        const fs::path dir = fs::path(work).parent_path().empty() ? fs::path(".") : fs::path(work).parent_path();
        const int number =
            ec.value() == EIO && fs::space(dir, ignored).available < fs::file_size(path, ignored) ? ENOSPC : ec.value();
        throw WriteFailed("'" + work + "' (a copy of '" + path + "'): " + system_reason(number), work, number);
      }
      working = true;
    }
    return h5::open_file(work, h5::Mode::Append);
  }
  // The working copy becomes the file. Call with the working copy closed.
  void commit() {
    guarded([&] { commit_work(); });
  }
  void commit_work() {
    if (!working) return;
    std::error_code ec;
    const uint64_t bytes = std::filesystem::file_size(work, ec);
    h5::replace_file(work, path);
    working = false;
    published_bytes = ec ? 0 : bytes;
  }
  // A write the system refused (a full disk): the working copy is dropped, so that the next
  // change starts again from the file as last published, and the error names the rank file.
  template <class Write>
  void guarded(Write&& write) {
    try {
      write();
    } catch (const WriteFailed& e) {
      std::error_code ignored;
      std::filesystem::remove(work, ignored);
      working = false;
      if (e.file == path) throw;  // said so already (a commit inside a write)
      throw WriteFailed("the rank file '" + path + "' could not be written: " + system_reason(e.error_number) +
                            " (at " + e.file + "); it keeps the records written before it (free space there, or " +
                            "choose another {out})",
                        path, e.error_number);
    }
  }
  // Names of the records whose status is "running" (written so, or streams not closed yet): a
  // stop marks them interrupted.
  std::set<std::string> running;
  // After a stream's batch: commit unless the file is large and has grown by less than a quarter.
  void commit_batch() {
    std::error_code ec;
    const uint64_t bytes = std::filesystem::file_size(work, ec);
    if (ec || bytes <= kPublishAlwaysBytes || bytes >= published_bytes + published_bytes / 4) commit();
  }
};

// A stream's buffers and where they go. Its destructor, not RecordStream's, finishes an
// unclosed stream, so that moving a stream (construction or assignment) needs no code.
struct RecordStream::State {
  struct Buffer {
    Column column;
    std::vector<double> reals;
    std::vector<int64_t> ints;
    std::string text;            // the strings, each followed by its NUL: the C strings HDF5 takes
    std::vector<size_t> starts;  // where each string begins in `text`
  };
  std::shared_ptr<Recorder::File> file;
  std::string group;
  std::vector<Buffer> buffers;
  int64_t buffer_rows = 0, buffered = 0, written = 0, text_bytes = 0;
  bool open = true;

  ~State();
  Buffer& column(int i, ColumnType type);
  void write(const std::string* status, const Attrs& attrs);
  void write_batch(const std::string* status, const Attrs& attrs);
};

RecordStream::State::~State() {
  if (!open) return;
  try {
    const std::string status = "interrupted";
    write(&status, {});
    file->commit();
  } catch (const std::exception& e) {  // a destructor must not throw; say what is lost instead
    std::fprintf(stderr, "llmhpc: record '%s': %lld buffered rows lost and status left 'running': %s\n", group.c_str(),
                 static_cast<long long>(buffered), e.what());
  }
}

RecordStream::State::Buffer& RecordStream::State::column(int i, ColumnType type) {
  Buffer& b = buffers[i];
  LLMHPC_CHECK(b.column.type == type, "column '" + b.column.name + "' of '" + group + "' is " +
                                          type_name(b.column.type) + ", given a value of type " + type_name(type));
  return b;
}

// One batch: every column extended by the buffered rows, then stream_rows (the rows a
// reader may trust if a crash interrupts a later batch), the attributes and the status.
void RecordStream::State::write(const std::string* status, const Attrs& attrs) {
  std::lock_guard<std::recursive_timed_mutex> hold(h5::library_lock());  // the write and its commit, whole
  file->guarded([&] { write_batch(status, attrs); });
  if (status) file->running.erase(group);
}

void RecordStream::State::write_batch(const std::string* status, const Attrs& attrs) {
  h5::Handle f = file->open();
  h5::Handle g = h5::open_group(f.id(), group);
  std::vector<const char*> strings;
  for (Buffer& b : buffers) {
    const std::string& name = b.column.name;
    int64_t length = 0;
    switch (b.column.type) {
      case ColumnType::Real: length = h5::append(g.id(), name, b.reals.data(), buffered); break;
      case ColumnType::Int: length = h5::append(g.id(), name, b.ints.data(), buffered); break;
      case ColumnType::Text:
        strings.resize(buffered);
        for (int64_t i = 0; i < buffered; ++i) strings[i] = b.text.data() + b.starts[i];
        length = h5::append(g.id(), name, strings.data(), buffered);
        break;
    }
    LLMHPC_CHECK(length == written + buffered, "column '" + name + "' of '" + group + "' has " +
                                                   std::to_string(length) + " rows, expected " +
                                                   std::to_string(written + buffered) + ": changed behind its stream?");
    b.reals.clear();
    b.ints.clear();
    b.text.clear();
    b.starts.clear();
  }
  written += buffered;
  buffered = 0;
  text_bytes = 0;
  h5::write_attr(g.id(), "stream_rows", written);
  write_attrs(g.id(), attrs);
  if (status) h5::write_attr(g.id(), "status", *status);
  h5::flush(f);
  g.reset();  // closed before the working copy is published
  f.reset();
  file->commit_batch();
}

RecordStream::RecordStream(std::unique_ptr<State> state) : state_(std::move(state)) {}
RecordStream::RecordStream(RecordStream&&) noexcept = default;
RecordStream& RecordStream::operator=(RecordStream&&) noexcept = default;
RecordStream::~RecordStream() = default;

void RecordStream::begin_row(size_t values) {
  LLMHPC_CHECK(state_ && state_->open, "append to a record stream that is closed or moved from");
  LLMHPC_CHECK(values == state_->buffers.size(), "a row of " + std::to_string(values) + " values for '" +
                                                     state_->group + "', which has " +
                                                     std::to_string(state_->buffers.size()) + " columns");
}

void RecordStream::end_row() {
  State& s = *state_;
  if (++s.buffered >= s.buffer_rows || s.text_bytes >= kBufferTextBytes) s.write(nullptr, {});
}

void RecordStream::push_real(int column, double value) {
  state_->column(column, ColumnType::Real).reals.push_back(value);
}

void RecordStream::push_int(int column, int64_t value) {
  state_->column(column, ColumnType::Int).ints.push_back(value);
}

void RecordStream::push_text(int column, std::string_view value) {
  State::Buffer& b = state_->column(column, ColumnType::Text);
  LLMHPC_CHECK(value.find('\0') == std::string_view::npos,
               "a string with a NUL for column '" + b.column.name + "' (HDF5 strings end at the first NUL)");
  b.starts.push_back(b.text.size());
  b.text.append(value);
  b.text.push_back('\0');
  state_->text_bytes += int64_t(value.size()) + 1;
}

void RecordStream::flush() {
  LLMHPC_CHECK(state_ && state_->open, "flush of a record stream that is closed or moved from");
  if (state_->buffered > 0) state_->write(nullptr, {});
  state_->file->commit();
}

void RecordStream::close(const std::string& status, const Attrs& attrs) {
  LLMHPC_CHECK(state_ && state_->open, "close of a record stream that is closed or moved from");
  state_->write(&status, attrs);
  state_->open = false;
  state_->file->commit();
}

const std::string& RecordStream::group() const { return state_->group; }
int64_t RecordStream::rows() const { return state_->written + state_->buffered; }
int64_t RecordStream::buffered_rows() const { return state_->buffered; }
int64_t RecordStream::buffer_rows() const { return state_->buffer_rows; }

Recorder::Recorder(std::string path, RunInfo info)
    : file_(std::make_shared<File>(std::move(path))), info_(std::move(info)) {}

Recorder::~Recorder() = default;

const std::string& Recorder::path() const { return file_->path; }

void Recorder::create_once() {
  if (created_) return;
  const RunInfo& info = info_;
  file_->guarded([&] {
    h5::Handle f = file_->open(/*create=*/true);
    write_root(f.id(), info);
  });
  file_->commit();
  created_ = true;
}

void Recorder::write(const Record& r) {
  std::lock_guard<std::recursive_timed_mutex> hold(h5::library_lock());  // the write and its commit, whole
  create_once();
  file_->guarded([&] {
    h5::Handle f = file_->open();
    h5::Handle g = new_record(f.id(), r.group, r.status, r.attrs);
    for (const auto& [name, values] : r.series)
      h5::write_dataset(g.id(), name, {int64_t(values.size())}, values.data());
    for (const auto& [name, values] : r.int_series)
      h5::write_dataset(g.id(), name, {int64_t(values.size())}, values.data());
    for (const auto& [name, values] : r.string_series) h5::write_strings(g.id(), name, values);
    h5::flush(f);
  });
  file_->commit();
  if (r.status == "running") file_->running.insert(r.group);
  else file_->running.erase(r.group);
}

void Recorder::keep_if_ended(std::shared_ptr<const Record> record) {
  std::lock_guard<std::mutex> lock(kept_mutex_);
  kept_ = std::move(record);
}

void Recorder::write_kept(const std::string* status) {
  std::shared_ptr<const Record> kept;
  {
    std::lock_guard<std::mutex> lock(kept_mutex_);
    kept = kept_;
  }
  // None, or its group's end is written: nothing older may replace it.
  if (!kept || !file_->running.count(kept->group)) return;
  if (!status) return write(*kept);
  Record r = *kept;
  r.status = *status;
  write(r);
}

void Recorder::write_running(const Record& r) {
  Record mark;
  mark.group = r.group;
  mark.status = "running";
  mark.attrs = r.attrs;
  write(mark);
}

RecordStream Recorder::stream(const std::string& group, const std::vector<Column>& columns, const Attrs& attrs,
                              int64_t buffer_rows) {
  LLMHPC_CHECK(!columns.empty(), "a record stream needs at least one column ('" + group + "')");
  LLMHPC_CHECK(buffer_rows >= 1, "a record stream buffers at least one row ('" + group + "')");
  std::set<std::string> names;
  for (const Column& c : columns)
    LLMHPC_CHECK(!c.name.empty() && c.name.find('/') == std::string::npos && names.insert(c.name).second,
                 "column name '" + c.name + "' of '" + group + "' is empty, has a '/' or is taken");
  std::lock_guard<std::recursive_timed_mutex> hold(h5::library_lock());  // the write and its commit, whole
  create_once();
  const int64_t chunk = std::clamp(buffer_rows, kMinChunkRows, kMaxChunkRows);
  auto state = std::make_unique<RecordStream::State>();
  file_->guarded([&] {
    h5::Handle f = file_->open();
    h5::Handle g = new_record(f.id(), group, "running", attrs);  // both closed before the commit
    h5::write_attr(g.id(), "stream_rows", int64_t(0));
    for (const Column& c : columns) {
      RecordStream::State::Buffer& b = state->buffers.emplace_back();
      b.column = c;
      switch (c.type) {  // the buffer takes its whole bound at once: no reallocation while appending
        case ColumnType::Real:
          h5::create_appendable<double>(g.id(), c.name, chunk);
          b.reals.reserve(buffer_rows);
          break;
        case ColumnType::Int:
          h5::create_appendable<int64_t>(g.id(), c.name, chunk);
          b.ints.reserve(buffer_rows);
          break;
        case ColumnType::Text:
          h5::create_appendable<std::string>(g.id(), c.name, chunk);
          b.starts.reserve(buffer_rows);
          break;
      }
    }
    h5::flush(f);
  });
  file_->commit();
  file_->running.insert(group);
  state->file = file_;
  state->group = group;
  state->buffer_rows = buffer_rows;
  return RecordStream(std::move(state));
}

void Recorder::finish(const std::string& status, const Attrs& attrs) {
  finish_file(status, attrs,
              /*even_if_absent=*/status == "complete");  // a failed run that recorded nothing leaves nothing
}

void Recorder::finish_file(const std::string& status, const Attrs& attrs, bool even_if_absent) {
  std::lock_guard<std::recursive_timed_mutex> hold(h5::library_lock());  // the write and its commit, whole
  if (!created_ && !even_if_absent) return;
  create_once();
  file_->guarded([&] {
    h5::Handle f = file_->open();
    write_attrs(f.id(), attrs);
    h5::write_attr(f.id(), "status", status);
    h5::write_attr(f.id(), "end_time", utc_timestamp());
    h5::flush(f);
  });
  file_->commit();
  finished_ = true;
}

bool Recorder::interrupt_within(const std::string& signal, std::chrono::milliseconds wait) {
  std::unique_lock<std::recursive_timed_mutex> hold(h5::library_lock(), std::defer_lock);
  if (!hold.try_lock_for(wait)) return false;
  if (!created_ || finished_) return true;  // nothing recorded, or its end said already (a watchdog's report)
  const std::string status = "interrupted: " + signal;
  std::string root = status;
  if (!file_->running.empty()) root += " while measuring " + *file_->running.begin();
  file_->guarded([&] {
    h5::Handle f = file_->open();
    for (const std::string& group : file_->running)
      if (h5::exists(f.id(), group)) h5::write_attr(h5::open_group(f.id(), group).id(), "status", status);
    h5::write_attr(f.id(), "status", root);
    h5::write_attr(f.id(), "end_time", utc_timestamp());
    h5::flush(f);
  });
  file_->commit();
  return true;
}

bool Recorder::write_kept_within(const std::string& signal, std::chrono::milliseconds wait) {
  std::unique_lock<std::recursive_timed_mutex> hold(h5::library_lock(), std::defer_lock);
  if (!hold.try_lock_for(wait)) return false;
  if (!created_ || finished_) return true;  // nothing recorded, or its end said already (a watchdog's report)
  const std::string status = "interrupted: " + signal;
  write_kept(&status);
  return true;
}

bool Recorder::finish_within(const std::string& status, const Attrs& attrs, std::chrono::milliseconds wait) {
  std::unique_lock<std::recursive_timed_mutex> hold(h5::library_lock(), std::defer_lock);
  if (!hold.try_lock_for(wait)) return false;
  write_kept(nullptr);
  finish_file(status, attrs, /*even_if_absent=*/true);
  return true;
}

namespace {
// What a record's arrays hold, in bytes.
size_t array_bytes(const Record& r) {
  size_t bytes = 0;
  for (const auto& [name, values] : r.series) bytes += values.size() * sizeof(double);
  for (const auto& [name, values] : r.int_series) bytes += values.size() * sizeof(int64_t);
  for (const auto& [name, values] : r.string_series)
    for (const std::string& v : values) bytes += v.size() + 1;
  return bytes;
}
}  // namespace

RecordFlush::RecordFlush(Recorder& recorder, std::chrono::milliseconds every) : recorder_(recorder), every_(every) {}

RecordFlush::~RecordFlush() {
  if (writing_.valid()) writing_.wait();
}

void RecordFlush::when_due(int64_t steps, const std::function<Record()>& make) {
  const auto now = std::chrono::steady_clock::now();
  bool write = every_.count() > 0 && now - last_ >= every_;
  if (write && writing_.valid()) {
    write = writing_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    if (write) writing_.get();
  }
  const bool keep =
      keeping_ && (now - kept_at_ >= keep_took_ * kKeepShare || steps >= 2 * std::max<int64_t>(kept_steps_, 1));
  if (!write && !keep) return;
  auto record = std::make_shared<const Record>(make());
  if (keeping_) {
    keep_took_ = std::chrono::steady_clock::now() - now;
    kept_at_ = now;
    kept_steps_ = steps;
    keeping_ = array_bytes(*record) <= kKeepBytes;
    recorder_.keep_if_ended(keeping_ ? record : nullptr);
  }
  if (!write) return;
  writing_ = std::async(std::launch::async, [this, record] { recorder_.write(*record); });
  last_ = now;
}

void RecordFlush::write_now(const Record& record) {
  if (writing_.valid()) writing_.wait();
  recorder_.write(record);
  last_ = std::chrono::steady_clock::now();
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank%05d.h5", rank);
  return name;
}

bool is_rank_file_of(const std::string& path, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  std::error_code ec;
  const bool in_out = fs::equivalent(file.parent_path().empty() ? fs::path(".") : file.parent_path(), out_dir, ec);
  return in_out && std::regex_match(file.filename().string(), std::regex(R"(rank[0-9]+\.h5(\..*)?)"));
}

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string build_git_sha() { return LLMHPC_GIT_SHA; }

}  // namespace llmhpc

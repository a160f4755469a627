// The per-rank result file (docs/hdf5-schema.md): root attributes that say who wrote it
// and how, then one group per measured configuration with raw per-iteration arrays, its
// status and its configuration as attributes.
//
// The file is created with the first record (a run that fails its checks leaves nothing
// behind) and never changed in place: each record goes into a copy (rankNNNNN.h5.tmp),
// which is flushed, fsync'ed and renamed over the file, so a kill at any moment leaves the
// previous complete file or the new one, never a corrupt one (docs/design.md, "Reliability").
//
// A record too long to hold in memory (an event trace, an allocation timeline) is a
// RecordStream instead: its group is created at once with status "running", its rows are
// buffered up to a bound and appended to chunked datasets batch by batch, each batch in
// its own open-write-flush-close of the working copy, published as the file after each
// batch while the file is small and then whenever it has grown by a quarter (flush() and
// close() always publish): a kill keeps every published batch.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "src/core/attrs.h"
#include "src/core/check.h"

namespace llmhpc {

struct Record {
  std::string group;          // e.g. "bench/small_T128_B4_fp32_naive"
  std::string status = "ok";  // "ok", "oom", "error: ..."
  Attrs attrs;
  std::vector<std::pair<std::string, std::vector<double>>> series;
  std::vector<std::pair<std::string, std::vector<int64_t>>> int_series;
  std::vector<std::pair<std::string, std::vector<std::string>>> string_series;

  // Again with a name already set replaces its value (a count known only once measured).
  Record& attr(const std::string& name, AttrValue value) {
    for (auto& [key, old] : attrs)
      if (key == name) return old = std::move(value), *this;
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

// A column of a RecordStream: one 1-D dataset of float64, int64 or variable-length UTF-8
// strings; element i of every column of a stream belongs to row i.
enum class ColumnType { Real, Int, Text };
struct Column {
  std::string name;
  ColumnType type;
};

// A record whose rows are appended while it runs (Recorder::stream makes one). Memory is
// bounded: a batch is written when buffer_rows() rows, or kBufferTextBytes of strings, are
// buffered, on flush(), and on close(); only then is the file opened. Not thread-safe: a
// caller fed from several threads (CUPTI's buffer callbacks) serialises its calls.
//
// Destroyed without close() (an exception unwinding through the scope that owns it, or a
// forgotten close), the stream still writes what it buffered and sets the record's status
// to "interrupted", so a record is "running" only while its process lives (or if that last
// write fails, which it reports on stderr: a destructor cannot throw).
class RecordStream {
 public:
  static constexpr int64_t kDefaultBufferRows = int64_t(1) << 16;
  static constexpr int64_t kBufferTextBytes = int64_t(16) << 20;

  RecordStream(RecordStream&&) noexcept;
  RecordStream& operator=(RecordStream&&) noexcept;
  ~RecordStream();

  // One row: exactly one value per column, in the order the columns were declared, each
  // of its column's kind (floating point for Real, integer for Int, anything that converts
  // to std::string_view for Text; no NUL inside). Anything else is a bug (LLMHPC_CHECK),
  // so every column always holds the same number of rows.
  template <class... V>
  void append(const V&... values) {
    begin_row(sizeof...(V));
    int column = 0;
    (push(column++, values), ...);
    end_row();
  }
  // Writes the buffered rows now (nothing when none are buffered).
  void flush();
  // Writes the buffered rows, `attrs` (results known only at the end) and the final status.
  // Nothing may be appended afterwards.
  void close(const std::string& status = "ok", const Attrs& attrs = {});

  const std::string& group() const;
  int64_t rows() const;           // appended so far, written or not
  int64_t buffered_rows() const;  // appended but not yet written; always < buffer_rows()
  int64_t buffer_rows() const;

 private:
  friend class Recorder;
  struct State;
  explicit RecordStream(std::unique_ptr<State> state);
  void begin_row(size_t values);
  void end_row();
  void push_real(int column, double value);
  void push_int(int column, int64_t value);
  void push_text(int column, std::string_view value);
  template <class T>
  void push(int column, const T& value) {
    if constexpr (std::is_floating_point_v<T>) {
      push_real(column, double(value));
    } else if constexpr (std::is_integral_v<T>) {
      if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t))
        LLMHPC_CHECK(value <= T(std::numeric_limits<int64_t>::max()), "an unsigned value beyond int64");
      push_int(column, int64_t(value));
    } else {
      push_text(column, std::string_view(value));
    }
  }
  std::unique_ptr<State> state_;  // null once moved from
};

struct RunInfo {
  std::string mode, hostname, device_name, backend, argv, config_json, start_time, run_id;
  int64_t rank = 0, world_size = 1, local_rank = 0;
  // What a reader needs to trust a number: library versions, the GPU, its clocks and power
  // limit (docs/hdf5-schema.md, "Environment"); written as root attributes. The recorder adds
  // hdf5_version itself.
  Attrs environment;
};

constexpr int64_t kSchemaVersion = 1;

class Recorder {
 public:
  Recorder(std::string path, RunInfo info);
  ~Recorder();
  // Writes (or replaces) one record's group; the first call creates the file with the
  // root attributes and status "running". Throws WriteFailed where the system refuses the
  // write (a full disk): the file stays as it was, with the records written before.
  void write(const Record& record);
  // Writes the record's group with its attributes and status "running" before it is
  // measured: a run killed meanwhile leaves it so (analysis/llmhpc_h5.py: "interrupted").
  void write_running(const Record& record);
  // Starts a streamed record: creates (or replaces) its group with `attrs`, status
  // "running", attribute stream_rows = 0 and one empty chunked dataset per column, like
  // write() creating the file first. The stream owns the group until it is closed.
  RecordStream stream(const std::string& group, const std::vector<Column>& columns, const Attrs& attrs = {},
                      int64_t buffer_rows = RecordStream::kDefaultBufferRows);
  // Marks the run finished: root attribute status = "complete", or "error: ..." when a
  // mode failed (then only if the file exists: a run that recorded nothing stays absent).
  // `attrs`: root attributes known only at the end (how the collectives' library connected
  // the ranks: comm/nccl_log.h).
  void finish(const std::string& status = "complete", const Attrs& attrs = {});
  // finish() from another thread (the watchdog's, on its way out): only if no file is open
  // within `wait` (h5::library_lock), since the main thread may be stuck holding one; false
  // if it gave up. The record being measured is written first as last kept (keep_if_ended),
  // still "running". Unlike finish() it creates the file where nothing was recorded yet: a hang
  // before the first record is still reported in the rank file. Throws as finish() does.
  bool finish_within(const std::string& status, const Attrs& attrs, std::chrono::milliseconds wait);
  // A signal ends the run (install_stop_notice, from a thread of its own while the main thread
  // may be stuck, in a collective or holding the file): marks the records still "running" (the
  // configuration being measured, streams not closed) and the root "interrupted: <signal>"
  // ("... while measuring <group>"), if no file is open within `wait`; false if it gave up. The
  // rows a stream still buffered are lost; what it published stays. Throws as finish() does.
  bool interrupt_within(const std::string& signal, std::chrono::milliseconds wait);
  // The record being measured as it stands (its steps so far, status "running"), for
  // write_kept_within and finish_within to write from another thread: the main thread, stuck in
  // a collective, never reaches its next step to write it. Each call replaces the last; written
  // only while its group is still "running" (its end not written). Any thread.
  void keep_if_ended(std::shared_ptr<const Record> record);
  // After interrupt_within, where the main thread did not keep the steps itself: the record as
  // last kept, status "interrupted: <signal>", if its configuration has not ended and no file
  // is open within `wait`; false if it gave up. Throws as finish() does.
  bool write_kept_within(const std::string& signal, std::chrono::milliseconds wait);
  const std::string& path() const;

  struct File;  // the file and its working copy (recorder.cpp)

 private:
  void create_once();
  void finish_file(const std::string& status, const Attrs& attrs, bool even_if_absent);
  // keep_if_ended's record, written with `status` (its own where null) if its group is still
  // being measured. Holding h5::library_lock.
  void write_kept(const std::string* status);
  std::shared_ptr<File> file_;
  std::mutex kept_mutex_;  // guards kept_ alone: held for no more than a pointer's copy
  std::shared_ptr<const Record> kept_;
  RunInfo info_;
  bool created_ = false;
  bool finished_ = false;  // the root's final status is written
};

// A long measurement's record rewritten with its steps so far (--flush-s), on a thread of its
// own: the write (a copy of the rank file, an fsync) never sits between two timed steps, where
// under collectives it would delay every other rank's next step. One at a time. Rewrites every
// 0.2 s left 2 ranks' ddp steps as they were (max 64.5 ms against 64.5-64.9 without, one H200:
// docs/results/reliability.md, "Killed outright").
//
// Between the writes the record is also kept in memory for a run ended from another thread
// (Recorder::keep_if_ended: the watchdog's abort, a signal the stuck main thread never answers),
// made again once kKeepShare times the last making's own time has passed (a thousandth of the
// caller's time goes to that copy of the steps so far, and a hang loses at most the steps of
// the last kKeepShare x that time: none where a step takes longer), or once the steps have
// doubled since, whichever comes first. While its arrays are at most kKeepBytes: past that
// (comm's millions of iterations, which the copy would double) the copy is dropped, and a hang
// keeps what the last write wrote. The doubling bounds the copy that finds the keeping over,
// made once, to about twice kKeepBytes: by time alone, a 4 KB all-reduce on one CPU rank made
// its second copy 0.6 s in, at 2.5 million iterations (65 MB, 80 ms between two timed chunks),
// and glibc kept 44 MiB of it as resident memory, which a soak reads as a leak.
class RecordFlush {
 public:
  static constexpr int kKeepShare = 1000;
  static constexpr size_t kKeepBytes = size_t(4) << 20;
  // Every `every` (--flush-s; 0: never), counted from construction and from write_now.
  RecordFlush(Recorder& recorder, std::chrono::milliseconds every);
  ~RecordFlush();  // waits for the write under way (its failure is the next write's to report)
  RecordFlush(const RecordFlush&) = delete;
  RecordFlush& operator=(const RecordFlush&) = delete;
  // Between two steps, `steps` of them done so far: where `every` has passed and the last write
  // is done (else, a slow disk, this one is skipped), starts writing make()'s record; rethrows
  // the last write's failure (WriteFailed). Where the keeping is due (or the write), keeps
  // make()'s record too (Recorder::keep_if_ended; make() runs once for both).
  void when_due(int64_t steps, const std::function<Record()>& make);
  // Writes `record` now, after the write under way (the record's final or interrupted version
  // must land last), and counts `every` from here.
  void write_now(const Record& record);

 private:
  Recorder& recorder_;
  const std::chrono::milliseconds every_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  bool keeping_ = true;                              // the record's arrays are within kKeepBytes
  std::chrono::steady_clock::time_point kept_at_{};  // the last keep_if_ended (none yet: long ago)
  std::chrono::steady_clock::duration keep_took_{};  // what making that record took
  int64_t kept_steps_ = 0;                           // the steps it held
  std::future<void> writing_;
};

// A rank's file in a run's folder: "rank00003.h5" (docs/hdf5-schema.md).
std::string rank_file_name(int rank);
// Whether `path` names a rank file (rankNNNNN.h5, or its work copy while written) in `out_dir`.
bool is_rank_file_of(const std::string& path, const std::string& out_dir);

// "2026-11-22T10:31:07Z"
std::string utc_timestamp();
// The commit this binary was built from (`git describe`), the rank files' git_sha.
std::string build_git_sha();

}  // namespace llmhpc

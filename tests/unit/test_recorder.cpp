// The per-rank result file: the root attributes of docs/hdf5-schema.md, one group per record
// with status, attributes and raw arrays, and every finished record readable while the run goes on;
// streamed records: rows appended in bounded batches, readable while the stream runs and
// after it was abandoned, and rows of the wrong shape refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>

#include "src/io/h5.h"
#include "src/core/check.h"
#include "src/io/recorder.h"

namespace llmhpc {
namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/llmhpc_" + std::to_string(getpid()) + "_" + name;
}

RunInfo info() {
  RunInfo i;
  i.mode = "bench";
  i.hostname = "node7";
  i.device_name = "cpu";
  i.backend = "mpi";
  i.argv = "llmhpc --mode bench";
  i.config_json = "{\"steps\": 3}";
  i.start_time = utc_timestamp();
  i.rank = 1;
  i.world_size = 2;
  i.local_rank = 1;
  return i;
}

TEST(Recorder, RootAttributesAreTheSpecs) {
  const std::string path = temp_path("root.h5");
  Recorder rec(path, info());
  Record r;
  r.group = "bench/x";
  rec.write(r);
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  for (const char* a : {"mode", "rank", "world_size", "local_rank", "hostname", "device_name", "backend", "git_sha",
                        "argv", "config_json", "start_time", "schema_version", "status"})
    EXPECT_TRUE(h5::has_attr(f.id(), a)) << a;
  EXPECT_EQ(h5::read_attr_string(f.id(), "mode"), "bench");
  EXPECT_EQ(h5::read_attr_int(f.id(), "rank"), 1);
  EXPECT_EQ(h5::read_attr_int(f.id(), "world_size"), 2);
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "running");
  std::remove(path.c_str());
}

// The environment a reader needs to trust a number (device, libraries) becomes root
// attributes, with their types, next to the HDF5 version the recorder adds itself.
TEST(Recorder, EnvironmentBecomesRootAttributes) {
  const std::string path = temp_path("environment.h5");
  RunInfo i = info();
  i.environment = {{"gpu_name", std::string("NVIDIA H100 80GB HBM3")},
                   {"gpu_sm_clock_mhz", int64_t(1980)},
                   {"gpu_power_limit_w", 700.0}};
  Recorder rec(path, i);
  Record r;
  r.group = "bench/x";
  rec.write(r);
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::read_attr_string(f.id(), "gpu_name"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(h5::read_attr_int(f.id(), "gpu_sm_clock_mhz"), 1980);
  EXPECT_EQ(h5::read_attr_double(f.id(), "gpu_power_limit_w"), 700.0);
  const std::string hdf5 = h5::read_attr_string(f.id(), "hdf5_version");
  EXPECT_EQ(hdf5, h5::library_version());
  EXPECT_EQ(std::count(hdf5.begin(), hdf5.end(), '.'), 2) << hdf5;
  std::remove(path.c_str());
}

TEST(Recorder, RecordsKeepRawArraysStatusAndAttributes) {
  const std::string path = temp_path("records.h5");
  Recorder rec(path, info());
  Record r;
  r.group = "bench/small_T128";
  r.attr("d_model", int64_t(768)).attr("precision", std::string("fp32")).attr("lr", 1e-3);
  r.add("forward_ms", std::vector<double>{1.5, 2.5, 3.5}).add("count", std::vector<int64_t>{4, 5});
  r.add("tags", std::vector<std::string>{"a", "bb"});
  rec.write(r);
  Record oom;
  oom.group = "bench/xl_T128";
  oom.status = "oom";
  rec.write(oom);
  {
    // Readable while the recorder lives: the file is closed between records.
    h5::Handle f = h5::open_file(path, h5::Mode::Read);
    h5::Handle g = h5::open_group(f.id(), "bench/small_T128");
    EXPECT_EQ(h5::read_attr_string(g.id(), "status"), "ok");
    EXPECT_EQ(h5::read_attr_int(g.id(), "d_model"), 768);
    EXPECT_EQ(h5::read_attr_string(g.id(), "precision"), "fp32");
    EXPECT_DOUBLE_EQ(h5::read_attr_double(g.id(), "lr"), 1e-3);
    EXPECT_EQ(h5::read_doubles(g.id(), "forward_ms"), (std::vector<double>{1.5, 2.5, 3.5}));
    EXPECT_EQ(h5::read_ints(g.id(), "count"), (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(h5::read_attr_string(h5::open_group(f.id(), "bench/xl_T128").id(), "status"), "oom");
  }
  // Writing a group again replaces it.
  r.series[0].second = {9.0};
  rec.write(r);
  rec.finish();
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::read_doubles(f.id(), "bench/small_T128/forward_ms"), (std::vector<double>{9.0}));
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "complete");
  EXPECT_TRUE(h5::has_attr(f.id(), "end_time"));
  std::remove(path.c_str());
}

TEST(Recorder, NoFileUntilTheFirstRecordAndAnUnwritablePathIsAUsageError) {
  const std::string path = temp_path("lazy.h5");
  { Recorder rec(path, info()); }
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "a run that recorded nothing must leave no file";
  Recorder bad("/proc/llmhpc-cannot-write/rank00000.h5", info());
  Record r;
  r.group = "bench/x";
  EXPECT_THROW(bad.write(r), UsageError);
}

// The watchdog's last word (Recorder::finish_within from its thread): written when no file is
// open in the process, given up, file unchanged, while another thread holds one open.
TEST(Recorder, FinishFromAnotherThreadWaitsForOpenFilesOrGivesUp) {
  const std::string path = temp_path("aborted.h5");
  Recorder rec(path, info());
  Record r;
  r.group = "comm/allreduce";
  rec.write(r);
  const std::string other = temp_path("held_open.h5");
  bool written = true;
  {
    h5::Handle held = h5::open_file(other, h5::Mode::Create);  // the main thread inside HDF5
    std::thread watchdog(
        [&] { written = rec.finish_within("aborted by the watchdog: x", {}, std::chrono::milliseconds(50)); });
    watchdog.join();
  }
  EXPECT_FALSE(written) << "a file was open: the watchdog must give up, not write beside it";
  {
    h5::Handle f = h5::open_file(path, h5::Mode::Read);
    EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "running");
  }
  std::thread watchdog([&] {
    written = rec.finish_within("aborted by the watchdog: x", {{"hang_collective", int64_t(31)}},
                                std::chrono::milliseconds(50));
  });
  watchdog.join();
  EXPECT_TRUE(written);
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "aborted by the watchdog: x");
  EXPECT_EQ(h5::read_attr_int(f.id(), "hang_collective"), 31);
  f.reset();
  std::remove(path.c_str());
  std::remove(other.c_str());
}

// A hang before the first record: the watchdog's report still makes the file (an error does not).
TEST(Recorder, TheWatchdogsReportMakesTheFileWhereNothingWasRecorded) {
  const std::string path = temp_path("hung_early.h5");
  {
    Recorder rec(path, info());
    rec.finish("error: bad input");
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "an error before any record must leave no file";
  Recorder rec(path, info());
  bool written = false;
  std::thread watchdog([&] {
    written = rec.finish_within("aborted by the watchdog: x", {{"hang_collective", int64_t(3)}},
                                std::chrono::milliseconds(50));
  });
  watchdog.join();
  ASSERT_TRUE(written);
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "aborted by the watchdog: x");
  EXPECT_EQ(h5::read_attr_int(f.id(), "hang_collective"), 3);
  EXPECT_TRUE(h5::has_attr(f.id(), "mode")) << "the root attributes of every rank file";
  f.reset();
  std::remove(path.c_str());
}

// The record being measured when a run ends from another thread (the watchdog's abort; a signal
// the stuck main thread never answers, once the file is marked) is written as RecordFlush last
// kept it, with its steps: "running" under the watchdog's report, "interrupted: <signal>" under a
// signal's; a record that ended is never replaced by an older copy of it.
TEST(Recorder, AnEndFromAnotherThreadWritesTheRecordAsLastKept) {
  const std::string path = temp_path("kept.h5");
  const auto steps = [&](const std::string& group) {
    h5::Handle f = h5::open_file(path, h5::Mode::Read);
    h5::Handle g = h5::open_group(f.id(), group);
    return std::make_pair(h5::read_attr_string(g.id(), "status"),
                          h5::exists(g.id(), "step_ms") ? h5::read_doubles(g.id(), "step_ms").size() : 0);
  };
  Record done;
  done.group = "ddp/done";
  Record measuring;
  measuring.group = "ddp/measuring";
  for (const bool watchdog : {true, false}) {
    Recorder rec(path, info());
    rec.write_running(done);
    {
      RecordFlush flush(rec, std::chrono::milliseconds(0));  // --flush-s 0: no writes, the keeping still
      flush.when_due(3, [&] { return Record(done).add("step_ms", std::vector<double>{1, 2, 3}); });
    }
    Record ended = done;
    ended.add("step_ms", std::vector<double>{1, 2, 3, 4});
    rec.write(ended);  // its end: the copy kept before must not replace it
    rec.write_running(measuring);
    {
      RecordFlush flush(rec, std::chrono::milliseconds(0));
      flush.when_due(2, [&] {
        Record r = measuring;
        r.status = "running";
        return r.add("step_ms", std::vector<double>{5, 6});
      });
    }
    bool written = false;
    std::thread end([&] {
      constexpr std::chrono::milliseconds wait(50);
      written = watchdog ? rec.finish_within("aborted by the watchdog: x", {}, wait)
                         : rec.interrupt_within("SIGTERM", wait) && rec.write_kept_within("SIGTERM", wait);
    });
    end.join();
    ASSERT_TRUE(written);
    EXPECT_EQ(steps("ddp/done"), std::make_pair(std::string("ok"), size_t(4)));
    EXPECT_EQ(steps("ddp/measuring"),
              std::make_pair(std::string(watchdog ? "running" : "interrupted: SIGTERM"), size_t(2)));
    std::remove(path.c_str());
  }
}

// The copy kept between steps is made again before the steps double, so the one that finds the
// arrays past kKeepBytes is at most about twice that, and none is made after it: a loop of
// microsecond steps (comm's no-op all-reduces) made its second copy by time alone at 2.5
// million steps, 65 MB built between two chunks, most of it left resident by glibc.
TEST(RecordFlush, TheKeptCopyNeverOutgrowsTwiceTheLastNorPassesTwiceTheCap) {
  const std::string path = temp_path("keep-bound.h5");
  Recorder rec(path, info());
  constexpr size_t kStepBytes = sizeof(double);
  const int64_t cap_steps = int64_t(RecordFlush::kKeepBytes / kStepBytes);
  std::vector<int64_t> made;  // the steps each copy held
  {
    RecordFlush flush(rec, std::chrono::milliseconds(0));
    for (int64_t steps = 1; steps <= 8 * cap_steps; ++steps)
      flush.when_due(steps, [&] {
        made.push_back(steps);
        Record r;
        r.group = "comm/x";
        return r.add("time_us", std::vector<double>(size_t(steps), 1.0));
      });
  }
  ASSERT_GE(made.size(), size_t(2));
  EXPECT_EQ(made.front(), 1);
  for (size_t k = 1; k < made.size(); ++k)
    EXPECT_LE(made[k], 2 * made[k - 1]) << "copy " << k << " after " << made[k - 1] << " steps";
  EXPECT_GT(made.back(), cap_steps) << "the keeping never found the arrays past kKeepBytes";
  EXPECT_LE(made.back(), 2 * cap_steps + 2) << "the last copy outgrew twice kKeepBytes";
  EXPECT_LE(made.end()[-2], cap_steps) << "a copy was made after one past kKeepBytes";
  std::remove(path.c_str());
}

TEST(Recorder, AFailedRunIsMarkedAsSuch) {
  const std::string path = temp_path("failed.h5");
  Recorder rec(path, info());
  Record r;
  r.group = "train";
  rec.write(r);
  rec.finish("error: something broke");
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "error: something broke");
  std::remove(path.c_str());
}

// Three columns of every kind, with the values that break naive code: extremes, -0.0,
// denormals, empty strings, a string longer than a chunk, non-ASCII text.
std::vector<Column> three_columns() {
  return {{"t_ms", ColumnType::Real}, {"bytes", ColumnType::Int}, {"name", ColumnType::Text}};
}
double real_at(int64_t i) {
  const double special[] = {0.0, -0.0, 1e308, -1e-310, std::numeric_limits<double>::infinity(), 0.1};
  return i % 7 == 0 ? special[(i / 7) % 6] : 0.25 * double(i) - 3.0;
}
int64_t int_at(int64_t i) {
  const int64_t special[] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), -1, 0};
  return i % 5 == 0 ? special[(i / 5) % 4] : i * 1000003;
}
std::string text_at(int64_t i) {
  if (i % 3 == 0) return "";
  if (i % 101 == 0) return std::string(200000 + i, char('a' + i % 26));
  return "kernel_" + std::to_string(i) + (i % 2 ? "_größe" : "");
}

struct StreamFile {
  std::vector<double> reals;
  std::vector<int64_t> ints;
  std::vector<std::string> texts;
  std::string status;
  int64_t stream_rows = -1;
};
StreamFile read_stream(const std::string& path, const std::string& group) {
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  h5::Handle g = h5::open_group(f.id(), group);
  return {h5::read_doubles(g.id(), "t_ms"), h5::read_ints(g.id(), "bytes"), h5::read_strings(g.id(), "name"),
          h5::read_attr_string(g.id(), "status"), h5::read_attr_int(g.id(), "stream_rows")};
}
// The first `rows` rows of the file are exactly rows 0..rows-1, and there are no more.
void expect_rows(const StreamFile& got, int64_t rows) {
  ASSERT_EQ(int64_t(got.reals.size()), rows);
  ASSERT_EQ(int64_t(got.ints.size()), rows);
  ASSERT_EQ(int64_t(got.texts.size()), rows);
  EXPECT_EQ(got.stream_rows, rows);
  for (int64_t i = 0; i < rows; ++i) {
    const double want = real_at(i);
    EXPECT_EQ(std::memcmp(&got.reals[i], &want, sizeof want), 0) << "row " << i << ": bitwise, so -0.0 is not 0.0";
    EXPECT_EQ(got.ints[i], int_at(i)) << "row " << i;
    EXPECT_EQ(got.texts[i], text_at(i)) << "row " << i;
  }
}

TEST(Recorder, StreamManySmallBatchesAcrossTheBufferReadBackExactly) {
  const std::string path = temp_path("stream.h5");
  Recorder rec(path, info());
  const int64_t rows = 1234, buffer = 100;
  RecordStream s = rec.stream("trace/kernels", three_columns(), {{"device", std::string("cpu")}}, buffer);
  for (int64_t i = 0; i < rows; ++i) {
    s.append(real_at(i), int_at(i), text_at(i));
    EXPECT_EQ(s.rows(), i + 1);
    EXPECT_LT(s.buffered_rows(), s.buffer_rows()) << "the buffer must never hold more than its bound";
    if (i % 37 == 36) s.flush();  // batches of every size, most of them not aligned to the buffer
  }
  s.close("ok", {{"dropped", int64_t(0)}});
  StreamFile got = read_stream(path, "trace/kernels");
  expect_rows(got, rows);
  EXPECT_EQ(got.status, "ok");
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  h5::Handle g = h5::open_group(f.id(), "trace/kernels");
  EXPECT_EQ(h5::read_attr_string(g.id(), "device"), "cpu");
  EXPECT_EQ(h5::read_attr_int(g.id(), "dropped"), 0);
  EXPECT_EQ(h5::read_attr_string(f.id(), "status"), "running") << "the run goes on; finish() ends it";
  std::remove(path.c_str());
}

TEST(Recorder, StreamABatchIsWrittenExactlyWhenTheBufferIsFull) {
  const std::string path = temp_path("bound.h5");
  Recorder rec(path, info());
  const int64_t buffer = 16;
  RecordStream s = rec.stream("alloc/timeline", three_columns(), {}, buffer);
  auto rows_in_file = [&] { return read_stream(path, "alloc/timeline").stream_rows; };
  for (int64_t i = 0; i < 3 * buffer; ++i) {
    s.append(real_at(i), int_at(i), text_at(i));
    EXPECT_EQ(rows_in_file(), (i + 1) / buffer * buffer) << "after row " << i;
    EXPECT_EQ(s.buffered_rows(), (i + 1) % buffer);
  }
  // Strings bound the buffer too: 1 MiB strings flush at kBufferTextBytes, long before 1000 rows.
  RecordStream big = rec.stream("big", {{"name", ColumnType::Text}}, {}, 1000);
  const int64_t per_batch = RecordStream::kBufferTextBytes / ((1 << 20) + 1) + 1;
  for (int64_t i = 0; i < per_batch; ++i) big.append(std::string(1 << 20, 'x'));
  EXPECT_EQ(big.buffered_rows(), 0);
  {
    h5::Handle f = h5::open_file(path, h5::Mode::Read);
    EXPECT_EQ(h5::dataset_dims(f.id(), "big/name"), (std::vector<int64_t>{per_batch}));
  }
  big.close();
  s.close();
  std::remove(path.c_str());
}

TEST(Recorder, StreamReadableWhileRunningAndAfterAnExceptionUnwoundIt) {
  const std::string path = temp_path("unwound.h5");
  Recorder rec(path, info());
  const int64_t buffer = 10, rows = 25;
  try {
    RecordStream s = rec.stream("trace/kernels", three_columns(), {}, buffer);
    {
      StreamFile empty = read_stream(path, "trace/kernels");
      expect_rows(empty, 0);  // every column is there from the start, empty
      EXPECT_EQ(empty.status, "running");
    }
    for (int64_t i = 0; i < rows; ++i) s.append(real_at(i), int_at(i), text_at(i));
    StreamFile running = read_stream(path, "trace/kernels");  // the file is closed between batches
    expect_rows(running, rows / buffer * buffer);
    EXPECT_EQ(running.status, "running");
    RecordStream moved = std::move(s);  // only the stream that owns the rows writes them
    throw std::runtime_error("out of memory, say");
  } catch (const std::runtime_error&) {
  }
  StreamFile got = read_stream(path, "trace/kernels");
  expect_rows(got, rows);
  EXPECT_EQ(got.status, "interrupted");
  std::remove(path.c_str());
}

TEST(Recorder, StreamDatasetsAreChunkedAndUnlimitedPlainRecordsStayContiguous) {
  const std::string path = temp_path("layout.h5");
  Recorder rec(path, info());
  RecordStream s = rec.stream("trace/kernels", three_columns());
  Record plain;
  plain.group = "bench/x";
  plain.add("forward_ms", std::vector<double>{1.0, 2.0});
  rec.write(plain);  // between two batches of the stream: each opens and closes the file itself
  s.append(1.0, 2, "a");
  s.close();
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  for (const char* name : {"trace/kernels/t_ms", "trace/kernels/bytes", "trace/kernels/name"}) {
    h5::Handle ds(H5Dopen2(f.id(), name, H5P_DEFAULT), H5Dclose);
    h5::Handle dcpl(H5Dget_create_plist(ds.id()), H5Pclose);
    ASSERT_EQ(H5Pget_layout(dcpl.id()), H5D_CHUNKED) << name;
    hsize_t chunk = 0, dims = 0, maxdims = 0;
    EXPECT_EQ(H5Pget_chunk(dcpl.id(), 1, &chunk), 1);
    EXPECT_EQ(chunk, hsize_t(RecordStream::kDefaultBufferRows)) << name;
    EXPECT_EQ(H5Pget_nfilters(dcpl.id()), 0) << name;
    h5::Handle space(H5Dget_space(ds.id()), H5Sclose);
    H5Sget_simple_extent_dims(space.id(), &dims, &maxdims);
    EXPECT_EQ(dims, 1u);
    EXPECT_EQ(maxdims, H5S_UNLIMITED) << name;
  }
  h5::Handle ds(H5Dopen2(f.id(), "bench/x/forward_ms", H5P_DEFAULT), H5Dclose);
  h5::Handle dcpl(H5Dget_create_plist(ds.id()), H5Pclose);
  EXPECT_EQ(H5Pget_layout(dcpl.id()), H5D_CONTIGUOUS);
  EXPECT_EQ(h5::read_doubles(f.id(), "bench/x/forward_ms"), (std::vector<double>{1.0, 2.0}));
  std::remove(path.c_str());
}

// A row that does not fit the columns would leave columns of unequal length: it is a bug.
TEST(RecorderDeathTest, StreamRowsOfTheWrongShapeAreFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: MPI is initialised anew
  const std::string path = temp_path("death.h5");
  Recorder rec(path, info());
  RecordStream s = rec.stream("trace/kernels", three_columns());
  EXPECT_DEATH(s.append(1.0, 2), "a row of 2 values for 'trace/kernels', which has 3 columns");
  EXPECT_DEATH(s.append(1.0, 2, "x", 4), "a row of 4 values");
  EXPECT_DEATH(s.append(1, 2, "x"), "column 't_ms' of 'trace/kernels' is Real");
  EXPECT_DEATH(s.append(1.0, 2.0, "x"), "column 'bytes' of 'trace/kernels' is Int");
  EXPECT_DEATH(s.append(1.0, 2, 3), "column 'name' of 'trace/kernels' is Text");
  EXPECT_DEATH(s.append(1.0, 2, std::string("a\0b", 3)), "a string with a NUL");
  EXPECT_DEATH(s.append(1.0, uint64_t(1) << 63, "x"), "an unsigned value beyond int64");
  s.close();
  EXPECT_DEATH(s.append(1.0, 2, "x"), "closed or moved from");
  EXPECT_DEATH(rec.stream("y", {{"a", ColumnType::Int}, {"a", ColumnType::Real}}), "column name 'a'");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace llmhpc

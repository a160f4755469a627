// The per-rank result file: SPEC's root attributes, one group per record with status,
// attributes and raw arrays, and every finished record readable while the run goes on.
#include <gtest/gtest.h>
#include <unistd.h>

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

}  // namespace
}  // namespace llmhpc

// A mode is one row in the registry (registry.cpp): its name, a one-line summary, its
// options, and the function that runs it on every rank. main.cpp only bootstraps and
// dispatches. To add a mode: src/modes/<name>.cpp, one row in the registry,
// jobs/<name>.sh, analysis/<name>.py.
#pragma once
#include <boost/program_options.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/runtime.h"
#include "src/io/recorder.h"

namespace llmhpc {

namespace po = boost::program_options;

// What a mode runs with, besides its own options (parsed once by its prepare).
struct ModeContext {
  Runtime& rt;
  Backend& backend;
  Recorder& recorder;
  std::string out_dir;
  std::chrono::milliseconds device_sample;  // --device-sample-ms (every mode's): 0, never
  // --flush-s: how often a long measurement (train: the run) rewrites its record with the steps
  // so far (status "running", read as interrupted once the run has ended), so that a kill with
  // no time to clean up (SIGKILL, a scheduler's KillWait run out) loses at most that much; 0,
  // only at its end.
  std::chrono::milliseconds flush;
  // A sweep's configurations so far, and those of them that ran out of memory on some rank: a
  // sweep none of whose configurations fit ends with exit code 3 (main.cpp), as a model that
  // does not fit at all does.
  int64_t configurations = 0, out_of_memory = 0;
  void count_configuration(bool oom) {
    ++configurations;
    if (oom) ++out_of_memory;
  }
};

// What a mode runs, holding the options it parsed.
using ModeRun = std::function<void(ModeContext&)>;

struct ModeSpec {
  std::string name;
  std::string summary;
  std::function<void(po::options_description&)> add_options;
  // Parses and checks the options alone (no files, no device: the same answer on every rank of
  // a `world_size`-rank job) before any output is created, and returns the run. Throws
  // UsageError.
  std::function<ModeRun(const po::variables_map&, int world_size)> prepare;
  // Options this mode once spelt otherwise, old -> new: given, they are refused with the new name.
  std::vector<std::pair<std::string, std::string>> renamed = {};
};

const std::vector<ModeSpec>& all_modes();
const ModeSpec* find_mode(const std::string& name);

// Runs `check` on every rank; a UsageError (exit 2) or OutOfMemory (exit 3) on any rank
// becomes a clean exit on all of them, with the message printed once by rank 0 (see
// agree_or_exit).
void collective_check(const Runtime& rt, const std::function<void()>& check);

}  // namespace llmhpc

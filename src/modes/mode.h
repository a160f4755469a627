// A mode is one row in the registry (registry.cpp): its name, a one-line summary, its
// options, and the function that runs it on every rank. main.cpp only bootstraps and
// dispatches. To add a mode: src/modes/<name>.cpp, one row in the registry,
// jobs/<name>.sh, analysis/<name>.py.
#pragma once
#include <boost/program_options.hpp>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/runtime.h"
#include "src/io/recorder.h"

namespace llmhpc {

namespace po = boost::program_options;

struct ModeContext {
  Runtime& rt;
  const po::variables_map& vm;
  Backend& backend;
  Recorder& recorder;
  std::string out_dir;
};

struct ModeSpec {
  std::string name;
  std::string summary;
  std::function<void(po::options_description&)> add_options;
  // Checks the options alone (no files, no device): same answer on every rank. Throws
  // UsageError. Runs before any output is created.
  std::function<void(const po::variables_map&)> validate;
  std::function<void(ModeContext&)> run;
};

const std::vector<ModeSpec>& all_modes();
const ModeSpec* find_mode(const std::string& name);

// Runs `check` on every rank; a UsageError on any rank becomes a clean exit on all of
// them, with the message printed once by rank 0 (see agree_or_exit).
void collective_check(const Runtime& rt, const std::function<void()>& check);

}  // namespace llmhpc

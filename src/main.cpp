// llmhpc: one SPMD binary. Every rank runs this: MPI start-up, options, device, output
// file, then the chosen mode (src/modes). Nothing else lives here.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <iostream>
#include <thread>

#include <unistd.h>

#include "comm/communicator.h"
#include "comm/mpi_connections.h"
#include "comm/nccl_log.h"
#include "kernels/backend.h"
#include "src/core/progress_board.h"
#include "src/core/stop_request.h"
#include "src/core/units.h"
#include "src/core/watchdog.h"
#include "src/io/h5.h"
#include "src/io/recorder.h"
#include "src/modes/mode.h"
#include "src/modes/options.h"
#include "src/modes/progress.h"

namespace llmhpc {
namespace {

po::options_description general_options() {
  po::options_description d("General options");
  auto text = [](const char* def) { return po::value<std::string>()->default_value(def); };
  std::vector<std::string> names;
  for (const ModeSpec& m : all_modes()) names.push_back(m.name);
  d.add_options()("help,h", po::bool_switch(), "show help; with --mode, that mode's options too")(
      "version", po::bool_switch(),
      "print llmhpc's commit and the MPI, NCCL (CUDA builds) and HDF5 libraries it runs with")(
      "mode", text("bench"), join(names, " | ").c_str())("device", text("auto"),
                                                         "auto | cpu | cuda (auto: cuda when a GPU is visible)")(
      "allow-gpu-sharing", po::bool_switch(), "let several ranks of a node share one GPU")(
      "backend", text("auto"), "collectives: auto | nccl | mpi (auto: nccl on GPUs, mpi on CPUs)")(
      "out", po::value<std::string>(), "output directory for the rank files (default results/<mode>-<time>)")(
      "seed", text("0"), "seed for initialisation and random data")(
      "memory-limit", po::value<std::string>(),
      "cap on this rank's device memory, e.g. 8GB; beyond it is out-of-memory (CPU default: 85% of the node's "
      "available memory over its ranks, the rest left to what the allocator does not count)")(
      "threads", text("0"),
      "CPU threads per rank (0: OMP_NUM_THREADS if set, else the CPUs this rank may run on / the node's ranks "
      "that share them)")("tf32", po::bool_switch(), "allow TF32 tensor cores for fp32 matrix products (CUDA)")(
      "gemm-sm-margin", text("0"),
      "SMs the matrix products leave free for work beside them, e.g. NCCL's kernels during data-parallel "
      "backward (CUDA; cuBLAS's SM count target; 0: all SMs)")(
      "gemm-autotune", po::bool_switch(),
      "time cuBLASLt's 8 candidate algorithms for each matrix product on its first call and keep the fastest "
      "(CUDA; the first step takes longer, so --warmup must be at least 1 with it; results are bitwise reproducible "
      "within a run, not across runs)")(
      "comm-timeout", text("600"),
      "seconds a collective may go without completing before the watchdog reports it, with the ranks that had "
      "not reached it, and aborts the job (exit code 4; at least 1; 0: no watchdog)")(
      "device-sample-ms", text("50"),
      "read the GPU's SM clock, power, temperature and clock slowdown reasons (NVML) every N ms while each "
      "configuration is measured (train: over the run), into the rank file; rank 0 says when the clocks slowed (0: "
      "no readings)")(
      "progress-s", text("10"),
      "while a configuration's steps run (bench, profile, attention, precision, comm, ddp), rank 0 prints how "
      "many are done about every N seconds, the first after N: nothing for a shorter one (0: never)")(
      "flush-s", text("60"),
      "while a configuration's steps run (train: the run), rewrite its record with the steps so far every N "
      "seconds, so that a kill with no time to clean up (SIGKILL) loses at most N seconds of them; each rewrite "
      "copies the rank file (0: only when it ends)");
  return d;
}

void print_help(const po::options_description& general, const ModeSpec* mode) {
  std::cout << "llmhpc - measure and speed up GPT-style training on GPU clusters\n\n"
               "usage: [mpirun -np N] llmhpc --mode MODE [options]\n\n";
  if (!mode) {
    std::cout << "Modes:\n";
    for (const ModeSpec& m : all_modes()) std::printf("  %-10s %s\n", m.name.c_str(), m.summary.c_str());
    std::cout << "\n"
              << general
              << "\n'llmhpc --mode MODE --help' lists a mode's own options; docs/guide.md shows them at work, and "
                 "says what \"the reference ... study\" means (its section \"The reference studies\").\n";
    return;
  }
  po::options_description own;
  mode->add_options(own);
  std::cout << "Mode " << mode->name << ": " << mode->summary << "\n\n" << general << "\n" << own << "\n";
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

// --device and the GPU this rank gets (local_rank % gpus). Throws UsageError.
BackendOptions choose_device(const Runtime& rt, const po::variables_map& vm) {
  const std::string want = opt_string(vm, "device");
  require_choice(want, {"auto", "cpu", "cuda"}, "device");
  BackendOptions b;
  b.tf32 = opt_flag(vm, "tf32");
  b.gemm_sm_margin = fits_int(opt_nonnegative(vm, "gemm-sm-margin"), "gemm-sm-margin");
  b.gemm_autotune = opt_flag(vm, "gemm-autotune");
  if (vm.count("memory-limit")) {
    b.memory_limit = parse_size(opt_string(vm, "memory-limit"), "memory-limit");
    if (b.memory_limit == 0) throw UsageError("--memory-limit 0: must be a positive size (e.g. 8GB), or left out");
  }
  const int gpus = cuda_device_count();
  if (want == "cuda" && !cuda_compiled())
    throw UsageError("--device cuda: this llmhpc was built without the CUDA backend (no nvcc at build time)");
  if (want == "cuda" && gpus == 0)
    throw UsageError("--device cuda: no GPU is visible on host " + rt.hostname + " (check CUDA_VISIBLE_DEVICES)");
  b.kind = (want == "cuda" || (want == "auto" && gpus > 0)) ? DeviceKind::Cuda : DeviceKind::Cpu;
  // cuBLAS's settings on the CPU would be ignored, and a run read as if they had applied.
  const std::pair<bool, const char*> gpu_only[] = {
      {b.tf32, "--tf32"}, {b.gemm_autotune, "--gemm-autotune"}, {b.gemm_sm_margin > 0, "--gemm-sm-margin"}};
  for (const auto& [given, name] : gpu_only)
    if (given && b.kind == DeviceKind::Cpu)
      throw UsageError(std::string(name) + " sets up cuBLAS's matrix products on a GPU, and this run is on the CPU" +
                       (want == "auto" ? " (--device auto found no GPU)" : "") + ": leave it out");
  if (b.kind == DeviceKind::Cuda) {
    if (rt.local_size > gpus && !opt_flag(vm, "allow-gpu-sharing"))
      throw UsageError(std::to_string(rt.local_size) + " ranks on host " + rt.hostname + " but only " +
                       std::to_string(gpus) + " GPU(s): start at most one rank per GPU, or pass --allow-gpu-sharing");
    b.ordinal = rt.local_rank % gpus;
  } else if (!b.memory_limit) {
    b.memory_limit = host_usable_memory() / size_t(rt.local_size);  // ranks of a node share its memory
  }
  return b;
}

// CPU threads: --threads, else OMP_NUM_THREADS, else this rank's share of the CPUs it may run
// on (Runtime::cpu_share: a rank the launcher bound to one core gets one thread, not one per
// core of the host taking turns on it). Rank 0 says so when the binding leaves it a quarter of
// its share of the host or less: host-side work (the CPU backend's ops, checking a token file)
// then crawls, and mpirun --bind-to none (as jobs/ launch) lifts it. Collective over the node.
// Returns the CPUs this rank may run on and those any rank of its node may (the rank files'
// cpus_allowed and node_cpus_allowed: the report tells ranks that took turns on cores by them).
struct CpuPlace {
  int allowed = 0, node_allowed = 0;
};
CpuPlace set_threads(const Runtime& rt, const po::variables_map& vm) {
  int allowed = 0, node_allowed = 0;
  const int share = rt.cpu_share(&allowed, &node_allowed);  // first: collective, before any rank can throw
  const int64_t asked = opt_nonnegative(vm, "threads");
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  if (asked > cores)
    throw UsageError("--threads " + std::to_string(asked) + ": host " + rt.hostname + " has " + std::to_string(cores) +
                     " hardware threads; ask for at most that many (0: this rank's share of them)");
  int n = int(asked);
  if (n == 0 && std::getenv("OMP_NUM_THREADS")) n = omp_get_max_threads();
  if (n == 0) n = share;
  const int64_t fair = std::max<int64_t>(1, cores / rt.local_size);
  if (rt.is_root() && asked == 0 && int64_t(share) * 4 <= fair)
    std::fprintf(stderr,
                 "llmhpc: note: rank 0 may run on %d of this host's %lld CPUs (its launcher bound it; Open MPI "
                 "binds each rank to one core when it starts at most 2), so host-side work such as the CPU "
                 "backend's ops runs on those alone; launch with mpirun --bind-to none to use %lld\n",
                 allowed, (long long)cores, (long long)fair);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return {allowed, node_allowed};
}

// The output directory this run created, removed again if the run fails before any rank
// wrote into it (so a rejected run leaves nothing behind).
std::string g_created_out_dir;

// Rank 0 picks and checks the directory; every rank creates it (nodes may not share
// rank 0's view until they do) and proves it can write there.
std::string prepare_out_dir(const Runtime& rt, const po::variables_map& vm, const std::string& mode) {
  namespace fs = std::filesystem;
  std::string dir, error;
  if (rt.is_root()) {
    if (vm.count("out")) {
      dir = opt_string(vm, "out");
      if (fs::exists(dir + "/rank00000.h5"))
        error = "--out '" + dir + "' already holds results (rank00000.h5): choose a new directory or remove them";
    } else {
      char stamp[32];
      std::time_t now = std::time(nullptr);
      std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
      dir = "results/" + mode + "-" + stamp;
      for (int k = 1; fs::exists(dir); ++k) dir = "results/" + mode + "-" + stamp + "-" + std::to_string(k);
    }
  }
  agree_or_exit(rt, error);
  dir = rt.broadcast(dir);
  std::error_code ec;
  const bool existed = fs::is_directory(dir);
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    error = "--out '" + dir + "': cannot create the directory (" + ec.message() + ")";
  } else {
    const std::string probe = dir + "/.llmhpc-write-test-" + std::to_string(rt.rank);
    std::FILE* f = std::fopen(probe.c_str(), "w");
    if (!f) error = "--out '" + dir + "': the directory is not writable";
    else std::fclose(f), std::remove(probe.c_str());
  }
  if (rt.is_root() && !existed) g_created_out_dir = dir;
  agree_or_exit(rt, error);
  return dir;
}

// --comm-timeout: seconds (at least 1), 0 for no watchdog.
double comm_timeout_seconds(const po::variables_map& vm) {
  const double s = opt_double(vm, "comm-timeout");
  if (!(s >= 0) || s > 1e7)
    throw UsageError("--comm-timeout " + opt_string(vm, "comm-timeout") +
                     ": must be a number of seconds from 0 (no watchdog) to 1e7");
  if (s > 0 && s < 1)  // the watchdog looks every tenth of it: sooner would call slow collectives hung
    throw UsageError("--comm-timeout " + opt_string(vm, "comm-timeout") +
                     ": must be 0 (no watchdog) or at least 1 second");
  return s;
}

// An option given more than once: the last one wins, as getopt and argparse have it (a list
// option's last list replaces the others), so a job's EXTRA_ARGS override what the job passes.
po::parsed_options last_wins(po::parsed_options parsed) {
  std::set<std::string> seen;
  std::vector<po::option> kept;
  for (auto it = parsed.options.rbegin(); it != parsed.options.rend(); ++it)
    if (it->string_key.empty() || seen.insert(it->string_key).second) kept.push_back(*it);
  parsed.options.assign(kept.rbegin(), kept.rend());
  return parsed;
}

// A watchdog's hang report as root attributes of the rank file (docs/hdf5-schema.md, "Hangs").
Attrs hang_attrs(const Watchdog::HangReport& r) {
  return {{"hang_collective", int64_t(r.collective)},       {"hang_reached", rank_ranges(r.reached)},
          {"hang_not_reached", rank_ranges(r.not_reached)}, {"hang_not_reached_hosts", join(r.not_reached_hosts, ",")},
          {"hang_no_answer", rank_ranges(r.no_answer)},     {"hang_no_answer_hosts", join(r.no_answer_hosts, ",")},
          {"hang_mismatched", rank_ranges(r.mismatched)},   {"hang_group", rank_ranges(r.group)},
          {"hang_waited_for", rank_ranges(r.waited_for)},   {"hang_late_s", r.late_s},
          {"hang_fired_on_rank", int64_t(r.fired_on_rank)}, {"hang_report", r.text}};
}

// The job's nodes as MPI's shared-memory split sees them, for the rank files: node_count,
// node_index (nodes numbered by their lowest world rank), local_size and ranks_per_node (each
// node's rank count, in node order, e.g. "2,1"). Collective.
Attrs node_topology(const Runtime& rt) {
  int lowest = rt.rank;  // this node's lowest world rank names it
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, rt.node_comm));
  std::vector<int> of_rank(static_cast<size_t>(rt.world_size));
  MPI_CHECK(MPI_Allgather(&lowest, 1, MPI_INT, of_rank.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::map<int, int64_t> ranks_on;  // node's lowest rank -> its ranks, in node order
  for (int r : of_rank) ++ranks_on[r];
  int64_t index = 0, i = 0;
  std::string per_node;
  for (const auto& [node, count] : ranks_on) {
    if (node == lowest) index = i;
    per_node += (i++ ? "," : "") + std::to_string(count);
  }
  return {{"node_count", int64_t(ranks_on.size())},
          {"node_index", index},
          {"local_size", int64_t(rt.local_size)},
          {"ranks_per_node", per_node}};
}

// Options by their full names only: Boost would read --step as --steps and --cont as
// --context-length, which a job script then depends on without anyone knowing.
constexpr int kFullNames = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

int run(Runtime& rt, int argc, char** argv, bool& in_mode) {
  const po::options_description general = general_options();
  po::variables_map first;
  try {
    po::store(
        last_wins(po::command_line_parser(argc, argv).options(general).style(kFullNames).allow_unregistered().run()),
        first);
  } catch (const po::error& e) {  // a general option given twice, or without its value
    throw UsageError(std::string(e.what()) + " (see llmhpc --help)");
  }
  const std::string mode_name = opt_string(first, "mode");
  if (argc == 1 && rt.is_root())  // a first try with no options: say what runs and where the rest is
    std::fprintf(stderr, "llmhpc: note: no options: the default run, --mode bench of the small model (on the CPU, "
                         "minutes; --model tiny is seconds); llmhpc --help lists the modes\n");
  const ModeSpec* mode = find_mode(mode_name);
  if (!mode) {
    std::vector<std::string> names;
    for (const ModeSpec& m : all_modes()) names.push_back(m.name);
    throw UsageError("--mode '" + mode_name + "': unknown mode; choose one of " + join(names, ", "));
  }
  // A renamed option is refused by its new name, before parsing: it may be a prefix of another
  // option that the parser would otherwise take it for (--batch, --batch-size).
  for (int i = 1; i < argc; ++i)
    for (const auto& [old_name, new_name] : mode->renamed) {
      const std::string arg = argv[i], flag = "--" + old_name;
      if (arg == flag || arg.rfind(flag + "=", 0) == 0)
        throw UsageError(flag + " is --" + new_name + " now, as in the other modes (see llmhpc --mode " + mode_name +
                         " --help)");
    }
  po::options_description all;
  all.add(general);
  mode->add_options(all);
  // An option whose value was left out would take the next option as its value (--save
  // --low-memory wrote a checkpoint named "--low-memory" and trained without it): no value starts
  // with --.
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string arg = argv[i], next = argv[i + 1];
    if (arg.rfind("--", 0) != 0 || arg.find('=') != std::string::npos || next.rfind("--", 0) != 0) continue;
    const po::option_description* o = all.find_nothrow(arg.substr(2), false);
    if (o && o->semantic()->min_tokens() > 0)
      throw UsageError(arg + " needs a value, and the next argument is the option " + next + ": give " + arg +
                       " VALUE (see llmhpc --mode " + mode_name + " --help)");
  }
  po::variables_map vm;
  try {
    const po::parsed_options parsed =
        last_wins(po::command_line_parser(argc, argv).options(all).style(kFullNames).run());
    // A bare word is no option: "llmhpc precision" must not quietly run the default mode.
    const std::vector<std::string> stray = po::collect_unrecognized(parsed.options, po::include_positional);
    if (!stray.empty())
      throw UsageError(
          "unexpected argument '" + stray[0] + "'" +
          (find_mode(stray[0]) ? ": a mode is chosen with --mode " + stray[0] : ": every option starts with --") +
          " (see llmhpc --help)");
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {  // say which modes have it, if any
    std::vector<std::string> owners;
    const std::string name = e.get_option_name();
    for (const ModeSpec& m : all_modes()) {
      po::options_description theirs;
      m.add_options(theirs);
      if (name.rfind("--", 0) == 0 && theirs.find_nothrow(name.substr(2), false)) owners.push_back(m.name);
    }
    std::vector<std::string> meant;  // the full names it begins, which Boost's guessing would have taken
    if (name.rfind("--", 0) == 0 && name.size() > 2)
      for (const auto& o : all.options())
        if (o->long_name().rfind(name.substr(2), 0) == 0) meant.push_back("--" + o->long_name());
    throw UsageError(std::string(e.what()) + (meant.empty() ? "" : ": did you mean " + join(meant, " or ") + "?") +
                     " (for --mode " + mode_name + "; " +
                     (owners.empty() ? "" : "an option of --mode " + join(owners, ", ") + "; ") + "see llmhpc --mode " +
                     mode_name + " --help)");
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (for --mode " + mode_name + "; see llmhpc --mode " + mode_name +
                     " --help)");
  }
  if (opt_flag(vm, "help")) {
    if (rt.is_root()) print_help(general, opt_given(first, "mode") ? mode : nullptr);
    return 0;
  }
  if (opt_flag(vm, "version")) {
    if (rt.is_root()) {
      std::printf("llmhpc %s\n", build_git_sha().c_str());
      for (const auto& [name, version] : comm_library_versions()) std::printf("%s %s\n", name.c_str(), version.c_str());
      std::printf("hdf5_version %s\n", h5::library_version().c_str());
    }
    return 0;
  }
  // Options alone: the same verdict on every rank, so a plain exception is enough.
  require_choice(opt_string(vm, "backend"), {"auto", "nccl", "mpi"}, "backend");
  opt_nonnegative(vm, "seed");
  const double comm_timeout = comm_timeout_seconds(vm);
  if (opt_int(vm, "device-sample-ms") < 0 || opt_int(vm, "device-sample-ms") > 60000)
    throw UsageError("--device-sample-ms " + opt_string(vm, "device-sample-ms") +
                     ": must be a whole number of milliseconds from 0 (no readings) to 60000");
  const double progress_s = opt_double(vm, "progress-s");
  if (!(progress_s >= 0) || progress_s > 1e7)
    throw UsageError("--progress-s " + opt_string(vm, "progress-s") +
                     ": must be a number of seconds from 0 (no progress lines) to 1e7");
  set_progress_interval(progress_s);
  const double flush_s = opt_double(vm, "flush-s");
  if (!(flush_s >= 0) || flush_s > 1e7)
    throw UsageError("--flush-s " + opt_string(vm, "flush-s") +
                     ": must be a number of seconds from 0 (the record written only when it ends) to 1e7");
  const ModeRun run_mode = mode->prepare(vm, rt.world_size);
  // One program, one set of options: ranks started with others (an MPMD launch, a wrapper that
  // adds arguments) would measure or train different things under one run's name.
  const std::string options = options_json(vm), arguments = command_line(argc - 1, argv + 1);
  const std::string root_arguments = rt.broadcast(arguments);
  agree_or_exit(rt, rt.broadcast(options) == options
                        ? ""
                        : "rank " + std::to_string(rt.rank) + " was started with '" + arguments + "', rank 0 with '" +
                              root_arguments + "': every rank takes the same options");
  if (opt_flag(vm, "gemm-autotune") && vm.count("warmup") && opt_int(vm, "warmup") == 0)
    throw UsageError("--gemm-autotune with --warmup 0: the first step times each product's candidate algorithms, "
                     "so it would be measured with them; keep at least one warm-up step");
  Watchdog::instance().start(comm_timeout, rt.rank, rt.world_size);
  // One clock across ranks for the arrival times (docs/hdf5-schema.md, "Arrivals").
  const Runtime::ClockOffset clock = rt.clock_offset();
  Watchdog::instance().set_clock_offset(clock.offset_s);

  CpuPlace cpus;
  collective_check(rt, [&] { cpus = set_threads(rt, vm); });  // hosts may differ in their cores
  Backend backend;
  collective_check(rt, [&] { backend = make_backend(choose_device(rt, vm)); });
  set_fatal_context_device(backend.device->name());

  const std::string out_dir = prepare_out_dir(rt, vm, mode_name);
  RunInfo info;
  info.mode = mode_name;
  info.rank = rt.rank;
  info.world_size = rt.world_size;
  info.local_rank = rt.local_rank;
  info.hostname = rt.hostname;
  info.device_name = backend.device->name();
  info.backend = resolve_backend(vm, backend.device->kind());
  info.argv = command_line(argc, argv);
  info.config_json = options;
  info.start_time = utc_timestamp();
  // One name for the run on every rank, so a reader can tell rank files of different runs apart.
  info.run_id = rt.broadcast(rt.is_root() ? info.start_time + "-" + rt.hostname + "-" + std::to_string(getpid()) : "");
  info.environment = backend.device->environment();
  for (auto& fact : comm_environment()) info.environment.push_back(std::move(fact));
  info.environment.emplace_back("cpus_allowed", int64_t(cpus.allowed));
  info.environment.emplace_back("node_cpus_allowed", int64_t(cpus.node_allowed));
  for (auto& fact : node_topology(rt)) info.environment.push_back(std::move(fact));
  info.environment.emplace_back("clock_offset_s", clock.offset_s);
  info.environment.emplace_back("clock_offset_uncertainty_s", clock.uncertainty_s);
  Recorder recorder(out_dir + "/" + rank_file_name(rt.rank), info);
  // A watchdog that ends the job keeps its report in this rank's file, with the record being
  // measured as last kept (Recorder::keep_if_ended), where the file is free within a second
  // (the main thread may be stuck holding it). Not once a signal is ending the
  // process (the launcher's SIGTERM waking a stopped rank, whose watchdog then fires late): the
  // file says "interrupted" then (install_stop_notice below).
  Watchdog::instance().set_on_abort([&recorder](const Watchdog::HangReport& report) {
    if (stop_noticed()) return;
    recorder.finish_within("aborted by the watchdog: " + report.what, hang_attrs(report), std::chrono::seconds(1));
  });
  struct ForgetRecorder {  // before the recorder goes
    ~ForgetRecorder() { Watchdog::instance().set_on_abort({}); }
  } forget_recorder;
  ModeContext ctx{rt,
                  backend,
                  recorder,
                  out_dir,
                  std::chrono::milliseconds(opt_int(vm, "device-sample-ms")),
                  std::chrono::milliseconds(int64_t(flush_s * 1000))};
  in_mode = true;
  // A signal before the mode takes the stop over itself (train): the rank file says
  // "interrupted: SIGINT" (root and the record being measured), written from the stop's own
  // thread, before the process ends as the signal's default would; the record being measured
  // with the steps kept in memory where the main thread did not keep them (stuck in a collective).
  install_stop_notice(rt.is_root(),
                      "ends this run: the records finished are in " + out_dir +
                          ", the one being measured marked interrupted (analysis/report.py reads them)",
                      {[&recorder](int signal) {
                         recorder.interrupt_within(signal_name(signal), std::chrono::milliseconds(kStopWaitMs));
                       },
                       [&recorder](int signal) {
                         recorder.write_kept_within(signal_name(signal), std::chrono::milliseconds(kStopWaitMs));
                       }});
  struct ForgetStop {  // before the recorder goes
    ~ForgetStop() { set_stop_keeper({}); }
  } forget_stop;
  // The file's final status; where it cannot be written (the disk that failed a write), the
  // error that ends the run is the one to report.
  auto finish = [&](const std::string& status) {
    try {
      Attrs connections = nccl_connections();
      for (auto& attr : mpi_connections()) connections.push_back(std::move(attr));
      recorder.finish(status, connections);
    } catch (const WriteFailed&) {
      if (status == "complete") throw;
    }
  };
  try {
    run_mode(ctx);
  } catch (const Interrupted& e) {  // stopped early on a signal, its state saved
    finish(e.what);
    throw ExitRequest{128 + e.signal};
  } catch (const OutOfMemory& e) {
    finish(std::string("error: out of memory: ") + e.what());
    throw;
  } catch (const std::exception& e) {
    finish(std::string("error: ") + e.what());
    throw;
  }
  if (ctx.configurations > 0 && ctx.out_of_memory == ctx.configurations) {  // a sweep of which nothing fit
    const std::string what =
        (ctx.configurations == 1 ? std::string("the run's one configuration does not fit (its record says oom")
                                 : "none of the run's " + std::to_string(ctx.configurations) +
                                       " configurations fit (each record says oom") +
        ", with the allocation that did not fit); try a smaller --batch-size or --context-length, --low-memory where "
        "the mode has it, or a larger --memory-limit";
    finish("error: out of memory: " + what);
    throw AgreedOutOfMemory(what);
  }
  finish("complete");
  return 0;
}

}  // namespace
}  // namespace llmhpc

int main(int argc, char** argv) {
  using namespace llmhpc;
  set_field_names(option_for_field);  // before anything can throw a UsageError
  Runtime rt = Runtime::init(&argc, &argv);
  int code = 0;
  bool in_mode = false;  // inside a mode, ranks may disagree
  try {
    code = run(rt, argc, argv, in_mode);
  } catch (const ExitRequest& e) {
    code = e.code;
  } catch (const AgreedError& e) {  // every rank is here, with the same error: none waits
    if (rt.is_root()) std::fprintf(stderr, "llmhpc: error: %s\n", e.what());
    code = 2;
  } catch (const AgreedOutOfMemory& e) {  // the same on every rank, agreed: none waits
    if (rt.is_root()) std::fprintf(stderr, "llmhpc: error: out of memory: %s\n", e.what());
    code = 3;
  } catch (const AgreedWriteFailed& e) {
    if (rt.is_root()) std::fprintf(stderr, "llmhpc: error: %s\n", e.what());
    code = 5;
  } catch (const WriteFailed& e) {  // one rank's file: others may wait for it in a collective
    if (rt.world_size > 1 && in_mode) abort_job(e.what(), 5);
    std::fprintf(stderr, "llmhpc: error: %s\n", e.what());
    code = 5;
  } catch (const UsageError& e) {
    // Before the mode runs, every rank reached the same verdict, so rank 0 speaks for
    // all. Inside a mode only some ranks may have failed: abort so none waits forever.
    if (rt.world_size > 1 && in_mode) fatal(__FILE__, __LINE__, "", e.what());
    if (rt.is_root()) std::fprintf(stderr, "llmhpc: error: %s\n", e.what());
    code = 2;
  } catch (const OutOfMemory& e) {  // one rank alone ends; others may wait for it in a collective
    const std::string what = std::string("out of memory: ") + e.what();
    if (rt.world_size > 1) abort_job(what, 3);
    std::fprintf(stderr, "llmhpc: error: %s\n", what.c_str());
    code = 3;
  } catch (const std::exception& e) {
    fatal(__FILE__, __LINE__, "", std::string("unexpected error: ") + e.what());
  }
  if (code != 0 && !g_created_out_dir.empty()) rmdir(g_created_out_dir.c_str());  // only if still empty
  if (code == 0) Watchdog::instance().warn_if_fault_unfired();
  Watchdog::instance().stop();
  rt.finalize();
  return code;
}

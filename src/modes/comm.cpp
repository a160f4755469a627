// Mode comm: the collective benchmark, nccl-tests' measurement made with llmhpc's own
// communicators (comm/). For every collective x dtype x size x placement (out-of-place,
// in-place): warm-up iterations, then the timed ones twice, on the communicator's own
// timeline (CUDA events on its stream for nccl, the host clock for mpi): once with a mark
// between iterations (every rank's per-iteration times, recorded), once back to back with
// a mark at each end (nccl-tests' mean, which the table shows); algbw and busbw as
// nccl-tests defines them (comm/collectives.h). With --check, one more run on verifiable
// inputs (small integers: every sum is exact) is compared element by element, as
// nccl-tests does after timing, and a tiny all-reduce checks the transport at start-up.
// The buffers, the timing loop and the check are the harness of comm/benchmark.h; this file
// holds the options, the sweep, the records and the table. With --duration-s the timed loop
// runs for about that long (src/modes/soak.h), in chunks of about a second with the memory
// sampled between them.
#include <algorithm>
#include <limits>

#include "comm/benchmark.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "src/core/stats.h"
#include "src/core/table.h"
#include "src/core/units.h"
#include "src/core/watchdog.h"
#include "src/modes/options.h"
#include "src/modes/sensors.h"
#include "src/modes/soak.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

// Everything comm takes from the command line, parsed and checked once by parse_options
// before any file or device is touched; run() reads only this. (CommOptions is the
// communicator's, comm/communicator.h.)
struct CommModeOptions {
  std::vector<Collective> collectives;
  std::vector<uint64_t> sizes;
  std::vector<DType> dtypes;
  std::vector<Placement> placements;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  int64_t warmup = 5, iters = 20;
  double duration_s = 0;  // --duration-s; 0: --steps timed iterations
  bool check = false;
  std::string backend;  // --backend as given: auto, nccl or mpi
};

DType parse_comm_dtype(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  throw UsageError("--precision '" + name + "': must be one of fp32, bf16");
}
const char* comm_dtype_name(DType t) { return t == DType::BF16 ? "bf16" : "float"; }

constexpr int64_t kMaxIters = 100'000'000;  // --steps, --warmup

CommModeOptions parse_options(const po::variables_map& vm, int) {
  CommModeOptions s;
  for (const std::string& c : split_list(opt_string(vm, "collective"), "collective")) {
    if (c == "all") s.collectives.insert(s.collectives.end(), all_collectives().begin(), all_collectives().end());
    else s.collectives.push_back(parse_collective(c, "collective"));
  }
  for (size_t i = 0; i < s.collectives.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (s.collectives[i] == s.collectives[j])
        throw UsageError(std::string("--collective: ") + collective_name(s.collectives[i]) +
                         " is listed twice ('all' includes every collective)");
  s.sizes = opt_list(vm, "size", [](const std::string& text) {
    const uint64_t bytes = parse_size(text, "size");
    if (bytes == 0) throw UsageError("--size '" + text + "': must be at least one element");
    return bytes;
  });
  s.dtypes = opt_list(vm, "precision", [](const std::string& d) { return parse_comm_dtype(d); });
  const std::string inplace = opt_string(vm, "inplace");
  require_choice(inplace, {"no", "yes", "both"}, "inplace");
  if (inplace != "yes") s.placements.push_back(Placement::OutOfPlace);
  if (inplace != "no") s.placements.push_back(Placement::InPlace);
  const std::string op = opt_string(vm, "op");
  require_choice(op, {"sum", "avg"}, "op");
  s.op = op == "sum" ? ReduceOp::Sum : ReduceOp::Average;
  s.root = fits_int(opt_nonnegative(vm, "root"), "root");
  s.warmup = opt_nonnegative(vm, "warmup");
  s.iters = opt_positive(vm, "steps");
  if (s.iters > kMaxIters)  // every timed iteration's time is kept, several arrays of them
    throw UsageError("--steps " + opt_string(vm, "steps") + ": at most " + std::to_string(kMaxIters) +
                     " (each iteration's time is kept); for a long run, --duration-s");
  if (s.warmup > kMaxIters)
    throw UsageError("--warmup " + opt_string(vm, "warmup") + ": at most " + std::to_string(kMaxIters));
  s.duration_s = duration_seconds(vm, "steps");
  s.check = opt_flag(vm, "check");
  s.backend = opt_string(vm, "backend");
  return s;
}

void add_options(po::options_description& desc) {
  po::options_description comm("Comm options");
  auto text = [](const char* def) { return po::value<std::string>()->default_value(def); };
  comm.add_options()("collective", text("allreduce"),
                     "allreduce | reducescatter | allgather | broadcast | all (a list runs each)")(
      "size", text("1MB,10MB,100MB,1000MB"),
      "message sizes, the largest buffer of the operation (B, KB, MB, GB, KiB, MiB, GiB; a list runs each)")(
      "precision", text("fp32"),
      "element type: fp32 | bf16 (a list runs each; records name fp32 float, as nccl-tests does)")(
      "op", text("sum"), "reduction of allreduce and reducescatter: sum | avg")(
      "root", text("0"), "broadcast root rank")("inplace", text("both"), "no (out-of-place) | yes (in-place) | both")(
      "warmup", text("5"), "untimed iterations before the timed ones (their times are recorded apart)")(
      "steps", text("20"),
      "timed iterations per configuration, and the back-to-back run the table shows (not with --duration-s, "
      "which sets the timed iterations and leaves the back-to-back run at 20)")(
      "check", po::bool_switch(),
      "check every result exactly on verifiable inputs, after a start-up sanity all-reduce");
  add_duration_option(comm, "steps");
  desc.add(comm);
}

// --backend: auto is nccl on a GPU and mpi otherwise. Throws UsageError.
CommBackend choose_backend(const std::string& backend, const Device& dev) {
  if (backend == "mpi") return CommBackend::Mpi;
  if (backend == "nccl" && dev.kind() != DeviceKind::Cuda)
    throw UsageError("--backend nccl needs GPUs: run with --device cuda (or auto on a host with GPUs)");
  return dev.kind() == DeviceKind::Cuda ? CommBackend::Nccl : CommBackend::Mpi;
}

// Buffers in the device's memory: nccl's, and mpi's on the CPU device, whose allocator has
// the run's capacity (--memory-limit). Next to a GPU, mpi uses plain host memory.
class DeviceSpace final : public BufferSpace {
 public:
  explicit DeviceSpace(Device& dev) : dev_(dev) {}
  Allocator& allocator() override { return dev_.allocator(); }
  void upload(void* dst, const void* host, size_t bytes) override { dev_.copy_to_device(dst, host, bytes); }
  void settle() override { dev_.synchronize(); }
  void download(void* host, const void* src, size_t bytes) override { dev_.copy_to_host(host, src, bytes); }

 private:
  Device& dev_;
};

std::unique_ptr<BufferSpace> buffer_space(Device& dev, const Runtime& rt, const Communicator& comm) {
  if (comm.device_buffers() || dev.kind() == DeviceKind::Cpu) return std::make_unique<DeviceSpace>(dev);
  return std::make_unique<HostBufferSpace>(host_usable_memory() / size_t(rt.local_size));
}

// nccl-tests' time format: fewer decimals for longer times.
std::string format_us(double us) { return fmt(us, us >= 10000 ? 0 : us >= 100 ? 1 : 2); }

void run(ModeContext& ctx, const CommModeOptions& s) {
  Runtime& rt = ctx.rt;
  Device& dev = *ctx.backend.device;
  std::unique_ptr<Communicator> comm;
  collective_check(rt, [&] {
    if (s.root >= rt.world_size)
      throw UsageError("--root " + std::to_string(s.root) + ": only " + std::to_string(rt.world_size) + " rank(s)");
    // Every size must hold an element per rank for every collective before anything is measured.
    for (Collective c : s.collectives)
      for (DType t : s.dtypes)
        for (uint64_t requested : s.sizes)
          if (collective_shape(c, requested, t, rt.world_size).count == 0)
            throw UsageError("--size " + format_size(requested) + " holds no " + comm_dtype_name(t) +
                             " element per rank for " + collective_name(c) + " on " + std::to_string(rt.world_size) +
                             " ranks");
    CommOptions options;
    options.backend = choose_backend(s.backend, dev);
    // No compute stream to order against: every upload is finished (settle()) before an
    // operation is issued, so each timed operation is the NCCL call alone, as nccl-tests
    // times it.
    if (options.backend == CommBackend::Nccl) options.gpu = dev.ordinal();
    comm = make_communicator(options);
  });
  const int n = comm->size();
  const std::unique_ptr<BufferSpace> space = buffer_space(dev, rt, *comm);
  const std::string timed = timed_text(s.duration_s, s.iters, "iterations");
  log_root(rt, "comm: backend %s, %d rank(s), %s; %lld warm-up iterations, %s%s\n", comm->backend_name().c_str(), n,
           dev.name().c_str(), (long long)s.warmup, timed.c_str(), s.check ? ", results checked" : "");
  if (s.check) agree_or_exit(rt, sanity_all_reduce(*comm, *space), 3);

  std::vector<std::string> header = {"collective", "size (B)", "count", "type", "redop", "root"};
  for (Placement p : s.placements)
    for (const char* col : {"time (us)", "algbw", "busbw", "#wrong"})
      header.push_back(std::string(p == Placement::InPlace ? "ip " : "oop ") + col);
  TextTable table(header);
  struct BusbwSum {
    double sum = 0;
    int rows = 0;
  };
  std::vector<BusbwSum> busbw_by_collective(all_collectives().size());

  const size_t total = s.collectives.size() * s.dtypes.size() * s.sizes.size();
  size_t index = 0;
  const std::unique_ptr<DeviceMonitor> monitor = device_monitor(ctx);  // the GPU's clocks beside each placement
  for (Collective c : s.collectives)
    for (DType t : s.dtypes)
      for (uint64_t requested : s.sizes) {
        const CollectiveShape shape = collective_shape(c, requested, t, n);
        const std::string size_label = format_size(requested);
        log_root(rt, "[%zu/%zu] %s %s %s (%zu B) ...", ++index, total, collective_name(c), comm_dtype_name(t),
                 size_label.c_str(), shape.bytes);
        const int root = c == Collective::Broadcast ? s.root : -1;
        const char* redop = is_reduction(c) ? reduce_op_name(s.op) : "none";
        std::vector<std::string> row = {
            collective_name(c),  std::to_string(shape.bytes), std::to_string(shape.count), comm_dtype_name(t), redop,
            std::to_string(root)};

        Operation op{c, shape.count, t, s.op, s.root, Placement::OutOfPlace};
        // Buffers of the largest size the operation needs; every rank must have them.
        CallBuffers buffers;
        std::string oom;
        const int64_t live_before = dev.allocator().live_bytes();
        try {
          buffers = CallBuffers(*space, op, n);
        } catch (const OutOfMemory& e) {
          oom = e.what();
        }
        const bool all_allocated = rt.reduce_all(int64_t(oom.empty() ? 0 : 1), HostReduce::Sum) == 0;
        void* send = buffers.send.tensor().data;
        void* recv = buffers.recv.tensor().data;

        for (Placement p : s.placements) {
          op.placement = p;
          Record rec;
          rec.group = std::string("comm/") + collective_name(c) + "_" + comm_dtype_name(t) + "_" + size_label + "_" +
                      placement_name(p);
          rec.attr("collective", std::string(collective_name(c)))
              .attr("backend", comm->backend_name())
              .attr("dtype", std::string(comm_dtype_name(t)))
              .attr("redop", std::string(redop))
              .attr("root", int64_t(root))
              .attr("placement", std::string(placement_name(p)))
              .attr("world_size", int64_t(n))
              .attr("requested_bytes", int64_t(requested))
              .attr("bytes", int64_t(shape.bytes))
              .attr("count", int64_t(shape.count))
              .attr("bus_factor", bus_factor(c, n))
              .attr("warmup", s.warmup)
              .attr("iters", s.iters)
              .attr("back_to_back_iters", s.iters)
              .attr("duration_s", s.duration_s)
              .attr("check", int64_t(s.check ? 1 : 0));
          ctx.count_configuration(!all_allocated);
          if (!all_allocated) {
            rec.status = "oom";
            rec.attr("error", oom.empty() ? std::string("another rank ran out of memory") : oom);
            // As every sweep's failed configuration (sweep.cpp): what the allocation left live.
            rec.attr("live_bytes_before", live_before).attr("live_bytes_after_recovery", dev.allocator().live_bytes());
            ctx.recorder.write(rec);
            for (int k = 0; k < 4; ++k) row.push_back(k == 0 ? "oom" : "-");
            continue;
          }
          Watchdog::instance().set_context(rec.group);
          ctx.recorder.write_running(rec);  // a rank killed while measuring leaves this mark
          const Call call = make_call(op, rt.rank, send, recv);
          const Verifiable v = make_verifiable(op, rt.rank, n, average_rounding(*comm));
          upload_inputs(*space, v, send, recv);
          monitor->start();

          const std::vector<double> warm = time_call(*comm, call, s.warmup, Timing::PerOperation);
          // A chunk's timer holds a CUDA event per iteration: at most 10000 of them.
          const double pace_s = s.duration_s > 0 ? agreed_iteration_s(rt, warm, 1e-6) : 0;
          // The whole duration, however many iterations it holds: past kMaxTimedIterations the
          // times recorded are thinned evenly (Thinning), where ddp's loop ends.
          DurationCount count(rt, s.duration_s, s.iters, pace_s, s.duration_s > 0 ? 10000 : s.iters,
                              std::numeric_limits<int64_t>::max());
          std::vector<double> times;  // every thinning.every()-th iteration's
          Thinning thinning{size_t(kMaxTimedIterations)};
          const auto make_room = [&] {
            reserve_touched(times, size_t(std::min<int64_t>(count.total(), kMaxTimedIterations)));
          };
          make_room();
          MemorySamples memory(size_t(count.chunks_left(0)));
          int64_t done = 0;
          // Each iteration's time and bandwidths, and the warm-up's times.
          auto add_times = [&](Record& r) {
            std::vector<double> algbw, busbw;
            algbw.reserve(times.size());
            busbw.reserve(times.size());
            for (double us : times) {
              algbw.push_back(algbw_gbs(shape.bytes, us));
              busbw.push_back(algbw.back() * bus_factor(c, n));
            }
            r.add("time_us", times).add("algbw", algbw).add("busbw", busbw);
            r.attr("time_us_every", thinning.every());
            if (!warm.empty()) r.add("warmup_time_us", warm);
          };
          {  // A signal or --flush-s keeps the iterations so far (each rank its own, between chunks);
             // the block ends before the final record, after the last --flush-s write.
            SweepSteps progress(ctx, rec, count.total(), "iterations", [&](Record& r) {
              add_times(r);
              memory.record(r);
              keep_timed_steps(r, done, count.total());
            });
            while (done < count.total()) {
              const std::vector<double> part = time_call(*comm, call, count.next_chunk(done), Timing::PerOperation);
              for (const double us : part)
                if (thinning.record_next([&] { drop_odd(times); })) times.push_back(us);
              done += int64_t(part.size());
              memory.take(done - 1, dev, int64_t(times.capacity() * sizeof(double)));  // outside the timed ops
              count.after_chunk(done);
              make_room();
              memory.expect(memory.offered() + size_t(count.chunks_left(done)));
              progress.update(done, count.total());
            }
          }
          if (s.duration_s > 0) rec.attr("iters", done);
          const double mean_us = time_call(*comm, call, s.iters, Timing::BackToBack).at(0);
          const int64_t wrong = s.check ? check_once(*comm, *space, v, send, recv, issue_blocking(*comm)).count : -1;
          monitor->stop();

          add_times(rec);
          rec.add("time_us_max_over_ranks", rt.reduce_all(times, HostReduce::Max));
          rec.add("time_us_back_to_back", std::vector<double>{mean_us});
          rec.add("wrong", std::vector<int64_t>{wrong});
          memory.record(rec);
          record_sensors(rec, monitor->samples());
          record_arrivals(rec);
          ctx.recorder.write(rec);

          const double time_us = rt.reduce_all(mean_us, HostReduce::Sum) / n;
          const double alg = algbw_gbs(shape.bytes, time_us), bus = alg * bus_factor(c, n);
          const int64_t wrong_all = s.check ? rt.reduce_all(wrong, HostReduce::Sum) : -1;
          row.insert(row.end(), {format_us(time_us), fmt(alg), fmt(bus), s.check ? std::to_string(wrong_all) : "N/A"});
          busbw_by_collective[size_t(c)].sum += bus;
          busbw_by_collective[size_t(c)].rows += 1;
          const std::string clocks = slowdown_note(rt, monitor->summary());
          const std::string thinned = thinning.every() > 1 ? " (recorded 1 in " + std::to_string(thinning.every()) +
                                                                 " of its " + std::to_string(done) + " iterations)"
                                                           : "";
          log_root(rt, " %s busbw %s GB/s%s%s%s", placement_name(p), fmt(bus).c_str(),
                   wrong_all > 0 ? (" WRONG: " + std::to_string(wrong_all)).c_str() : "", thinned.c_str(),
                   clocks.c_str());
        }
        log_root(rt, "\n");
        table.add_row(row);
      }

  if (rt.is_root()) {
    std::printf("\ncomm summary (%s, %d rank(s); time: per operation, %lld issued back to back, averaged over"
                " ranks, as nccl-tests; GB/s = 1e9 B/s; every rank's per-iteration times are in %s):\n",
                comm->backend_name().c_str(), n, (long long)s.iters, ctx.out_dir.c_str());
    table.print();
    for (Collective c : all_collectives()) {
      const BusbwSum& b = busbw_by_collective[size_t(c)];
      if (b.rows) std::printf("# %s: avg bus bandwidth %s GB/s\n", collective_name(c), fmt(b.sum / b.rows).c_str());
    }
    std::fflush(stdout);
  }
}

}  // namespace

ModeSpec comm_mode() {
  return {"comm",
          "collective benchmark (all-reduce, reduce-scatter, all-gather, broadcast) over nccl or mpi",
          add_options,
          [](const po::variables_map& vm, int world_size) -> ModeRun {
            const CommModeOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          },
          {{"iters", "steps"}, {"dtype", "precision"}}};
}

}  // namespace llmhpc

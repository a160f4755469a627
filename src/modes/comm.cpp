// Mode comm: the collective benchmark, nccl-tests' measurement made with llmhpc's own
// communicators (comm/). For every collective x dtype x size x placement (out-of-place,
// in-place): warm-up iterations, then the timed ones twice, on the communicator's own
// timeline (CUDA events on its stream for nccl, the host clock for mpi): once with a mark
// between iterations (every rank's per-iteration times, recorded), once back to back with
// a mark at each end (nccl-tests' mean, which the table shows); algbw and busbw as
// nccl-tests defines them (comm/collectives.h). With --check, one more run on verifiable
// inputs (small integers: every sum is exact) is compared element by element, as
// nccl-tests does after timing, and a tiny all-reduce checks the transport at start-up.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "src/core/stats.h"
#include "src/core/table.h"
#include "src/core/units.h"
#include "src/modes/options.h"

namespace llmhpc {
namespace {

enum class Placement { OutOfPlace, InPlace };
const char* placement_name(Placement p) { return p == Placement::OutOfPlace ? "outofplace" : "inplace"; }

struct CommSettings {
  std::vector<Collective> collectives;
  std::vector<uint64_t> sizes;
  std::vector<DType> dtypes;
  std::vector<Placement> placements;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  int64_t warmup = 5, iters = 20;
  bool check = false;
};

DType parse_comm_dtype(const std::string& name) {
  if (name == "float") return DType::F32;
  if (name == "bf16") return DType::BF16;
  throw UsageError("--dtype '" + name + "': must be one of float, bf16");
}
const char* comm_dtype_name(DType t) { return t == DType::BF16 ? "bf16" : "float"; }

CommSettings settings(const po::variables_map& vm) {
  CommSettings s;
  for (const std::string& c : split_list(opt_string(vm, "collective"), "collective")) {
    if (c == "all") s.collectives.insert(s.collectives.end(), all_collectives().begin(), all_collectives().end());
    else s.collectives.push_back(parse_collective(c, "collective"));
  }
  for (const std::string& text : split_list(opt_string(vm, "size"), "size")) {
    const uint64_t bytes = parse_size(text, "size");
    if (bytes == 0) throw UsageError("--size '" + text + "': must be at least one element");
    s.sizes.push_back(bytes);
  }
  for (const std::string& d : split_list(opt_string(vm, "dtype"), "dtype")) s.dtypes.push_back(parse_comm_dtype(d));
  const std::string inplace = opt_string(vm, "inplace");
  require_choice(inplace, {"no", "yes", "both"}, "inplace");
  if (inplace != "yes") s.placements.push_back(Placement::OutOfPlace);
  if (inplace != "no") s.placements.push_back(Placement::InPlace);
  const std::string op = opt_string(vm, "op");
  require_choice(op, {"sum", "avg"}, "op");
  s.op = op == "sum" ? ReduceOp::Sum : ReduceOp::Average;
  s.root = int(opt_nonnegative(vm, "root"));
  s.warmup = opt_nonnegative(vm, "warmup");
  s.iters = opt_positive(vm, "iters");
  s.check = opt_flag(vm, "check");
  return s;
}

void add_options(po::options_description& desc) {
  po::options_description comm("Comm options");
  auto text = [](const char* def) { return po::value<std::string>()->default_value(def); };
  comm.add_options()
      ("collective", text("allreduce"), "allreduce | reducescatter | allgather | broadcast | all (a list runs each)")
      ("size", text("1MB,10MB,100MB,1000MB"),
       "message sizes, the largest buffer of the operation (B, KB, MB, GB, KiB, MiB, GiB; a list runs each)")
      ("dtype", text("float"), "float | bf16 (a list runs each)")
      ("op", text("sum"), "reduction of allreduce and reducescatter: sum | avg")
      ("root", text("0"), "broadcast root rank")
      ("inplace", text("both"), "no (out-of-place) | yes (in-place) | both")
      ("warmup", text("5"), "untimed iterations before the timed ones (their times are recorded apart)")
      ("iters", text("20"), "timed iterations per configuration")
      ("check", po::bool_switch(), "check every result exactly on verifiable inputs, after a start-up sanity all-reduce");
  desc.add(comm);
}

void validate(const po::variables_map& vm) { settings(vm); }

// --backend: auto is nccl on a GPU and mpi otherwise. Throws UsageError.
CommBackend choose_backend(const po::variables_map& vm, const Device& dev) {
  const std::string backend = opt_string(vm, "backend");
  if (backend == "mpi") return CommBackend::Mpi;
  if (backend == "nccl" && dev.kind() != DeviceKind::Cuda)
    throw UsageError("--backend nccl needs GPUs: run with --device cuda (or auto on a host with GPUs)");
  return dev.kind() == DeviceKind::Cuda ? CommBackend::Nccl : CommBackend::Mpi;
}

// ---- Verifiable data ---------------------------------------------------------------
// Inputs are small integers, exact in every dtype: element i of rank r is
// ((7 i + 13 r) mod (2 range + 1)) - range. For reductions range = max(1, 127 / nranks), so
// every partial sum stays within 256 and is exact even in bf16 (8 significant bits) for up
// to 256 ranks. Data that is only moved spans [-127, 127], so chunks from different ranks
// differ. The pattern repeats every 2 range + 1 elements, which keeps building inputs and
// checking 1 GB results cheap (no division per element, no array of expected values).

constexpr double kSentinel = -1024;  // what untouched output holds: no result is ever this

int value_range(Collective c, int nranks) { return is_reduction(c) ? std::max(1, 127 / nranks) : 127; }

// Walks one rank's inputs from element `start` on.
class Pattern {
 public:
  Pattern(int rank, size_t start, int range)
      : range_(range), period_(size_t(2 * range + 1)), step_(7 % period_),
        k_(((start % period_) * 7 + (size_t(rank) % period_) * 13) % period_) {}
  double next() {
    const double v = double(int64_t(k_)) - range_;
    k_ += step_;
    if (k_ >= period_) k_ -= period_;
    return v;
  }

 private:
  int range_;
  size_t period_, step_, k_;
};

void store(void* base, size_t i, DType t, double v) {
  if (t == DType::F32) static_cast<float*>(base)[i] = float(v);
  else if (t == DType::BF16) static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(float(v));
  else static_cast<double*>(base)[i] = v;
}

double load(const void* base, size_t i, DType t) {
  if (t == DType::F32) return static_cast<const float*>(base)[i];
  if (t == DType::BF16) return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const double*>(base)[i];
}

// The host images of one configuration's buffers before the call (layouts of
// comm/communicator.h; in place, everything lives in `recv`), and where this rank's
// result will be in recv.
struct Verifiable {
  std::vector<char> send, recv;
  size_t result_offset = 0, result_count = 0;  // elements
};

Verifiable make_verifiable(Collective c, const CollectiveShape& shape, DType t, Placement p, int root, int rank,
                           int nranks) {
  const size_t es = dtype_size(t), count = shape.count, total = shape.total_elements;
  const bool in_place = p == Placement::InPlace;
  const int range = value_range(c, nranks);
  auto fill = [&](std::vector<char>& image, size_t n, size_t at, int value_rank) {
    Pattern pattern(value_rank, 0, range);
    for (size_t i = 0; i < n; ++i) store(image.data(), at + i, t, pattern.next());
  };
  auto sentinel = [&](std::vector<char>& image, size_t n) {
    image.resize(n * es);
    for (size_t i = 0; i < n; ++i) store(image.data(), i, t, kSentinel);
  };
  Verifiable v;
  switch (c) {
    case Collective::AllReduce:
    case Collective::ReduceScatter: {
      std::vector<char>& input = in_place ? v.recv : v.send;
      input.resize(total * es);
      fill(input, total, 0, rank);
      if (!in_place) sentinel(v.recv, c == Collective::AllReduce ? total : count);
      v.result_count = c == Collective::AllReduce ? total : count;
      v.result_offset = c == Collective::ReduceScatter && in_place ? size_t(rank) * count : 0;
      break;
    }
    case Collective::AllGather:
      sentinel(v.recv, total);
      if (in_place) {
        fill(v.recv, count, size_t(rank) * count, rank);
      } else {
        v.send.resize(count * es);
        fill(v.send, count, 0, rank);
      }
      v.result_count = total;
      break;
    case Collective::Broadcast:
      if (rank != root || !in_place) sentinel(v.recv, total);
      if (rank == root) {
        std::vector<char>& input = in_place ? v.recv : v.send;
        input.resize(total * es);
        fill(input, total, 0, rank);
      }
      v.result_count = total;
      break;
  }
  return v;
}

// Compares this rank's result with what it must be; returns the number of wrong elements.
int64_t count_wrong(const Verifiable& v, const std::vector<char>& result, Collective c, const CollectiveShape& shape,
                    DType t, ReduceOp op, int root, int rank, int nranks) {
  const int range = value_range(c, nranks);
  int64_t wrong = 0;
  size_t e = v.result_offset;
  auto compare = [&](double expected, double tolerance) {
    if (!(std::fabs(load(result.data(), e++, t) - expected) <= tolerance)) ++wrong;
  };
  if (is_reduction(c)) {
    // The reduced value of element i depends on i mod period only: one table of it.
    const size_t period = size_t(2 * range + 1);
    std::vector<double> reduced(period, 0.0);
    for (int r = 0; r < nranks; ++r) {
      Pattern pattern(r, 0, range);
      for (double& x : reduced) x += pattern.next();
    }
    if (op == ReduceOp::Average)  // as the backends do: one division, rounded once
      for (double& x : reduced)
        x = t == DType::F64 ? x / nranks
                            : t == DType::BF16 ? round_to_bf16(float(x) / float(nranks)) : float(x) / float(nranks);
    // NCCL averages floats by pre-multiplying each input by 1/n, exact only when n is a
    // power of two: allow the rounding of n products and n sums of magnitude <= range.
    double tolerance = 0;
    if (op == ReduceOp::Average) {
      const double eps = t == DType::BF16 ? std::ldexp(1.0, -7) : t == DType::F32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -52);
      tolerance = nranks * eps * range;
    }
    size_t j = c == Collective::ReduceScatter ? (size_t(rank) * shape.count) % period : 0;
    for (size_t i = 0; i < v.result_count; ++i) {
      compare(reduced[j], tolerance);
      if (++j == period) j = 0;
    }
  } else if (c == Collective::AllGather) {
    for (int r = 0; r < nranks; ++r) {
      Pattern pattern(r, 0, range);
      for (size_t i = 0; i < shape.count; ++i) compare(pattern.next(), 0);
    }
  } else {
    Pattern pattern(root, 0, range);
    for (size_t i = 0; i < v.result_count; ++i) compare(pattern.next(), 0);
  }
  return wrong;
}

// ---- Buffers ---------------------------------------------------------------------------
// Where a configuration's buffers live: the device's memory for nccl, host memory for mpi
// (the CPU device's own allocator, or plain host memory next to a GPU).
class BufferSpace {
 public:
  BufferSpace(Device& dev, const Runtime& rt, bool on_device)
      : dev_(dev), on_device_(on_device), host_(host_physical_memory() / size_t(rt.local_size)) {}

  Allocator& allocator() {
    if (on_device_ || dev_.kind() == DeviceKind::Cpu) return dev_.allocator();
    return host_;
  }
  void upload(void* dst, const std::vector<char>& image) {
    if (image.empty()) return;
    if (on_device_) dev_.copy_to_device(dst, image.data(), image.size());
    else std::memcpy(dst, image.data(), image.size());
  }
  std::vector<char> download(const void* src, size_t bytes) {
    std::vector<char> image(bytes);
    if (on_device_) dev_.copy_to_host(image.data(), src, bytes);
    else std::memcpy(image.data(), src, bytes);
    return image;
  }
  // Uploads may be asynchronous on the device's stream: done before the host moves on.
  void settle() { dev_.synchronize(); }

 private:
  Device& dev_;
  bool on_device_;
  HostAllocator host_;
};

// ---- One collective call -----------------------------------------------------------------

struct Call {
  Collective collective;
  const void* send;
  void* recv;
  size_t count;
  DType dtype;
  ReduceOp op;
  int root;
};

// The call in the layout of comm/communicator.h for this placement.
Call make_call(Collective c, const CollectiveShape& shape, DType t, Placement p, ReduceOp op, int root, int rank,
               void* send, void* recv) {
  char* base = static_cast<char*>(recv);
  const size_t chunk = shape.count * dtype_size(t) * size_t(rank);
  Call call{c, send, recv, shape.count, t, op, root};
  if (p == Placement::InPlace) {
    if (c == Collective::ReduceScatter) call = {c, base, base + chunk, shape.count, t, op, root};
    else if (c == Collective::AllGather) call = {c, base + chunk, base, shape.count, t, op, root};
    else call.send = recv;
  }
  return call;
}

CommHandle issue(Communicator& comm, const Call& c, bool blocking) {
  switch (c.collective) {
    case Collective::AllReduce:
      if (!blocking) return comm.all_reduce_async(c.send, c.recv, c.count, c.dtype, c.op);
      comm.all_reduce(c.send, c.recv, c.count, c.dtype, c.op);
      return {};
    case Collective::ReduceScatter:
      if (!blocking) return comm.reduce_scatter_async(c.send, c.recv, c.count, c.dtype, c.op);
      comm.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op);
      return {};
    case Collective::AllGather:
      if (!blocking) return comm.all_gather_async(c.send, c.recv, c.count, c.dtype);
      comm.all_gather(c.send, c.recv, c.count, c.dtype);
      return {};
    case Collective::Broadcast:
      if (!blocking) return comm.broadcast_async(c.send, c.recv, c.count, c.dtype, c.root);
      comm.broadcast(c.send, c.recv, c.count, c.dtype, c.root);
      return {};
  }
  return {};
}

// Issues `n` operations back to back, timed on the communicator's own timeline (CUDA events
// on its stream for nccl, the host clock for mpi), and returns in microseconds the time of each
// operation (`each`: a mark between consecutive operations) or the mean per operation (one
// mark before the first and one after the last: nccl-tests' measurement). At small sizes
// the host's enqueue rate limits nccl, and the marks between operations add to it (2-3 us per
// 1 MB all-reduce on H200s, docs/results/comm.md): per-operation times are for the spread,
// the mean is the table's.
std::vector<double> timed_iterations(Communicator& comm, const Call& call, int64_t n, bool each) {
  if (n == 0) return {};
  auto timer = comm.make_timer(each ? int(n) + 1 : 2);
  const bool blocking = !comm.stream_ordered();
  comm.barrier();  // ranks start together
  CommHandle last;
  timer->mark(0);
  for (int64_t k = 0; k < n; ++k) {
    if (each && k > 0) timer->mark(int(k));
    last = issue(comm, call, blocking);
  }
  timer->mark(each ? int(n) : 1);
  last.wait();
  comm.synchronize();
  if (!each) return {timer->elapsed_ms(0, 1) * 1e3 / double(n)};
  std::vector<double> times_us;
  for (int64_t k = 0; k < n; ++k) times_us.push_back(timer->elapsed_ms(int(k), int(k) + 1) * 1e3);
  return times_us;
}

// One run on verifiable inputs; returns this rank's number of wrong elements.
int64_t check_once(Communicator& comm, BufferSpace& space, const Call& call, const CollectiveShape& shape,
                   const Verifiable& v, void* send, void* recv) {
  space.upload(send, v.send);
  space.upload(recv, v.recv);
  space.settle();
  issue(comm, call, false).wait();
  comm.synchronize();
  const std::vector<char> result = space.download(recv, v.recv.size());
  return count_wrong(v, result, call.collective, shape, call.dtype, call.op, call.root, comm.rank(), comm.size());
}

// A tiny all-reduce whose answer every rank knows: a broken transport stops the run
// before the sweep. Collective.
void sanity_all_reduce(const Runtime& rt, Communicator& comm, BufferSpace& space) {
  const size_t n = 8;
  Buffer buf(space.allocator(), DType::F32, Shape{int64_t(n)}, "comm.sanity");
  std::vector<char> image(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) store(image.data(), i, DType::F32, double(comm.rank() + 1) * double(i + 1));
  space.upload(buf.tensor().data, image);
  space.settle();
  comm.all_reduce_async(buf.tensor().data, buf.tensor().data, n, DType::F32, ReduceOp::Sum).wait();
  comm.synchronize();
  const std::vector<char> got = space.download(buf.tensor().data, image.size());
  const double ranks_sum = double(comm.size()) * (comm.size() + 1) / 2;
  std::string error;
  for (size_t i = 0; i < n && error.empty(); ++i)
    if (load(got.data(), i, DType::F32) != ranks_sum * double(i + 1))
      error = "start-up sanity all-reduce (" + comm.backend_name() + ") gave " + fmt(load(got.data(), i, DType::F32)) +
              " at element " + std::to_string(i) + ", expected " + fmt(ranks_sum * double(i + 1));
  agree_or_exit(rt, error, 3);
}

// Per iteration, the slowest rank's time.
std::vector<double> max_over_ranks(const std::vector<double>& mine) {
  std::vector<double> out(mine.size());
  MPI_CHECK(MPI_Allreduce(mine.data(), out.data(), int(mine.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

double mean_over_ranks(double mine, int ranks) {
  double sum = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return sum / ranks;
}

int64_t sum_over_ranks(int64_t mine) {
  int64_t out = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  return out;
}

// nccl-tests' time format: fewer decimals for longer times.
std::string format_us(double us) { return fmt(us, us >= 10000 ? 0 : us >= 100 ? 1 : 2); }

void run(ModeContext& ctx) {
  const CommSettings s = settings(ctx.vm);
  Runtime& rt = ctx.rt;
  Device& dev = *ctx.backend.device;
  std::unique_ptr<Communicator> comm;
  collective_check(rt, [&] {
    if (s.root >= rt.world_size)
      throw UsageError("--root " + std::to_string(s.root) + ": only " + std::to_string(rt.world_size) + " rank(s)");
    CommOptions options;
    options.backend = choose_backend(ctx.vm, dev);
    // No compute stream to order against: every upload is finished (settle()) before an
    // operation is issued, so each timed operation is the NCCL call alone, as nccl-tests
    // times it.
    if (options.backend == CommBackend::Nccl) options.gpu = dev.ordinal();
    comm = make_communicator(options);
  });
  const int n = comm->size();
  BufferSpace space(dev, rt, comm->device_buffers());
  log_root(rt, "comm: backend %s, %d rank(s), %s; %lld warm-up + %lld timed iterations%s\n",
           comm->backend_name().c_str(), n, dev.name().c_str(), (long long)s.warmup, (long long)s.iters,
           s.check ? ", results checked" : "");
  if (s.check) sanity_all_reduce(rt, *comm, space);

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
  for (Collective c : s.collectives)
    for (DType t : s.dtypes)
      for (uint64_t requested : s.sizes) {
        const CollectiveShape shape = collective_shape(c, requested, t, n);
        collective_check(rt, [&] {
          if (shape.count == 0)
            throw UsageError("--size " + format_size(requested) + " holds no " + comm_dtype_name(t) + " element per rank for " +
                             collective_name(c) + " on " + std::to_string(n) + " ranks");
        });
        const std::string size_label = format_size(requested);
        log_root(rt, "[%zu/%zu] %s %s %s (%zu B) ...", ++index, total, collective_name(c), comm_dtype_name(t),
                 size_label.c_str(), shape.bytes);
        const int root = c == Collective::Broadcast ? s.root : -1;
        const char* redop = is_reduction(c) ? reduce_op_name(s.op) : "none";
        std::vector<std::string> row = {collective_name(c), std::to_string(shape.bytes), std::to_string(shape.count),
                                        comm_dtype_name(t), redop, std::to_string(root)};

        // Buffers of the largest size the operation needs; every rank must have them.
        Buffer send, recv;
        std::string oom;
        try {
          send = Buffer(space.allocator(), t, Shape{int64_t(shape.total_elements)}, "comm.send");
          recv = Buffer(space.allocator(), t, Shape{int64_t(shape.total_elements)}, "comm.recv");
        } catch (const OutOfMemory& e) {
          oom = e.what();
        }
        const bool all_allocated = sum_over_ranks(oom.empty() ? 0 : 1) == 0;

        for (Placement p : s.placements) {
          Record rec;
          rec.group = std::string("comm/") + collective_name(c) + "_" + comm_dtype_name(t) + "_" + size_label + "_" +
                      placement_name(p);
          rec.attr("collective", std::string(collective_name(c))).attr("backend", comm->backend_name())
              .attr("dtype", std::string(comm_dtype_name(t))).attr("redop", std::string(redop)).attr("root", int64_t(root))
              .attr("placement", std::string(placement_name(p))).attr("world_size", int64_t(n))
              .attr("requested_bytes", int64_t(requested)).attr("bytes", int64_t(shape.bytes))
              .attr("count", int64_t(shape.count)).attr("bus_factor", bus_factor(c, n))
              .attr("warmup", s.warmup).attr("iters", s.iters).attr("check", int64_t(s.check ? 1 : 0));
          if (!all_allocated) {
            rec.status = "oom";
            rec.attr("error", oom.empty() ? std::string("another rank ran out of memory") : oom);
            ctx.recorder.write(rec);
            for (int k = 0; k < 4; ++k) row.push_back(k == 0 ? "oom" : "-");
            continue;
          }
          const Call call = make_call(c, shape, t, p, s.op, root, rt.rank, send.tensor().data, recv.tensor().data);
          const Verifiable v = make_verifiable(c, shape, t, p, s.root, rt.rank, n);
          space.upload(send.tensor().data, v.send);
          space.upload(recv.tensor().data, v.recv);
          space.settle();

          const std::vector<double> warm = timed_iterations(*comm, call, s.warmup, true);
          const std::vector<double> times = timed_iterations(*comm, call, s.iters, true);
          const double mean_us = timed_iterations(*comm, call, s.iters, false).at(0);
          const int64_t wrong = s.check ? check_once(*comm, space, call, shape, v, send.tensor().data, recv.tensor().data) : -1;

          std::vector<double> algbw, busbw;
          for (double us : times) {
            algbw.push_back(algbw_gbs(shape.bytes, us));
            busbw.push_back(algbw.back() * bus_factor(c, n));
          }
          const std::vector<double> slowest = max_over_ranks(times);
          rec.add("time_us", times).add("algbw", algbw).add("busbw", busbw).add("time_us_max_over_ranks", slowest);
          if (!warm.empty()) rec.add("warmup_time_us", warm);
          rec.add("time_us_back_to_back", std::vector<double>{mean_us});
          rec.add("wrong", std::vector<int64_t>{wrong});
          ctx.recorder.write(rec);

          const double time_us = mean_over_ranks(mean_us, n), alg = algbw_gbs(shape.bytes, time_us), bus = alg * bus_factor(c, n);
          const int64_t wrong_all = s.check ? sum_over_ranks(wrong) : -1;
          row.insert(row.end(), {format_us(time_us), fmt(alg), fmt(bus), s.check ? std::to_string(wrong_all) : "N/A"});
          busbw_by_collective[size_t(c)].sum += bus;
          busbw_by_collective[size_t(c)].rows += 1;
          log_root(rt, " %s busbw %s GB/s%s", placement_name(p), fmt(bus).c_str(),
                   wrong_all > 0 ? (" WRONG: " + std::to_string(wrong_all)).c_str() : "");
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
  return {"comm", "collective benchmark (all-reduce, reduce-scatter, all-gather, broadcast) over nccl or mpi",
          add_options, validate, run};
}

}  // namespace llmhpc

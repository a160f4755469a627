// Collectives of every backend (mpi on host buffers, nccl on GPU buffers) under mpirun
// with 1-4 ranks, checked on the comm harness's verifiable data (comm/verifiable.h: small
// integers, so every sum is exact even in bf16), the one scheme the benchmark's --check uses:
// exact results for counts that do and do not divide by the rank count, in place and out of
// place (inputs left alone); averaging (NCCL's rounding allowed on rank counts that are not a
// power of two); the all-to-all; async handles waited in any order; a dropped handle; groups;
// the copy engines (nccl); nccl without a compute stream; the barrier and the timing loop.
// With them, the reductions src/dist composes from these primitives: through a bf16 wire and
// through the copy engines (on the host over the communicator's own collectives, too). The checker itself is tested on simulated
// results: it accepts right ones and finds a wrong chunk, a wrong root and untouched output.
// The nccl cases skip when NCCL is not compiled in, no GPU is visible, or a node has
// more ranks than GPUs (the decision is collective, so no rank is left in a collective).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "comm/benchmark.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/verifiable.h"
#include "kernels/backend.h"
#include "src/core/check.h"
#include "src/dist/bf16_wire.h"
#include "src/dist/copy_engine_reduction.h"
#include "tests/mpi/mpi_test_util.h"
#if defined(LLMHPC_WITH_CUDA)
#include "comm/cuda/nccl_check.h"
#endif

namespace llmhpc {
namespace {

using test::local_gpu;
using test::nccl_runnable;
using test::world_rank;
using test::world_size;

#if defined(LLMHPC_WITH_CUDA)
// cudaMalloc, or while `shareable` NCCL's own allocation (memory NCCL can register as a window:
// what the copy engines need, CopyEngines::register_window).
class CudaMallocAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, const std::string&) override {
    void* p = nullptr;
    if (shareable) {
      NCCL_CHECK(ncclMemAlloc(&p, bytes ? bytes : 1));
      from_nccl_.insert(p);
    } else {
      CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    }
    return p;
  }
  void deallocate(void* p) override {
    if (from_nccl_.erase(p)) NCCL_CHECK(ncclMemFree(p));
    else CUDA_CHECK(cudaFree(p));
  }
  bool shareable = false;

 private:
  std::set<void*> from_nccl_;
};

// This rank's GPU, with copies on a stream of our own that the communicator is made with as
// its compute stream: it must order its work after the uploads and, once a handle is
// waited, the downloads after its work.
class GpuSpace final : public BufferSpace {
 public:
  explicit GpuSpace(int gpu) {
    CUDA_CHECK(cudaSetDevice(gpu));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~GpuSpace() override { cudaStreamDestroy(stream_); }
  Allocator& allocator() override { return allocator_; }
  void upload(void* dst, const void* host, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void settle() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void download(void* host, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* stream() const { return stream_; }
  void set_shareable(bool on) { allocator_.shareable = on; }

 private:
  CudaMallocAllocator allocator_;
  cudaStream_t stream_ = nullptr;
};
#endif

// The copy engines' interface over the communicator's own collectives: what the copy engines'
// reduction (src/dist/copy_engine_reduction.h) composes, run on the host (mpi), where a dropped
// handle completes its operation as a stream orders it. Checks that every call is in windows.
class CollectivesAsCopyEngines final : public CopyEngines {
 public:
  explicit CollectivesAsCopyEngines(Communicator& comm) : comm_(comm) {}
  void register_window(void* buffer, size_t bytes) override { windows_[static_cast<char*>(buffer)] = bytes; }
  void deregister_window(void* buffer) override { EXPECT_EQ(windows_.erase(static_cast<char*>(buffer)), 1u); }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    EXPECT_TRUE(in_window(recv, count * size_t(comm_.size()) * dtype_size(dtype)));
    return comm_.all_gather_async(send, recv, count, dtype);
  }
  CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * size_t(comm_.size()) * dtype_size(dtype);
    EXPECT_TRUE(in_window(send, bytes) && in_window(recv, bytes));
    return comm_.all_to_all_async(send, recv, count, dtype);
  }

 private:
  bool in_window(const void* data, size_t bytes) const {
    const char* p = static_cast<const char*>(data);
    for (const auto& [begin, size] : windows_)
      if (begin <= p && p + bytes <= begin + size) return true;
    return false;
  }
  Communicator& comm_;
  std::map<char*, size_t> windows_;
};

// ---- Fixture over backends and dtypes -------------------------------------------------------

struct Case {
  CommBackend backend;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(comm_backend_name(info.param.backend)) + "_" + dtype_name(info.param.dtype);
}


struct BackendState {
  std::unique_ptr<BufferSpace> space;
  std::unique_ptr<Communicator> comm;
  int gpu = -1;
};

// An operation on buffers of its own, laid out by make_call, its verifiable inputs uploaded.
struct Prepared {
  CallBuffers buffers;
  Verifiable v;
  Call call;
  void* send() const { return buffers.send.tensor().data; }
  void* recv() const { return buffers.recv.tensor().data; }
};

std::string describe(const Operation& op) {
  std::string what = collective_name(op.collective);
  if (is_reduction(op.collective)) what += std::string(" ") + reduce_op_name(op.op);
  if (op.collective == Collective::Broadcast) what += " root " + std::to_string(op.root);
  return what + " count " + std::to_string(op.count) + " " + placement_name(op.placement);
}

class CommTest : public ::testing::TestWithParam<Case> {
 protected:
  // One communicator per backend for the whole suite (NCCL start-up is slow), freed
  // before MPI_Finalize.
  static std::map<CommBackend, BackendState>& states() {
    static std::map<CommBackend, BackendState> s;
    return s;
  }
  static void TearDownTestSuite() { states().clear(); }

  void SetUp() override {
    backend_ = GetParam().backend;
    dtype_ = GetParam().dtype;
    if (backend_ == CommBackend::Nccl && !nccl_runnable())
      GTEST_SKIP() << "nccl: not compiled in, no GPU visible, or more ranks than GPUs on a node";
    BackendState& s = states()[backend_];
    if (!s.comm) {
      CommOptions o;
      o.backend = backend_;
      if (backend_ == CommBackend::Mpi) {
        s.space = std::make_unique<HostBufferSpace>(host_physical_memory());
      } else {
#if defined(LLMHPC_WITH_CUDA)
        o.gpu = s.gpu = local_gpu();
        auto gpu_space = std::make_unique<GpuSpace>(o.gpu);
        o.compute_stream = gpu_space->stream();
        s.space = std::move(gpu_space);
#endif
      }
      s.comm = make_communicator(o);
    }
    comm_ = s.comm.get();
    space_ = s.space.get();
    gpu_ = s.gpu;
  }

  // `op` in this case's dtype, ready to issue; its averages rounded as the backend's, or as
  // `rounding` says.
  Prepared prepare(Operation op) { return prepare(op, average_rounding(*comm_)); }
  Prepared prepare(Operation op, AverageRounding rounding) {
    op.dtype = dtype_;
    Prepared p{CallBuffers(*space_, op, world_size()), make_verifiable(op, world_rank(), world_size(), rounding), {}};
    p.call = make_call(op, world_rank(), p.send(), p.recv());
    upload_inputs(*space_, p.v, p.send(), p.recv());
    return p;
  }

  // Collective: every rank learns the total, so rank 0 (the only one printing) reports a
  // failure seen on any rank; a failing rank also says what it saw (`here`).
  void expect_none_wrong(int64_t wrong, const std::string& what, const std::string& here) {
    int64_t total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int first_rank = wrong ? world_rank() : world_size(), lowest = 0;
    MPI_Allreduce(&first_rank, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ(total, 0) << what << ": wrong on " << (total ? "rank " + std::to_string(lowest) : "no rank")
                        << (wrong ? "; here (rank " + std::to_string(world_rank()) + ") " + here : std::string());
  }

  // The result of a completed operation is exact (within v.tolerance); out of place, its
  // input is as it was.
  void expect_result(const Prepared& p, const std::string& what) {
    const Mismatch m = check_result(*space_, p.v, p.recv());
    expect_none_wrong(m.count, what,
                      std::to_string(m.count) + " wrong elements, the first " + std::to_string(m.first) +
                          " of the result: " + std::to_string(m.got) + ", want " + std::to_string(m.expected));
    if (p.v.op.placement == Placement::InPlace) return;
    std::vector<char> input(p.v.send.size());
    space_->download(input.data(), p.send(), input.size());
    expect_none_wrong(input == p.v.send ? 0 : 1, what + ": the input is left alone", "the input changed");
  }

  // One call through the blocking form, in both placements.
  void expect_exact(Operation op) {
    for (Placement placement : {Placement::OutOfPlace, Placement::InPlace}) {
      op.placement = placement;
      const Prepared p = prepare(op);
      issue(*comm_, p.call, true);
      expect_result(p, describe(p.v.op));
    }
  }

  // An all-to-all of `count` elements per chunk, out of place, through `engines` (its buffers
  // registered as windows) or the communicator: element i of chunk j of rank r's send is
  // 16 r + j + 64 (i mod 4) - 128, exact in every dtype, and lands in rank j's chunk r.
  void expect_all_to_all(size_t count, CopyEngines* engines = nullptr) {
    const int n = world_size(), rank = world_rank();
    auto value = [](int from, int to, size_t i) { return double(16 * from + to) + 64.0 * double(i % 4) - 128; };
    const size_t total = count * size_t(n), bytes = total * dtype_size(dtype_);
    std::vector<char> image(bytes);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < count; ++i)
        store_from_double(image.data(), size_t(j) * count + i, dtype_, value(rank, j, i));
    Buffer send(space_->allocator(), dtype_, {int64_t(total)}, "send");
    Buffer recv(space_->allocator(), dtype_, {int64_t(total)}, "recv");
    void *in = send.tensor().data, *out = recv.tensor().data;
    space_->upload(in, image.data(), bytes);
    space_->settle();
    if (engines) {
      engines->register_window(in, bytes);
      engines->register_window(out, bytes);
      engines->all_to_all_async(in, out, count, dtype_).wait();
      engines->deregister_window(in);
      engines->deregister_window(out);
    } else {
      comm_->all_to_all_async(in, out, count, dtype_).wait();
    }
    space_->download(image.data(), out, bytes);
    int64_t wrong = 0;
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < count; ++i)
        wrong += load_as_double(image.data(), size_t(j) * count + i, dtype_) != value(j, rank, i);
    expect_none_wrong(wrong, std::string(engines ? "copy engines: " : "") + "all_to_all count " + std::to_string(count),
                      std::to_string(wrong) + " wrong elements");
  }

  // `op` in place through the copy engines' reduction on `engines`: the collective's exact
  // result (an average is the sum times 1/n, rounded as NCCL's). Its buffers and scratch come
  // from this backend's allocator.
  void expect_copy_engine_reduction(Operation op, CopyEngines& engines) {
    op.placement = Placement::InPlace;
    const Prepared p = prepare(op, AverageRounding::PerInput);
    const Tensor& whole = p.buffers.recv.tensor();
    {
      CopyEngineReduction reduction(*comm_, engines, whole,
                                    Buffer(space_->allocator(), dtype_, whole.shape, "scratch"));
      CommHandle h = op.collective == Collective::AllReduce
                         ? reduction.all_reduce_async(whole.data, op.count, op.op)
                         : reduction.reduce_scatter_async(whole.data, op.count, op.op);
      h.wait();
    }
    expect_result(p, "copy engines: " + describe(p.v.op));
  }

  CommBackend backend_ = CommBackend::Mpi;
  DType dtype_ = DType::F32;
  Communicator* comm_ = nullptr;
  BufferSpace* space_ = nullptr;
  int gpu_ = -1;
};

// Counts that divide by 2, 3 and 4 ranks and counts that do not.
const size_t kCounts[] = {1, 7, 12, 1001, 65539};

TEST_P(CommTest, RankAndSize) {
  EXPECT_EQ(comm_->rank(), world_rank());
  EXPECT_EQ(comm_->size(), world_size());
  EXPECT_EQ(comm_->device_buffers(), backend_ == CommBackend::Nccl);
}

TEST_P(CommTest, AllReduceIsExact) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average})
    for (size_t n : kCounts) expect_exact({Collective::AllReduce, n, dtype_, op});
}

TEST_P(CommTest, ReduceScatterIsExact) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average})
    for (size_t count : kCounts) expect_exact({Collective::ReduceScatter, count, dtype_, op});
}

TEST_P(CommTest, AllToAllIsExact) {
  for (size_t count : kCounts) expect_all_to_all(count);
}

// Fp32 values through a bf16 wire (src/dist/bf16_wire.h), in place, on every backend: the verifiable data is exact in bf16, so sums are exact, and so
// are averages over a power-of-two number of ranks; over others the bf16 divisions and
// products round by less than 0.5 (inputs of at most 127 / n). Values bf16 cannot hold travel
// rounded to nearest: 1 + 2^-9 on every rank sums to exactly n (fp32 would keep n + n 2^-9), and
// 1 + 3 2^-9 to n (1 + 2^-7) where that is exact in bf16 (n a power of two).
TEST_P(CommTest, ReducesFp32ValuesInBf16) {
  if (dtype_ != DType::F32) GTEST_SKIP() << "fp32 values, once per backend";
  const int n = world_size();
  for (size_t count : kCounts)
    for (Collective c : {Collective::AllReduce, Collective::ReduceScatter})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        Prepared p = prepare({c, count, dtype_, op, 0, Placement::InPlace});
        const size_t total = c == Collective::AllReduce ? count : count * size_t(n);
        Buffer wire(space_->allocator(), DType::BF16, {int64_t(total)}, "wire");
        Bf16Wire bf16(*comm_, wire.tensor(), nullptr);
        float* data = static_cast<float*>(p.recv());
        CommHandle h = c == Collective::AllReduce ? bf16.all_reduce_async(data, count, op)
                                                  : bf16.reduce_scatter_async(data, count, op);
        h.wait();
        if (op == ReduceOp::Average && (n & (n - 1)) != 0) p.v.tolerance = 0.5;
        expect_result(p, "in bf16: " + describe(p.v.op));
      }
  const size_t count = 1001;
  std::vector<float> inputs(count);
  for (size_t i = 0; i < count; ++i) inputs[i] = 1.0f + std::ldexp(i % 2 ? 3.0f : 1.0f, -9);
  Buffer data(space_->allocator(), DType::F32, {int64_t(count)}, "data");
  Buffer wire(space_->allocator(), DType::BF16, {int64_t(count)}, "wire");
  space_->upload(data.tensor().data, inputs.data(), count * sizeof(float));
  space_->settle();
  Bf16Wire(*comm_, wire.tensor(), nullptr)
      .all_reduce_async(static_cast<float*>(data.tensor().data), count, ReduceOp::Sum)
      .wait();
  std::vector<float> got(count);
  space_->download(got.data(), data.tensor().data, count * sizeof(float));
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (i % 2 == 0) wrong += got[i] != float(n);
    else if ((n & (n - 1)) == 0) wrong += got[i] != float(n) * (1.0f + std::ldexp(1.0f, -7));
  expect_none_wrong(wrong, "in bf16: values rounded to nearest before the sum",
                    "got " + std::to_string(got[0]) + ", " + std::to_string(got[1]));
}

TEST_P(CommTest, AllGatherIsExact) {
  for (size_t count : kCounts) expect_exact({Collective::AllGather, count, dtype_});
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < world_size(); ++root)
    expect_exact({Collective::Broadcast, 1001, dtype_, ReduceOp::Sum, root});
}

// Several operations in flight at once, waited for in reverse order.
TEST_P(CommTest, AsyncHandlesCompleteInAnyOrder) {
  const size_t n = 4099;
  const Prepared sum = prepare({Collective::AllReduce, n, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
  const Prepared gathered = prepare({Collective::AllGather, n, dtype_});
  const Prepared avg = prepare({Collective::AllReduce, n, dtype_, ReduceOp::Average, 0, Placement::InPlace});
  std::vector<CommHandle> handles;
  for (const Prepared* p : {&sum, &gathered, &avg}) handles.push_back(issue(*comm_, p->call, false));
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) {
    EXPECT_TRUE(it->pending());
    it->wait();
    EXPECT_FALSE(it->pending());
    it->wait();  // idempotent
  }
  expect_result(sum, "async all_reduce sum");
  expect_result(gathered, "async all_gather");
  expect_result(avg, "async all_reduce avg");
}

// A handle dropped without wait(): the result is there after synchronize().
TEST_P(CommTest, DroppedHandleStillCompletes) {
  const Prepared p = prepare({Collective::AllReduce, 333, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
  { CommHandle dropped = issue(*comm_, p.call, false); }
  comm_->synchronize();
  expect_result(p, "dropped all_reduce");
}

TEST_P(CommTest, GroupedOperations) {
  std::vector<Prepared> ops;
  for (int k = 0; k < 3; ++k)
    ops.push_back(prepare({Collective::AllReduce, 517, dtype_, ReduceOp::Sum, 0, Placement::InPlace}));
  std::vector<CommHandle> handles;
  comm_->group_start();
  for (const Prepared& p : ops) handles.push_back(issue(*comm_, p.call, false));
  comm_->group_end();
  for (CommHandle& h : handles) h.wait();
  for (const Prepared& p : ops) expect_result(p, "grouped all_reduce");
}

// Busy time (Communicator::time_operations): nccl times each operation on its stream once, a
// group as one span, and take_busy_ms(mark) sums those issued before the mark and not taken
// yet; off, or from the mpi backend, it is NaN. take_busy_spans places them, named, on a
// timer's clock. The results stay exact.
TEST_P(CommTest, BusyTimeOfOperations) {
  const Prepared op = prepare({Collective::AllReduce, 1 << 20, dtype_});  // out of place: one rank copies
  EXPECT_TRUE(std::isnan(comm_->take_busy_ms(comm_->busy_mark()))) << "not timing";
  comm_->time_operations(true);
  if (backend_ == CommBackend::Mpi) {
    issue(*comm_, op.call, true);
    EXPECT_TRUE(std::isnan(comm_->take_busy_ms(comm_->busy_mark()))) << "mpi measures no device time";
    EXPECT_TRUE(comm_->take_busy_spans(comm_->busy_mark()).empty());
    comm_->time_operations(false);
    expect_result(op, "all_reduce while timing");
    return;
  }
  const uint64_t start = comm_->busy_mark();
  issue(*comm_, op.call, true);
  const uint64_t one = comm_->busy_mark();
  EXPECT_EQ(one, start + 1);
  const Prepared small = prepare({Collective::AllReduce, 517, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
  comm_->group_start();
  CommHandle a = issue(*comm_, small.call, false), b = issue(*comm_, op.call, false);
  comm_->group_end();
  a.wait(), b.wait();
  EXPECT_EQ(comm_->busy_mark(), one + 1) << "a group is one span";
  issue(*comm_, op.call, true);
  const uint64_t three = comm_->busy_mark();
  comm_->synchronize();
  const double first = comm_->take_busy_ms(one);
  EXPECT_GT(first, 0.0) << "an all-reduce of 4 MiB or more takes time";
  EXPECT_LT(first, 60e3);
  EXPECT_EQ(comm_->take_busy_ms(one), 0.0) << "taken once";
  const double rest = comm_->take_busy_ms(three);
  EXPECT_GT(rest, 0.0);
  EXPECT_EQ(comm_->take_busy_ms(comm_->busy_mark()), 0.0) << "nothing issued since";
  // The spans on a timeline: named, from a mark recorded on the stream before them, in order.
  std::unique_ptr<Timer> origin = comm_->make_timer(1);
  origin->mark(0);
  issue(*comm_, op.call, true);
  comm_->group_start();
  const Prepared tiny = prepare({Collective::AllReduce, 517, dtype_});  // out of place: again gives the same
  CommHandle c = issue(*comm_, tiny.call, false), d = issue(*comm_, tiny.call, false);
  comm_->group_end();
  c.wait(), d.wait();
  comm_->synchronize();
  const std::vector<OperationSpan> spans = comm_->take_busy_spans(comm_->busy_mark(), origin.get(), 0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].name, "allreduce");
  EXPECT_EQ(spans[1].name, "allreduce x2") << "a group is named by what it holds";
  EXPECT_GT(spans[0].bytes, 0u);
  EXPECT_EQ(spans[1].bytes, 2 * 517 * dtype_size(dtype_));
  EXPECT_GE(spans[0].start_ms, 0.0);
  EXPECT_GT(spans[0].end_ms, spans[0].start_ms);
  EXPECT_LE(spans[0].end_ms, spans[1].start_ms + 1e-3) << "one stream runs them one after the other";
  EXPECT_GE(spans[1].end_ms, spans[1].start_ms);
  comm_->time_operations(false);
  EXPECT_TRUE(std::isnan(comm_->take_busy_ms(comm_->busy_mark()))) << "not timing";
  expect_result(op, "all_reduce while timing");
  expect_result(small, "grouped all_reduce while timing");
  expect_result(tiny, "all_reduce twice in a group while timing");
}

// The copy engines' reduction composed on the host, over the communicator's own collectives
// (mpi; CollectivesAsCopyEngines): the collective's exact results for counts whose parts divide
// among the ranks and counts that leave elements over (those take the communicator's
// all-reduce), in the dtypes its sum takes.
TEST_P(CommTest, CopyEngineReductionComposesOnTheHost) {
  if (backend_ != CommBackend::Mpi || dtype_ == DType::F64) GTEST_SKIP() << "mpi, the dtypes the sum takes";
  CollectivesAsCopyEngines engines(*comm_);
  for (size_t n : kCounts)
    for (Collective c : {Collective::AllReduce, Collective::ReduceScatter})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) expect_copy_engine_reduction({c, n, dtype_, op}, engines);
}

// Through the copy engines (nccl, several ranks; Communicator::copy_engines): in place on
// windows of shareable memory, the same exact results as NCCL's kernels: all-gathers and
// all-to-alls in every dtype; the copy engines' reductions (src/dist/copy_engine_reduction.h) in
// fp32 and bf16, for counts whose parts divide among the ranks and counts that leave elements
// over (those take NCCL's kernels); fp32 values through a bf16 wire that the copy engines
// reduce; and reductions of two ranges of one window with an all-gather in another window,
// issued back to back and waited for in reverse.
TEST_P(CommTest, CopyEngineCollectivesAreExact) {
  if (backend_ != CommBackend::Nccl || world_size() < 2) GTEST_SKIP() << "the copy engines need nccl and two ranks";
#if defined(LLMHPC_WITH_CUDA)
  GpuSpace& gpu = static_cast<GpuSpace&>(*space_);
  CopyEngines* engines = comm_->copy_engines();
  ASSERT_NE(engines, nullptr);
  const bool sums = dtype_ != DType::F64;  // the dtypes the copy engines' reductions sum
  gpu.set_shareable(true);
  for (size_t n : kCounts) {
    expect_all_to_all(n, engines);
    const Prepared p = prepare({Collective::AllGather, n, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
    const Tensor& whole = p.buffers.recv.tensor();
    engines->register_window(whole.data, whole.bytes());
    engines->all_gather_async(p.call.send, p.call.recv, n, dtype_).wait();
    engines->deregister_window(whole.data);
    expect_result(p, "copy engines: " + describe(p.v.op));
    if (!sums) continue;
    for (Collective c : {Collective::AllReduce, Collective::ReduceScatter})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) expect_copy_engine_reduction({c, n, dtype_, op}, *engines);
  }
  gpu.set_shareable(false);
  if (!sums) return;

  // Fp32 values through a bf16 wire that the copy engines reduce (exact: see
  // ReducesFp32ValuesInBf16).
  if (dtype_ == DType::F32)
    for (Collective c : {Collective::AllReduce, Collective::ReduceScatter})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        const size_t count = 4099, total = c == Collective::AllReduce ? count : count * size_t(world_size());
        Prepared p = prepare({c, count, dtype_, op, 0, Placement::InPlace});
        gpu.set_shareable(true);
        Buffer wire(gpu.allocator(), DType::BF16, {int64_t(total)}, "wire");
        Buffer scratch(gpu.allocator(), DType::BF16, {int64_t(total)}, "scratch");
        gpu.set_shareable(false);
        {
          CopyEngineReduction reduction(*comm_, *engines, wire.tensor(), std::move(scratch));
          Bf16Wire bf16(*comm_, wire.tensor(), &reduction);
          float* data = static_cast<float*>(p.recv());
          CommHandle h = c == Collective::AllReduce ? bf16.all_reduce_async(data, count, op)
                                                    : bf16.reduce_scatter_async(data, count, op);
          h.wait();
        }
        if (op == ReduceOp::Average && (world_size() & (world_size() - 1)) != 0) p.v.tolerance = 0.5;
        expect_result(p, "copy engines in bf16: " + describe(p.v.op));
      }

  // Two all-reduces in one window (with a scratch) and an all-gather in a second window, issued
  // back to back: copied in, communicated, copied out.
  const size_t count = 4099, bytes = count * dtype_size(dtype_);
  std::vector<Prepared> ops;
  for (int k = 0; k < 2; ++k)
    ops.push_back(prepare({Collective::AllReduce, count, dtype_, ReduceOp::Sum, 0, Placement::InPlace}));
  gpu.set_shareable(true);
  const Prepared gather = prepare({Collective::AllGather, count, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
  Buffer region(gpu.allocator(), dtype_, {int64_t(2 * count)}, "region");
  Buffer scratch(gpu.allocator(), dtype_, {int64_t(count)}, "scratch");
  gpu.set_shareable(false);
  char* base = static_cast<char*>(region.tensor().data);
  for (int k = 0; k < 2; ++k)
    CUDA_CHECK(cudaMemcpy(base + k * bytes, ops[size_t(k)].recv(), bytes, cudaMemcpyDeviceToDevice));
  // A copy between device buffers returns before it is done, on the legacy default stream, which
  // the non-blocking streams of the communicator and the checks do not wait for: without this,
  // the collectives could send the region before its inputs arrive (and the checks read the
  // results before they are copied out: seen with 2 ranks sharing one GPU).
  CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor& gathered = gather.buffers.recv.tensor();
  {
    CopyEngineReduction reduction(*comm_, *engines, region.tensor(), std::move(scratch));
    engines->register_window(gathered.data, gathered.bytes());
    std::vector<CommHandle> handles;
    for (int k = 0; k < 2; ++k) handles.push_back(reduction.all_reduce_async(base + k * bytes, count, ReduceOp::Sum));
    handles.push_back(engines->all_gather_async(gather.call.send, gather.call.recv, count, dtype_));
    for (auto h = handles.rbegin(); h != handles.rend(); ++h) h->wait();
    engines->deregister_window(gathered.data);
  }
  for (int k = 0; k < 2; ++k)
    CUDA_CHECK(cudaMemcpy(ops[size_t(k)].recv(), base + k * bytes, bytes, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // the same, before the results are read on another stream
  for (const Prepared& p : ops) expect_result(p, "copy engines: back-to-back all_reduce");
  expect_result(gather, "copy engines: all_gather after them");
#endif
}

// The device allocator's shareable memory (DevicePages::allocate_shareable) is what NCCL's
// symmetric windows take, on a communicator with the zero-CTA policy: registered, an all-gather
// and an all-to-all on it in place give exact results, and it goes back to the allocator. Runs
// on any number of ranks (on one, NCCL's registration still exports the memory).
TEST_P(CommTest, ShareableDeviceMemoryRegistersAsAWindow) {
  if (backend_ != CommBackend::Nccl || dtype_ != DType::F32) GTEST_SKIP() << "nccl, once";
#if defined(LLMHPC_WITH_CUDA)
  BackendOptions bo;
  bo.kind = DeviceKind::Cuda;
  bo.ordinal = gpu_;
  Backend backend = make_backend(bo);
  Allocator& alloc = backend.device->allocator();
  if (!alloc.shares_memory())
    GTEST_SKIP() << "this GPU's driver exports no device memory (--collective-engine sm only)";
  const int n = world_size(), rank = world_rank();
  const size_t part = 1000;
  Buffer buffer(alloc, DType::F32, {int64_t(part) * n}, "shareable", MemoryKind::Shareable);
  Buffer received(alloc, DType::F32, {int64_t(part) * n}, "shareable.scratch", MemoryKind::Shareable);
  ncclUniqueId id{};
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
  ncclWindow_t w1 = nullptr, w2 = nullptr;
  float* data = static_cast<float*>(buffer.tensor().data);
  NCCL_CHECK(ncclCommWindowRegister(comm, data, buffer.tensor().bytes(), &w1, NCCL_WIN_COLL_SYMMETRIC));
  NCCL_CHECK(
      ncclCommWindowRegister(comm, received.tensor().data, received.tensor().bytes(), &w2, NCCL_WIN_COLL_SYMMETRIC));
  // Part j of rank r holds 1000 r + j; after the all-to-all, rank r's received part j is rank
  // j's part r; after the all-gather of each rank's own part, part j is rank j's.
  std::vector<float> mine(part * size_t(n));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = float(1000 * rank) + float(i / part);
  CUDA_CHECK(cudaMemcpy(data, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice));
  // On a stream of its own, as the communicator's: NCCL's copy-engine collectives refuse the
  // legacy default stream ("invalid argument", NCCL 2.28 on 2 H200).
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  NCCL_CHECK(ncclAlltoAll(data, received.tensor().data, part, ncclFloat32, comm, stream));
  NCCL_CHECK(ncclAllGather(data + size_t(rank) * part, data, part, ncclFloat32, comm, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::vector<float> got(mine.size()), got_received(mine.size());
  CUDA_CHECK(cudaMemcpy(got.data(), data, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(
      cudaMemcpy(got_received.data(), received.tensor().data, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t j = i / part;
    wrong += got[i] != float(1000 * int(j)) + float(j);
    wrong += got_received[i] != float(1000 * int(j)) + float(rank);
  }
  expect_none_wrong(wrong, "all-to-all and all-gather on shareable memory", std::to_string(wrong) + " wrong");
  NCCL_CHECK(ncclCommWindowDeregister(comm, w1));
  NCCL_CHECK(ncclCommWindowDeregister(comm, w2));
  NCCL_CHECK(ncclCommFinalize(comm));
  NCCL_CHECK(ncclCommDestroy(comm));
#endif
}

// nccl made without a compute stream (as the comm benchmark makes it): the caller has
// its inputs ready, and wait() blocks the host until the result is there.
TEST_P(CommTest, NcclWithoutComputeStream) {
  if (backend_ != CommBackend::Nccl) GTEST_SKIP() << "only nccl orders against a compute stream";
  CommOptions o;
  o.backend = CommBackend::Nccl;
  o.gpu = gpu_;
  std::unique_ptr<Communicator> standalone = make_communicator(o);
  const Prepared sum = prepare({Collective::AllReduce, 10007, dtype_, ReduceOp::Sum, 0, Placement::InPlace});
  issue(*standalone, sum.call, false).wait();
  expect_result(sum, "all_reduce without a compute stream");
  const Prepared gathered = prepare({Collective::AllGather, 10007, dtype_});
  issue(*standalone, gathered.call, true);
  expect_result(gathered, "all_gather without a compute stream");
}

// The harness's timing loop on the communicator's timer, after its barrier: one time per
// operation or one mean, plausible, and the operations' result right after it.
TEST_P(CommTest, BarrierAndTimingLoop) {
  const Prepared p = prepare({Collective::AllReduce, 1 << 16, dtype_});
  const std::vector<double> each = time_call(*comm_, p.call, 3, Timing::PerOperation);
  const std::vector<double> mean = time_call(*comm_, p.call, 3, Timing::BackToBack);
  ASSERT_EQ(each.size(), 3u);
  ASSERT_EQ(mean.size(), 1u);
  for (double us : {each[0], each[1], each[2], mean[0]}) {
    EXPECT_GE(us, 0.0);
    EXPECT_LT(us, 60e6);
  }
  EXPECT_TRUE(time_call(*comm_, p.call, 0, Timing::PerOperation).empty());
  expect_result(p, "all_reduce after the timing loop");  // out of place: every run gives the same
  comm_->barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest,
                         ::testing::Values(Case{CommBackend::Mpi, DType::F32}, Case{CommBackend::Mpi, DType::BF16},
                                           Case{CommBackend::Mpi, DType::F64}, Case{CommBackend::Nccl, DType::F32},
                                           Case{CommBackend::Nccl, DType::BF16}, Case{CommBackend::Nccl, DType::F64}),
                         case_name);

// ---- The checker (comm/verifiable.h) on simulated results -------------------------------------

// What rank `rank`'s recv holds after a sum collective, computed on the host from every
// rank's verifiable inputs. With `shift` > 0 it is wrong as a backend could be: the chunk
// (reduce-scatter, all-gather) or the root (broadcast) of `shift` ranks further on.
std::vector<char> simulate(const Operation& op, int rank, int nranks, int shift) {
  std::vector<Verifiable> all;
  for (int r = 0; r < nranks; ++r) all.push_back(make_verifiable(op, r, nranks, AverageRounding::Once));
  const bool in_place = op.placement == Placement::InPlace;
  auto input = [&](int r, size_t i) {  // element i of rank r's input, wherever its image has it
    const Verifiable& v = all[size_t(r % nranks)];
    if (op.collective == Collective::AllGather && in_place) i += size_t(r % nranks) * op.count;
    return load_as_double((in_place ? v.recv : v.send).data(), i, op.dtype);
  };
  const Verifiable& mine = all[size_t(rank)];
  std::vector<char> result = mine.recv;
  for (size_t i = 0; i < mine.result_count; ++i) {
    double x = 0;
    switch (op.collective) {
      case Collective::AllReduce:
        for (int r = 0; r < nranks; ++r) x += input(r, i);
        break;
      case Collective::ReduceScatter:
        for (int r = 0; r < nranks; ++r) x += input(r, size_t((rank + shift) % nranks) * op.count + i);
        break;
      case Collective::AllGather: x = input(int(i / op.count) + shift, i % op.count); break;
      case Collective::Broadcast: x = input(op.root + shift, i); break;
    }
    store_from_double(result.data(), mine.result_offset + i, op.dtype, x);
  }
  return result;
}

TEST(Verifiable, AcceptsRightResultsAndFindsWrongOnes) {
  for (int nranks = 1; nranks <= 4; ++nranks)
    for (Collective c : all_collectives())
      for (Placement p : {Placement::OutOfPlace, Placement::InPlace})
        for (DType t : {DType::F32, DType::BF16, DType::F64})
          for (size_t count : {size_t(7), size_t(12), size_t(1001)})
            for (int rank = 0; rank < nranks; ++rank) {
              const Operation op{c, count, t, ReduceOp::Sum, nranks - 1, p};
              const Verifiable v = make_verifiable(op, rank, nranks, AverageRounding::Once);
              const std::string what = describe(op) + " " + dtype_name(t) + ", rank " + std::to_string(rank) + " of " +
                                       std::to_string(nranks);
              EXPECT_EQ(count_wrong(v, simulate(op, rank, nranks, 0)).count, 0) << what;
              if (nranks > 1 && c != Collective::AllReduce)
                EXPECT_GT(count_wrong(v, simulate(op, rank, nranks, 1)).count, 0) << what << ": wrong chunk or root";
              if (p == Placement::OutOfPlace)
                EXPECT_EQ(count_wrong(v, v.recv).count, int64_t(v.result_count)) << what << ": untouched output";
            }
}

// ---- Call layouts and the benchmark's size rules (comm/collectives.h) ---------------------------

TEST(CollectiveCall, InPlaceLayoutsAreNccls) {
  float send[12], recv[12];
  const Operation rs{Collective::ReduceScatter, 3, DType::F32, ReduceOp::Sum, 0, Placement::InPlace};
  Call c = make_call(rs, 2, send, recv);
  EXPECT_EQ(c.send, recv);
  EXPECT_EQ(c.recv, recv + 6);
  Operation ag = rs;
  ag.collective = Collective::AllGather;
  c = make_call(ag, 2, send, recv);
  EXPECT_EQ(c.send, recv + 6);
  EXPECT_EQ(c.recv, recv);
  c = make_call({Collective::Broadcast, 3, DType::F32, ReduceOp::Sum, 1, Placement::InPlace}, 2, send, recv);
  EXPECT_EQ(c.send, recv);
  EXPECT_EQ(c.root, 1);
  ag.placement = Placement::OutOfPlace;
  c = make_call(ag, 2, send, recv);
  EXPECT_EQ(c.send, send);
  EXPECT_EQ(c.recv, recv);
  EXPECT_EQ(largest_buffer_elements(Collective::AllGather, 3, 4), 12u);
  EXPECT_EQ(largest_buffer_elements(Collective::AllReduce, 3, 4), 3u);
}

TEST(CollectiveShape, RoundsDownToEqualChunksLikeNcclTests) {
  // 1000 B of float on 3 ranks: 250 elements; reduce-scatter/all-gather use 83 per rank.
  CollectiveShape rs = collective_shape(Collective::ReduceScatter, 1000, DType::F32, 3);
  EXPECT_EQ(rs.count, 83u);
  EXPECT_EQ(rs.total_elements, 249u);
  EXPECT_EQ(rs.bytes, 996u);
  CollectiveShape ag = collective_shape(Collective::AllGather, 1000, DType::BF16, 4);
  EXPECT_EQ(ag.count, 125u);
  EXPECT_EQ(ag.bytes, 1000u);
  CollectiveShape ar = collective_shape(Collective::AllReduce, 1003, DType::F32, 3);
  EXPECT_EQ(ar.count, 250u);  // whole elements only
  EXPECT_EQ(ar.bytes, 1000u);
  CollectiveShape bc = collective_shape(Collective::Broadcast, 1000000000, DType::F32, 8);
  EXPECT_EQ(bc.count, 250000000u);
  EXPECT_EQ(collective_shape(Collective::ReduceScatter, 8, DType::F32, 3).count, 0u);  // less than one per rank
}

TEST(CollectiveShape, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::ReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllGather, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(algbw_gbs(1000000000, 1e6), 1.0);  // 1 GB in 1 s
}

TEST(CollectiveShape, NamesRoundTrip) {
  for (Collective c : all_collectives()) EXPECT_EQ(parse_collective(collective_name(c), "collective"), c);
  EXPECT_THROW(parse_collective("alltoall", "collective"), UsageError);
}

TEST(LaunchSettings, KeepsWhatChangesPlacementAndCommunicationSorted) {
  const char* env[] = {"PATH=/usr/bin",
                       "NCCL_P2P_DISABLE=1",
                       "OMPI_MCA_btl=self,vader",
                       "HOME=/root",
                       "NCCL_ALGO=Ring",
                       "SLURM_JOB_ID=42",
                       "SLURM_JOB_NAME=x",
                       "NCCL=not a prefix",
                       "CUDA_VISIBLE_DEVICES=0,1",
                       "UCX_TLS=rc",
                       "OMPI_MCA_orte_hnp_uri=1468465152.0;tcp://192.0.2.2:36627",
                       "OMPI_MCA_ess_base_vpid=0",
                       "OMPI_MCA_hwloc_base_binding_policy=none",
                       nullptr};
  EXPECT_EQ(launch_settings(env),
            "CUDA_VISIBLE_DEVICES=0,1\nNCCL_ALGO=Ring\nNCCL_P2P_DISABLE=1\nOMPI_MCA_btl=self,vader\n"
            "OMPI_MCA_hwloc_base_binding_policy=none\nSLURM_JOB_ID=42\nUCX_TLS=rc");
  const char* none[] = {"PATH=/usr/bin", nullptr};
  EXPECT_EQ(launch_settings(none), "");
}

}  // namespace
}  // namespace llmhpc

// Collectives of every backend (mpi on host buffers, nccl on GPU buffers) under mpirun
// with 1-4 ranks: exact results on exactly representable inputs (small integers, so every
// sum is exact even in bf16) for counts that do and do not divide by the rank count,
// in place and out of place; averaging; async handles waited in any order; groups.
// The nccl cases skip when NCCL is not compiled in, no GPU is visible, or a node has
// more ranks than GPUs (the decision is collective, so no rank is left in a collective).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "kernels/backend.h"
#include "src/core/check.h"
#include "tests/mpi/mpi_test_util.h"
#if defined(LLMHPC_WITH_CUDA)
#include "comm/cuda/nccl_check.h"
#endif

namespace llmhpc {
namespace {

using test::nccl_runnable;
using test::world_rank;
using test::world_size;

// ---- Memory of a backend: host for mpi, this rank's GPU for nccl ----------------------

class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Ordered before collectives issued afterwards.
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  // After a handle's wait(): sees the result.
  virtual void download(void* host, const void* src, size_t bytes) = 0;
  virtual void* compute_stream() { return nullptr; }
};

class HostMemory final : public Memory {
 public:
  void* allocate(size_t bytes) override { return std::malloc(bytes ? bytes : 1); }
  void release(void* p) override { std::free(p); }
  void upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
};

#if defined(LLMHPC_WITH_CUDA)
// Copies go through a compute stream of our own: the communicator must order its work
// after the uploads and, once a handle is waited, the downloads after its work.
class GpuMemory final : public Memory {
 public:
  explicit GpuMemory(int gpu) {
    CUDA_CHECK(cudaSetDevice(gpu));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~GpuMemory() override { cudaStreamDestroy(stream_); }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
  }
  void release(void* p) override { CUDA_CHECK(cudaFree(p)); }
  void upload(void* dst, const void* host, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host image may go away
  }
  void download(void* host, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* compute_stream() override { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};
#endif

// A buffer in a backend's memory, filled from and read back as values.
class TestBuffer {
 public:
  TestBuffer(Memory& mem, DType t, size_t n) : mem_(mem), dtype_(t), n_(n), data_(mem.allocate(n * dtype_size(t))) {}
  ~TestBuffer() { mem_.release(data_); }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;

  void* data() const { return data_; }
  void* at(size_t element) const { return static_cast<char*>(data_) + element * dtype_size(dtype_); }
  void set(const std::vector<double>& values) {
    ASSERT_EQ(values.size(), n_);
    std::vector<char> image(n_ * dtype_size(dtype_));
    for (size_t i = 0; i < n_; ++i) {
      if (dtype_ == DType::F32) reinterpret_cast<float*>(image.data())[i] = float(values[i]);
      else if (dtype_ == DType::BF16) reinterpret_cast<uint16_t*>(image.data())[i] = float_to_bf16_bits(float(values[i]));
      else reinterpret_cast<double*>(image.data())[i] = values[i];
    }
    mem_.upload(data_, image.data(), image.size());
  }
  std::vector<double> get() const {
    std::vector<char> image(n_ * dtype_size(dtype_));
    mem_.download(image.data(), data_, image.size());
    std::vector<double> values(n_);
    for (size_t i = 0; i < n_; ++i) {
      if (dtype_ == DType::F32) values[i] = reinterpret_cast<const float*>(image.data())[i];
      else if (dtype_ == DType::BF16) values[i] = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(image.data())[i]);
      else values[i] = reinterpret_cast<const double*>(image.data())[i];
    }
    return values;
  }

 private:
  Memory& mem_;
  DType dtype_;
  size_t n_;
  void* data_;
};

// ---- Exactly representable inputs ---------------------------------------------------------

// Integers in [-range, range]; with range = 127 / n for sums, |partial sums| <= 127.
double value(int rank, size_t i, int range) { return double(int64_t((i * 5 + size_t(rank) * 11 + 3) % size_t(2 * range + 1)) - range); }
int sum_range() { return std::max(1, 127 / world_size()); }

std::vector<double> rank_values(int rank, size_t n, int range) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, i, range);
  return v;
}

// Sum over ranks of element i, and the average as the backends compute it (one
// rounded division; bf16: fp32 division then rounding to bf16).
double reduced(size_t i, ReduceOp op, DType t) {
  double sum = 0;
  for (int r = 0; r < world_size(); ++r) sum += value(r, i, sum_range());
  if (op == ReduceOp::Sum) return sum;
  if (t == DType::F64) return sum / world_size();
  const float avg = float(sum) / float(world_size());
  return t == DType::BF16 ? round_to_bf16(avg) : avg;
}

// Exact, except NCCL's average of floats on a rank count that is not a power of two: it
// pre-multiplies each input by 1/n, so allow n roundings of values up to sum_range().
double tolerance(CommBackend b, ReduceOp op, DType t) {
  const int n = world_size();
  if (b != CommBackend::Nccl || op != ReduceOp::Average || (n & (n - 1)) == 0) return 0;
  const double eps = t == DType::BF16 ? std::ldexp(1.0, -7) : t == DType::F32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -52);
  return n * eps * sum_range();
}

// ---- Fixture over backends and dtypes -------------------------------------------------------

struct Case {
  CommBackend backend;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(comm_backend_name(info.param.backend)) + "_" + dtype_name(info.param.dtype);
}

struct BackendState {
  std::unique_ptr<Memory> memory;
  std::unique_ptr<Communicator> comm;
  int gpu = -1;
};

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
        s.memory = std::make_unique<HostMemory>();
      } else {
#if defined(LLMHPC_WITH_CUDA)
        o.gpu = s.gpu = test::local_gpu();
        s.memory = std::make_unique<GpuMemory>(o.gpu);
        o.compute_stream = s.memory->compute_stream();
#endif
      }
      s.comm = make_communicator(o);
    }
    comm_ = s.comm.get();
    mem_ = s.memory.get();
    gpu_ = s.gpu;
  }

  // Collective: every rank learns the total, so rank 0 (the only one printing) reports a
  // failure seen on any rank.
  void expect_values(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int64_t wrong = 0, total = 0;
    size_t first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= tol) && wrong++ == 0) first = i;
    MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int first_rank = wrong ? world_rank() : world_size(), lowest = 0;
    MPI_Allreduce(&first_rank, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ(total, 0) << what << ": wrong elements on " << (total ? "rank " + std::to_string(lowest) : "no rank")
                        << (wrong ? "; here (rank " + std::to_string(world_rank()) + ") element " +
                                        std::to_string(first) + " is " + std::to_string(got[first]) + ", want " +
                                        std::to_string(want[first])
                                  : std::string());
  }

  CommBackend backend_ = CommBackend::Mpi;
  DType dtype_ = DType::F32;
  Communicator* comm_ = nullptr;
  Memory* mem_ = nullptr;
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
  const int me = world_rank(), range = sum_range();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average})
    for (size_t n : kCounts) {
      std::vector<double> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = reduced(i, op, dtype_);
      const std::string what = std::string("all_reduce ") + reduce_op_name(op) + " count " + std::to_string(n);
      TestBuffer send(*mem_, dtype_, n), recv(*mem_, dtype_, n);
      send.set(rank_values(me, n, range));
      recv.set(std::vector<double>(n, -1024));
      comm_->all_reduce(send.data(), recv.data(), n, dtype_, op);
      expect_values(recv.get(), want, tolerance(backend_, op, dtype_), what + " out of place");
      expect_values(send.get(), rank_values(me, n, range), 0, what + " leaves its input alone");
      comm_->all_reduce(send.data(), send.data(), n, dtype_, op);
      expect_values(send.get(), want, tolerance(backend_, op, dtype_), what + " in place");
    }
}

TEST_P(CommTest, ReduceScatterIsExact) {
  const int me = world_rank(), nranks = world_size(), range = sum_range();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average})
    for (size_t count : kCounts) {
      const size_t total = count * size_t(nranks);
      std::vector<double> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = reduced(size_t(me) * count + i, op, dtype_);
      const std::string what = std::string("reduce_scatter ") + reduce_op_name(op) + " count " + std::to_string(count);
      TestBuffer send(*mem_, dtype_, total), recv(*mem_, dtype_, count);
      send.set(rank_values(me, total, range));
      recv.set(std::vector<double>(count, -1024));
      comm_->reduce_scatter(send.data(), recv.data(), count, dtype_, op);
      expect_values(recv.get(), want, tolerance(backend_, op, dtype_), what + " out of place");
      // In place: the result lands in this rank's chunk of the input buffer.
      comm_->reduce_scatter(send.data(), send.at(size_t(me) * count), count, dtype_, op);
      std::vector<double> all = send.get();
      std::vector<double> chunk(all.begin() + long(size_t(me) * count), all.begin() + long(size_t(me + 1) * count));
      expect_values(chunk, want, tolerance(backend_, op, dtype_), what + " in place");
    }
}

TEST_P(CommTest, AllGatherIsExact) {
  const int me = world_rank(), nranks = world_size();
  for (size_t count : kCounts) {
    const size_t total = count * size_t(nranks);
    std::vector<double> want;
    for (int r = 0; r < nranks; ++r) {
      std::vector<double> part = rank_values(r, count, 127);
      want.insert(want.end(), part.begin(), part.end());
    }
    const std::string what = "all_gather count " + std::to_string(count);
    TestBuffer send(*mem_, dtype_, count), recv(*mem_, dtype_, total);
    send.set(rank_values(me, count, 127));
    recv.set(std::vector<double>(total, -1024));
    comm_->all_gather(send.data(), recv.data(), count, dtype_);
    expect_values(recv.get(), want, 0, what + " out of place");
    // In place: this rank's part already sits at its slot of the output.
    std::vector<double> image(total, -1024);
    for (size_t i = 0; i < count; ++i) image[size_t(me) * count + i] = value(me, i, 127);
    recv.set(image);
    comm_->all_gather(recv.at(size_t(me) * count), recv.data(), count, dtype_);
    expect_values(recv.get(), want, 0, what + " in place");
  }
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  const int me = world_rank();
  const size_t n = 1001;
  for (int root = 0; root < world_size(); ++root) {
    const std::string what = "broadcast from root " + std::to_string(root);
    TestBuffer send(*mem_, dtype_, n), recv(*mem_, dtype_, n);
    send.set(rank_values(me, n, 127));
    recv.set(std::vector<double>(n, -1024));
    comm_->broadcast(send.data(), recv.data(), n, dtype_, root);
    expect_values(recv.get(), rank_values(root, n, 127), 0, what + " out of place");
    expect_values(send.get(), rank_values(me, n, 127), 0, what + ": every input is kept");
    comm_->broadcast(send.data(), send.data(), n, dtype_, root);
    expect_values(send.get(), rank_values(root, n, 127), 0, what + " in place");
  }
}

// Several operations in flight at once, waited for in reverse order.
TEST_P(CommTest, AsyncHandlesCompleteInAnyOrder) {
  const int me = world_rank(), nranks = world_size(), range = sum_range();
  const size_t n = 4099;
  TestBuffer a(*mem_, dtype_, n), b(*mem_, dtype_, n), gathered(*mem_, dtype_, n * size_t(nranks)),
      mine(*mem_, dtype_, n);
  a.set(rank_values(me, n, range));
  b.set(rank_values(me, n, range));
  mine.set(rank_values(me, n, 127));
  std::vector<CommHandle> handles;
  handles.push_back(comm_->all_reduce_async(a.data(), a.data(), n, dtype_, ReduceOp::Sum));
  handles.push_back(comm_->all_gather_async(mine.data(), gathered.data(), n, dtype_));
  handles.push_back(comm_->all_reduce_async(b.data(), b.data(), n, dtype_, ReduceOp::Average));
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) {
    EXPECT_TRUE(it->pending());
    it->wait();
    EXPECT_FALSE(it->pending());
    it->wait();  // idempotent
  }
  std::vector<double> sum(n), avg(n), all;
  for (size_t i = 0; i < n; ++i) sum[i] = reduced(i, ReduceOp::Sum, dtype_), avg[i] = reduced(i, ReduceOp::Average, dtype_);
  for (int r = 0; r < nranks; ++r) {
    std::vector<double> part = rank_values(r, n, 127);
    all.insert(all.end(), part.begin(), part.end());
  }
  expect_values(a.get(), sum, 0, "async all_reduce sum");
  expect_values(b.get(), avg, tolerance(backend_, ReduceOp::Average, dtype_), "async all_reduce avg");
  expect_values(gathered.get(), all, 0, "async all_gather");
}

// A handle dropped without wait(): the result is there after synchronize().
TEST_P(CommTest, DroppedHandleStillCompletes) {
  const size_t n = 333;
  TestBuffer a(*mem_, dtype_, n);
  a.set(rank_values(world_rank(), n, sum_range()));
  { CommHandle dropped = comm_->all_reduce_async(a.data(), a.data(), n, dtype_, ReduceOp::Sum); }
  comm_->synchronize();
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = reduced(i, ReduceOp::Sum, dtype_);
  expect_values(a.get(), want, 0, "dropped all_reduce");
}

TEST_P(CommTest, GroupedOperations) {
  const int me = world_rank(), range = sum_range();
  const size_t n = 517;
  std::vector<std::unique_ptr<TestBuffer>> bufs;
  std::vector<CommHandle> handles;
  for (int k = 0; k < 3; ++k) {
    bufs.push_back(std::make_unique<TestBuffer>(*mem_, dtype_, n));
    bufs.back()->set(rank_values(me, n, range));
  }
  comm_->group_start();
  for (auto& b : bufs) handles.push_back(comm_->all_reduce_async(b->data(), b->data(), n, dtype_, ReduceOp::Sum));
  comm_->group_end();
  for (CommHandle& h : handles) h.wait();
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = reduced(i, ReduceOp::Sum, dtype_);
  for (auto& b : bufs) expect_values(b->get(), want, 0, "grouped all_reduce");
}

// nccl made without a compute stream (as the comm benchmark makes it): the caller has
// its inputs ready, and wait() blocks the host until the result is there.
TEST_P(CommTest, NcclWithoutComputeStream) {
  if (backend_ != CommBackend::Nccl) GTEST_SKIP() << "only nccl orders against a compute stream";
  CommOptions o;
  o.backend = CommBackend::Nccl;
  o.gpu = gpu_;
  std::unique_ptr<Communicator> standalone = make_communicator(o);
  const size_t n = 10007;
  TestBuffer a(*mem_, dtype_, n), gathered(*mem_, dtype_, n * size_t(world_size()));
  a.set(rank_values(world_rank(), n, sum_range()));
  standalone->all_reduce_async(a.data(), a.data(), n, dtype_, ReduceOp::Sum).wait();
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = reduced(i, ReduceOp::Sum, dtype_);
  expect_values(a.get(), want, 0, "all_reduce without a compute stream");
  standalone->all_gather(a.data(), gathered.data(), n, dtype_);
  std::vector<double> all;
  for (int r = 0; r < world_size(); ++r) all.insert(all.end(), want.begin(), want.end());
  expect_values(gathered.get(), all, 0, "all_gather without a compute stream");
}

TEST_P(CommTest, BarrierAndTimer) {
  comm_->barrier();
  auto timer = comm_->make_timer(2);
  const size_t n = 1 << 16;
  TestBuffer a(*mem_, dtype_, n);
  a.set(std::vector<double>(n, 1.0));
  timer->mark(0);
  CommHandle h = comm_->all_reduce_async(a.data(), a.data(), n, dtype_, ReduceOp::Sum);
  if (!comm_->stream_ordered()) h.wait();
  timer->mark(1);
  h.wait();
  comm_->synchronize();
  const double ms = timer->elapsed_ms(0, 1);
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 60e3);
  comm_->barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest,
                         ::testing::Values(Case{CommBackend::Mpi, DType::F32}, Case{CommBackend::Mpi, DType::BF16},
                                           Case{CommBackend::Mpi, DType::F64}, Case{CommBackend::Nccl, DType::F32},
                                           Case{CommBackend::Nccl, DType::BF16}, Case{CommBackend::Nccl, DType::F64}),
                         case_name);

// ---- The benchmark's size rules (comm/collectives.h) ------------------------------------------

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

}  // namespace
}  // namespace llmhpc

#include "comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "src/core/check.h"
#include "src/core/runtime.h"
#include "src/core/watchdog.h"

namespace llmhpc {
namespace {

// MPI_Op for bf16 sums: inout[i] = bf16(in[i] + inout[i]), added in fp32.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
}

// The second half of an average: `count` elements divided by n, rounded once.
void divide_in_place(void* data, size_t count, DType dtype, int n) {
  switch (dtype) {
    case DType::F32: {
      float* p = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= float(n);
      return;
    }
    case DType::F64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= double(n);
      return;
    }
    case DType::BF16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_bf16_bits(bf16_bits_to_float(p[i]) / float(n));
      return;
    }
    default: LLMHPC_FATAL(std::string("no collectives on dtype ") + dtype_name(dtype));
  }
}

// A non-blocking MPI collective (one request per chunk) and the host step that completes
// it (average division, moving an in-place reduce-scatter result). Never abandoned: the
// destructor waits. Complete for the watchdog when the requests are.
class MpiPendingOp final : public PendingOp {
 public:
  MpiPendingOp(std::vector<MPI_Request> requests, std::function<void()> finish, Watchdog::OpPtr watched)
      : requests_(std::move(requests)), finish_(std::move(finish)), watched_(std::move(watched)) {}
  ~MpiPendingOp() override { wait(); }
  void wait() override {
    if (done_) return;
    done_ = true;
    MPI_CHECK(MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    Watchdog::complete(watched_);
    if (finish_) finish_();
  }

 private:
  std::vector<MPI_Request> requests_;
  std::function<void()> finish_;
  Watchdog::OpPtr watched_;
  bool done_ = false;
};

// MPI's all-reduce of a large message allocates temporary buffers of about its size on
// every call, and glibc serves those with fresh mmap'ed pages whose page faults cost more
// than the reduction (1 GB on 2 ranks of an H200 host ran at 0.9 GB/s). Calls of at most
// 16 MiB keep the temporaries under glibc's mmap threshold (which grows to 32 MiB), so they
// are reused; this also lifts MPI's int limit on counts for all-reduce.
constexpr size_t kAllReduceChunkBytes = size_t(16) << 20;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent) {
    MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    world_ranks_ = world_ranks_of(comm_);
    MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_));
  }
  ~MpiCommunicator() override {
    MPI_Op_free(&bf16_sum_op_);
    MPI_Comm_free(&comm_);
  }

  std::string backend_name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return false; }
  bool stream_ordered() const override { return false; }

  CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return all_reduce_impl(send, recv, count, dtype, op, false);
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return reduce_scatter_impl(send, recv, count, dtype, op, false);
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    return all_gather_impl(send, recv, count, dtype, false);
  }
  CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) override {
    return broadcast_impl(send, recv, count, dtype, root, false);
  }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    all_reduce_impl(send, recv, count, dtype, op, true);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    reduce_scatter_impl(send, recv, count, dtype, op, true);
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    all_gather_impl(send, recv, count, dtype, true);
  }
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) override {
    broadcast_impl(send, recv, count, dtype, root, true);
  }

  CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) override {
    LLMHPC_CHECK(send != recv, "all_to_all is out of place");
    const int n = mpi_count(count);
    Watchdog::OpPtr watched = watch("alltoall", count * size_t(size_) * dtype_size(dtype));
    std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Ialltoall(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, request.data()));
    return complete(false, request, {}, std::move(watched));
  }

  // Each MPI operation starts when it is called; a group is only a bracket here.
  void group_start() override {}
  void group_end() override {}
  CommHandle enqueue_async(const std::function<void(void* stream)>& work) override {
    work(nullptr);
    return {};
  }
  void barrier() override {
    Watchdog::OpPtr watched = watch("barrier", 0);
    MPI_CHECK(MPI_Barrier(comm_));
    Watchdog::complete(watched);
  }
  // Nothing runs behind the host's back: an operation completes in its handle.
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer(int num_marks) override { return make_host_timer(num_marks); }

 private:
  // Every operation registers with the watchdog before its first MPI call (where a fault is
  // injected, too) and completes there when its MPI calls have.
  Watchdog::OpPtr watch(const char* name, uint64_t bytes) const {
    return Watchdog::instance().begin(name, "mpi", bytes, world_ranks_);
  }

  // Blocking: the MPI calls are done, so finish now. Async: finish when the requests are.
  static CommHandle complete(bool blocking, std::vector<MPI_Request> requests, std::function<void()> finish,
                             Watchdog::OpPtr watched) {
    if (!blocking)
      return CommHandle(std::make_unique<MpiPendingOp>(std::move(requests), std::move(finish), std::move(watched)));
    Watchdog::complete(watched);
    if (finish) finish();
    return {};
  }

  std::function<void()> average_step(void* data, size_t count, DType dtype, ReduceOp op) const {
    if (op != ReduceOp::Average) return {};
    const int n = size_;
    return [=] { divide_in_place(data, count, dtype, n); };
  }

  CommHandle all_reduce_impl(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool blocking) {
    const size_t es = dtype_size(dtype), chunk = std::max<size_t>(1, kAllReduceChunkBytes / es);
    Watchdog::OpPtr watched = watch("allreduce", count * es);
    std::vector<MPI_Request> requests;
    for (size_t first = 0; first < count; first += chunk) {
      const int n = mpi_count(std::min(chunk, count - first));
      char* out = static_cast<char*>(recv) + first * es;
      const void* in = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + first * es;
      if (blocking) {
        MPI_CHECK(MPI_Allreduce(in, out, n, mpi_type(dtype), sum_op(dtype), comm_));
      } else {
        requests.push_back(MPI_REQUEST_NULL);
        MPI_CHECK(MPI_Iallreduce(in, out, n, mpi_type(dtype), sum_op(dtype), comm_, &requests.back()));
      }
    }
    return complete(blocking, std::move(requests), average_step(recv, count, dtype, op), std::move(watched));
  }

  CommHandle reduce_scatter_impl(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool blocking) {
    const size_t chunk_bytes = count * dtype_size(dtype);
    const bool in_place = recv == static_cast<const char*>(send) + size_t(rank_) * chunk_bytes;
    // MPI's in-place form reads the whole input from the receive buffer and leaves this
    // rank's result at its start; NCCL's layout wants it at the rank's chunk: moved after.
    void* mpi_recv = in_place ? const_cast<void*>(send) : recv;
    const void* in = in_place ? MPI_IN_PLACE : send;
    Watchdog::OpPtr watched = watch("reducescatter", chunk_bytes * size_t(size_));
    std::vector<MPI_Request> request(blocking ? 0 : 1, MPI_REQUEST_NULL);
    if (blocking)
      MPI_CHECK(MPI_Reduce_scatter_block(in, mpi_recv, mpi_count(count), mpi_type(dtype), sum_op(dtype), comm_));
    else
      MPI_CHECK(MPI_Ireduce_scatter_block(in, mpi_recv, mpi_count(count), mpi_type(dtype), sum_op(dtype), comm_,
                                          request.data()));
    std::function<void()> average = average_step(recv, count, dtype, op);
    auto finish = [=] {
      if (mpi_recv != recv) std::memmove(recv, mpi_recv, chunk_bytes);
      if (average) average();
    };
    return complete(blocking, request, finish, std::move(watched));
  }

  CommHandle all_gather_impl(const void* send, void* recv, size_t count, DType dtype, bool blocking) {
    const size_t chunk_bytes = count * dtype_size(dtype);
    // MPI's in-place form takes this rank's contribution from its slot in recv, as NCCL's.
    const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * chunk_bytes;
    const void* in = in_place ? MPI_IN_PLACE : send;
    const int n = mpi_count(count);
    Watchdog::OpPtr watched = watch("allgather", chunk_bytes * size_t(size_));
    std::vector<MPI_Request> request(blocking ? 0 : 1, MPI_REQUEST_NULL);
    if (blocking) MPI_CHECK(MPI_Allgather(in, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_));
    else MPI_CHECK(MPI_Iallgather(in, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, request.data()));
    return complete(blocking, request, {}, std::move(watched));
  }

  CommHandle broadcast_impl(const void* send, void* recv, size_t count, DType dtype, int root, bool blocking) {
    LLMHPC_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " out of range");
    // MPI broadcasts in place: the root's data goes into its own recv first.
    if (rank_ == root && send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    Watchdog::OpPtr watched = watch("broadcast", count * dtype_size(dtype));
    std::vector<MPI_Request> request(blocking ? 0 : 1, MPI_REQUEST_NULL);
    if (blocking) MPI_CHECK(MPI_Bcast(recv, mpi_count(count), mpi_type(dtype), root, comm_));
    else MPI_CHECK(MPI_Ibcast(recv, mpi_count(count), mpi_type(dtype), root, comm_, request.data()));
    return complete(blocking, request, {}, std::move(watched));
  }

  static MPI_Datatype mpi_type(DType dtype) {
    switch (dtype) {
      case DType::F32: return MPI_FLOAT;
      case DType::F64: return MPI_DOUBLE;
      case DType::BF16: return MPI_UINT16_T;  // the bits; bf16_sum_op_ does the arithmetic
      default: LLMHPC_FATAL(std::string("no collectives on dtype ") + dtype_name(dtype));
    }
  }
  MPI_Op sum_op(DType dtype) const { return dtype == DType::BF16 ? bf16_sum_op_ : MPI_SUM; }

  // MPI counts are int.
  static int mpi_count(size_t count) {
    if (count > size_t(INT_MAX))
      throw UsageError("the mpi backend takes at most " + std::to_string(INT_MAX) + " elements per call (asked for " +
                       std::to_string(count) + ")");
    return int(count);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<const std::vector<int>> world_ranks_;  // for the watchdog (null: every world rank)
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm parent) {
  return std::make_unique<MpiCommunicator>(parent);
}

}  // namespace llmhpc

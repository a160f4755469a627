#include "comm/cuda/nccl_communicator.h"

#include <vector>

#include "comm/cuda/nccl_check.h"
#include "src/core/cuda/event_timer.h"

namespace llmhpc {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    default: LLMHPC_FATAL(std::string("no collectives on dtype ") + dtype_name(dtype));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclAvg; }

// Completion events for handles, reused: creating one per operation would cost host
// time in every call of a benchmark loop. Shared with the handles, which may outlive
// the communicator.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    if (free_.empty()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void give_back(cudaEvent_t e) { free_.push_back(e); }

 private:
  std::vector<cudaEvent_t> free_;
};

// wait(): the compute stream waits for the operation's completion event. Dropping the
// handle releases the event; the operation stays ordered on the communicator's stream.
class NcclPendingOp final : public PendingOp {
 public:
  NcclPendingOp(std::shared_ptr<EventPool> pool, cudaEvent_t done, cudaStream_t compute)
      : pool_(std::move(pool)), done_(done), compute_(compute) {}
  ~NcclPendingOp() override { pool_->give_back(done_); }
  void wait() override { CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0)); }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t done_;
  cudaStream_t compute_;
};

// Without a compute stream there is nothing to order: wait() blocks the host until the
// communicator's stream has finished this operation (and any issued after it).
class NcclHostWait final : public PendingOp {
 public:
  explicit NcclHostWait(cudaStream_t stream) : stream_(stream) {}
  void wait() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommOptions& o) : compute_(static_cast<cudaStream_t>(o.compute_stream)) {
    LLMHPC_CHECK(o.gpu >= 0, "the nccl communicator needs this rank's GPU");
    MPI_CHECK(MPI_Comm_dup(o.parent, &mpi_comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));
    CUDA_CHECK(cudaSetDevice(o.gpu));
    // Collectives run beside backward on this stream; at high priority their blocks take SMs
    // as soon as compute blocks retire instead of queueing behind the compute stream's kernels,
    // which otherwise fill the GPU (bf16 backward, docs/results/ddp.md).
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, mpi_comm_));
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  }
  ~NcclCommunicator() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    NCCL_CHECK(ncclCommDestroy(comm_));
    cudaEventDestroy(compute_ready_);
    cudaStreamDestroy(stream_);
    MPI_Comm_free(&mpi_comm_);
  }

  std::string backend_name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return true; }
  bool stream_ordered() const override { return true; }

  CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    after_compute();
    if (!copy_alone(send, recv, count, dtype))
      NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    return completion();
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    after_compute();
    if (!copy_alone(send, recv, count, dtype))
      NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    return completion();
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    after_compute();
    if (!copy_alone(send, recv, count, dtype))
      NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_));
    return completion();
  }
  CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) override {
    LLMHPC_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " out of range");
    after_compute();
    if (!copy_alone(send, recv, count, dtype))
      NCCL_CHECK(ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, stream_));
    return completion();
  }

  void group_start() override {
    NCCL_CHECK(ncclGroupStart());
    ++group_depth_;
  }
  // NCCL launches a group's operations here, so their completion events are recorded now.
  void group_end() override {
    LLMHPC_CHECK(group_depth_ > 0, "group_end() without group_start()");
    NCCL_CHECK(ncclGroupEnd());
    if (--group_depth_ > 0) return;
    for (cudaEvent_t e : group_events_) CUDA_CHECK(cudaEventRecord(e, stream_));
    group_events_.clear();
  }

  void barrier() override {
    synchronize();
    MPI_CHECK(MPI_Barrier(mpi_comm_));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  std::unique_ptr<Timer> make_timer(int num_marks) override { return make_event_timer(stream_, num_marks); }

 private:
  // On one rank every collective is a copy of `count` elements (an average over one rank is the
  // value itself), done here: NCCL 2.28's single-rank out-of-place average of fp64 left the
  // elements past the first 65536 untouched (H100, test_comm with one rank, 2026-11-23).
  bool copy_alone(const void* send, void* recv, size_t count, DType dtype) {
    if (size_ != 1) return false;
    if (send != recv)
      CUDA_CHECK(cudaMemcpyAsync(recv, send, count * dtype_size(dtype), cudaMemcpyDeviceToDevice, stream_));
    return true;
  }

  // The next operation starts after everything already enqueued on the compute stream
  // (which produced its inputs).
  void after_compute() {
    if (!compute_) return;
    CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  CommHandle completion() {
    if (!compute_) return CommHandle(std::make_unique<NcclHostWait>(stream_));
    cudaEvent_t done = events_->take();
    if (group_depth_ > 0) group_events_.push_back(done);  // the operation is launched at group_end()
    else CUDA_CHECK(cudaEventRecord(done, stream_));
    return CommHandle(std::make_unique<NcclPendingOp>(events_, done, compute_));
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  int group_depth_ = 0;
  std::vector<cudaEvent_t> group_events_;
};

}  // namespace

std::string nccl_version() {
  int v = 0;
  NCCL_CHECK(ncclGetVersion(&v));  // major * 10000 + minor * 100 + patch since 2.9
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

}  // namespace llmhpc

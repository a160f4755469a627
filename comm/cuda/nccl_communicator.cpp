#include "comm/cuda/nccl_communicator.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <vector>

#include "comm/cuda/bf16_wire.h"
#include "comm/cuda/nccl_check.h"
#include "comm/cuda/sum_parts.h"
#include "src/core/cuda/event_timer.h"
#include "src/core/watchdog.h"

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

// Completion events, reused: creating one per operation would cost host time in every call
// of a benchmark loop. An event is shared by its handle and the watchdog (which polls it
// from its thread) and goes back to the pool when both let go; the pool outlives both.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  std::shared_ptr<CUevent_st> take() {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) e = free_.back(), free_.pop_back();
    }
    if (!e) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::shared_ptr<EventPool> self = shared_from_this();
    return std::shared_ptr<CUevent_st>(e, [self](cudaEvent_t done) {
      std::lock_guard<std::mutex> lock(self->mutex_);
      self->free_.push_back(done);
    });
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// The watchdog's test of an operation's event: 1 complete, 0 not yet, -1 failed.
int poll_event(void* event) {
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
  return rc == cudaSuccess ? 1 : rc == cudaErrorNotReady ? 0 : -1;
}

// wait(): the compute stream waits for the operation's completion event. Dropping the
// handle releases the event; the operation stays ordered on the communicator's stream.
class NcclPendingOp final : public PendingOp {
 public:
  NcclPendingOp(std::shared_ptr<CUevent_st> done, cudaStream_t compute) : done_(std::move(done)), compute_(compute) {}
  void wait() override { CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0)); }

 private:
  std::shared_ptr<CUevent_st> done_;
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

// A buffer registered for the copy engines (Communicator::use_copy_engines), as an NCCL
// symmetric window on the zero-CTA communicator, with its reductions' scratch if it has one.
struct CopyEngines {
  char* buffer;
  size_t bytes;
  char* scratch;  // or null: all-gathers only
  size_t scratch_bytes;
  ncclWindow_t buffer_window = nullptr, scratch_window = nullptr;
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
    CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, o.gpu));
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
    // A blocking communicator, as PyTorch's default: its calls only enqueue, so a stuck
    // collective waits on the GPU, where the watchdog's thread sees it (its event) and ends the
    // job with MPI_Abort, which needs nothing from this thread (the watchdog calls no NCCL
    // while this thread may be inside NCCL: src/core/watchdog.h).
    // Non-blocking communicators (ncclConfig_t.blocking = 0) were measured slower: NCCL hands
    // each launch to a thread, and a 1 MB all-reduce on 2 H200 fell from 73 to 26 GB/s busbw
    // (docs/results/reliability.md).
    Watchdog& watchdog = Watchdog::instance();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    Watchdog::OpPtr init = watchdog.begin("ncclCommInitRank", "nccl", 0);
    settle(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    Watchdog::complete(init);
    monitors_.push_back(monitor(comm_));
  }
  ~NcclCommunicator() override {
    for (int m : monitors_)
      if (m >= 0) Watchdog::instance().remove_monitor(m);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (ce_comm_) {
      while (!ce_.empty()) stop_copy_engines(ce_.back().buffer);
      settle(ncclCommFinalize(ce_comm_), "ncclCommFinalize");
      NCCL_CHECK(ncclCommDestroy(ce_comm_));
    }
    settle(ncclCommFinalize(comm_), "ncclCommFinalize");
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
    Watchdog::OpPtr watched = watch("allreduce", count * dtype_size(dtype));
    std::function<void()> calls;
    if (!copy_alone(send, recv, count, dtype)) {
      const CopyEngines* ce = send == recv ? reducing_engines(recv, count * dtype_size(dtype), dtype) : nullptr;
      if (ce)
        calls = [=, ce = *ce] { copy_engine_reduce(ce, static_cast<char*>(recv), count, dtype, op, /*gather=*/true); };
      else settle(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_), "ncclAllReduce");
    }
    return completion(std::move(watched), std::move(calls));
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    after_compute();
    const size_t bytes = count * size_t(size_) * dtype_size(dtype);
    Watchdog::OpPtr watched = watch("reducescatter", bytes);
    std::function<void()> calls;
    if (!copy_alone(send, recv, count, dtype)) {
      const char* data = static_cast<const char*>(send);
      const bool in_place = static_cast<const char*>(recv) == data + size_t(rank_) * count * dtype_size(dtype);
      const CopyEngines* ce = in_place ? reducing_engines(data, bytes, dtype) : nullptr;
      if (ce)
        calls = [=, ce = *ce] {
          copy_engine_reduce(ce, const_cast<char*>(data), count * size_t(size_), dtype, op, /*gather=*/false);
        };
      else
        settle(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
               "ncclReduceScatter");
    }
    return completion(std::move(watched), std::move(calls));
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    after_compute();
    const size_t bytes = count * size_t(size_) * dtype_size(dtype);
    Watchdog::OpPtr watched = watch("allgather", bytes);
    std::function<void()> calls;
    if (!copy_alone(send, recv, count, dtype)) {
      const bool in_place =
          static_cast<const char*>(send) == static_cast<char*>(recv) + size_t(rank_) * count * dtype_size(dtype);
      // One NCCL call, but on the zero-CTA communicator: like the reductions, it runs after a group.
      if (in_place && registered(recv, bytes))
        calls = [=] { settle(ncclAllGather(send, recv, count, nccl_type(dtype), ce_comm_, stream_), "ncclAllGather"); };
      else settle(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAllGather");
    }
    return completion(std::move(watched), std::move(calls));
  }
  CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) override {
    LLMHPC_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " out of range");
    after_compute();
    Watchdog::OpPtr watched = watch("broadcast", count * dtype_size(dtype));
    if (!copy_alone(send, recv, count, dtype))
      settle(ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, stream_), "ncclBroadcast");
    return completion(std::move(watched));
  }

  CommHandle all_reduce_in_bf16_async(float* data, void* wire, size_t count, ReduceOp op) override {
    after_compute();
    Watchdog::OpPtr watched = watch("allreduce", count * 2);
    const CopyEngines* ce = reducing_engines(wire, count * 2, DType::BF16);
    return completion(std::move(watched), [=, ce = ce ? *ce : CopyEngines{}] {
      narrow_to_bf16(data, wire, count, sms_, stream_);
      if (ce.buffer) copy_engine_reduce(ce, static_cast<char*>(wire), count, DType::BF16, op, /*gather=*/true);
      else if (size_ > 1)
        settle(ncclAllReduce(wire, wire, count, ncclBfloat16, nccl_op(op), comm_, stream_), "ncclAllReduce");
      widen_from_bf16(wire, data, count, sms_, stream_);
    });
  }
  CommHandle reduce_scatter_in_bf16_async(float* data, void* wire, size_t count, ReduceOp op) override {
    after_compute();
    const size_t total = count * size_t(size_), mine = size_t(rank_) * count;
    Watchdog::OpPtr watched = watch("reducescatter", total * 2);
    const CopyEngines* ce = reducing_engines(wire, total * 2, DType::BF16);
    return completion(std::move(watched), [=, ce = ce ? *ce : CopyEngines{}] {
      char* bits = static_cast<char*>(wire);
      narrow_to_bf16(data, wire, total, sms_, stream_);
      if (ce.buffer) copy_engine_reduce(ce, bits, total, DType::BF16, op, /*gather=*/false);
      else if (size_ > 1)
        settle(ncclReduceScatter(bits, bits + mine * 2, count, ncclBfloat16, nccl_op(op), comm_, stream_),
               "ncclReduceScatter");
      widen_from_bf16(bits + mine * 2, data + mine, count, sms_, stream_);
    });
  }

  void group_start() override {
    NCCL_CHECK(ncclGroupStart());
    ++group_depth_;
  }
  // NCCL launches a group's operations here, so their completion events are recorded now.
  // Operations of several calls (the copy engines', a bf16 wire's) run here, after it, one after
  // another: each is a sequence of NCCL calls and kernels, which a group would reorder.
  void group_end() override {
    LLMHPC_CHECK(group_depth_ > 0, "group_end() without group_start()");
    settle(ncclGroupEnd(), "ncclGroupEnd");
    if (--group_depth_ > 0) return;
    for (Launch& l : group_launches_) {
      if (l.calls) l.calls();
      launch(l);
    }
    group_launches_.clear();
  }

  bool use_copy_engines(void* buffer, size_t bytes, void* scratch, size_t scratch_bytes) override {
    if (size_ == 1) return false;
    LLMHPC_CHECK(group_depth_ == 0, "use_copy_engines() inside a group");
    const char* begin = static_cast<const char*>(buffer);
    for (const CopyEngines& ce : ce_)
      LLMHPC_CHECK(begin + bytes <= ce.buffer || ce.buffer + ce.bytes <= begin,
                   "the copy engines use an overlapping buffer already (stop_copy_engines() first)");
    if (!ce_comm_) {
      // NCCL runs an all-to-all or all-gather between symmetric windows through the copy
      // engines only on a communicator with the zero-CTA policy (NCCL 2.28); this one does
      // nothing else, so every other collective keeps NCCL's default policy.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
      settle(ncclCommSplit(comm_, 0, rank_, &ce_comm_, &config), "ncclCommSplit");
      monitors_.push_back(monitor(ce_comm_));
    }
    synchronize();
    CopyEngines ce{static_cast<char*>(buffer), bytes, static_cast<char*>(scratch), scratch ? scratch_bytes : 0};
    settle(ncclCommWindowRegister(ce_comm_, buffer, bytes, &ce.buffer_window, NCCL_WIN_COLL_SYMMETRIC),
           "ncclCommWindowRegister");
    if (scratch)
      settle(ncclCommWindowRegister(ce_comm_, scratch, scratch_bytes, &ce.scratch_window, NCCL_WIN_COLL_SYMMETRIC),
             "ncclCommWindowRegister");
    ce_.push_back(ce);
    return true;
  }
  void stop_copy_engines(void* buffer) override {
    const auto ce = std::find_if(ce_.begin(), ce_.end(), [&](const CopyEngines& c) { return c.buffer == buffer; });
    if (ce == ce_.end()) return;
    synchronize();
    settle(ncclCommWindowDeregister(ce_comm_, ce->buffer_window), "ncclCommWindowDeregister");
    if (ce->scratch_window) settle(ncclCommWindowDeregister(ce_comm_, ce->scratch_window), "ncclCommWindowDeregister");
    ce_.erase(ce);
  }

  void barrier() override {
    synchronize();
    Watchdog::OpPtr watched = Watchdog::instance().begin("barrier", "mpi (host)", 0);
    MPI_CHECK(MPI_Barrier(mpi_comm_));
    Watchdog::complete(watched);
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

  // The registration holding [data, data + bytes), or null: where an in-place all-gather goes
  // through the copy engines.
  const CopyEngines* registered(const void* data, size_t bytes) const {
    const char* p = static_cast<const char*>(data);
    for (const CopyEngines& ce : ce_)
      if (ce.buffer <= p && p + bytes <= ce.buffer + ce.bytes) return &ce;
    return nullptr;
  }
  // Where an in-place reduction goes through them: a registration with a scratch, in a dtype
  // sum_parts adds (others take NCCL's kernels).
  const CopyEngines* reducing_engines(const void* data, size_t bytes, DType dtype) const {
    const CopyEngines* ce = registered(data, bytes);
    return ce && ce->scratch && (dtype == DType::F32 || dtype == DType::BF16) ? ce : nullptr;
  }

  // The copy engines' reduction of `count` elements at `data`, in place: part r is
  // [r * part, (r + 1) * part), part = count / size(). An all-to-all (zero-CTA) puts every rank's
  // part r side by side in rank r's scratch, which sums them into its part; an all-reduce then
  // all-gathers the sums (zero-CTA). The elements past size() parts go through NCCL's kernels.
  void copy_engine_reduce(const CopyEngines& ce, char* data, size_t count, DType dtype, ReduceOp op, bool gather) {
    const size_t es = dtype_size(dtype), part = count / size_t(size_), rest = count - part * size_t(size_);
    LLMHPC_CHECK(count * es <= ce.scratch_bytes, "the copy engines' scratch is smaller than the operation");
    char* mine = data + size_t(rank_) * part * es;
    if (part > 0) {
      settle(ncclAlltoAll(data, ce.scratch, part, nccl_type(dtype), ce_comm_, stream_), "ncclAlltoAll");
      sum_parts(mine, ce.scratch, part, size_, dtype, op == ReduceOp::Average ? 1.0f / float(size_) : 1.0f, sms_,
                stream_);
      if (gather) settle(ncclAllGather(mine, data, part, nccl_type(dtype), ce_comm_, stream_), "ncclAllGather");
    }
    if (rest > 0) {
      LLMHPC_CHECK(gather, "a reduce-scatter's count divides among the ranks");
      char* tail = data + part * size_t(size_) * es;
      settle(ncclAllReduce(tail, tail, rest, nccl_type(dtype), nccl_op(op), comm_, stream_), "ncclAllReduce");
    }
  }

  // The watchdog's monitor of one NCCL communicator: its asynchronous error. No abort: the
  // process's end ends the communicator's work (src/core/watchdog.h says why).
  int monitor(ncclComm_t comm) const {
    Watchdog& watchdog = Watchdog::instance();
    if (!watchdog.enabled()) return -1;
    int gpu = 0;
    CUDA_CHECK(cudaGetDevice(&gpu));
    Watchdog::Monitor m;
    m.error = [comm]() -> std::string {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
      if (rc != ncclSuccess) return std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(rc);
      if (state == ncclSuccess || state == ncclInProgress) return "";
      return std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(state) + " (" +
             ncclGetLastError(comm) + ")";
    };
    m.prepare = [gpu] { cudaSetDevice(gpu); };
    return watchdog.add_monitor(std::move(m));
  }

  // The next operation starts after everything already enqueued on the compute stream
  // (which produced its inputs).
  void after_compute() {
    if (!compute_) return;
    CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  // An NCCL call's result, with NCCL's last error message on failure.
  void settle(ncclResult_t rc, const char* call) {
    if (rc != ncclSuccess)
      fatal(__FILE__, __LINE__, call, std::string(ncclGetErrorString(rc)) + " (" + ncclGetLastError(comm_) + ")");
  }

  static Watchdog::OpPtr watch(const char* name, uint64_t bytes) {
    return Watchdog::instance().begin(name, "nccl", bytes);
  }

  // An operation's completion event, recorded after it on the communicator's stream, and the
  // watchdog's record of it.
  struct Launch {
    std::shared_ptr<CUevent_st> done;
    Watchdog::OpPtr watched;
    std::function<void()> calls;  // an operation of several calls and kernels, run before the event is recorded
  };
  void launch(const Launch& l) {
    CUDA_CHECK(cudaEventRecord(l.done.get(), stream_));
    Watchdog::launched(l.watched, l.done, poll_event);
  }

  // The handle, and the event the watchdog polls (one event serves both). An operation of
  // several calls (`calls`) runs now, or at group_end() inside a group.
  CommHandle completion(Watchdog::OpPtr watched, std::function<void()> calls = {}) {
    if (!compute_ && !watched && !calls) return CommHandle(std::make_unique<NcclHostWait>(stream_));
    Launch l{events_->take(), std::move(watched), std::move(calls)};
    std::shared_ptr<CUevent_st> done = l.done;
    if (group_depth_ > 0) {
      group_launches_.push_back(std::move(l));  // the operation is launched at group_end()
    } else {
      if (l.calls) l.calls();
      launch(l);
    }
    if (!compute_) return CommHandle(std::make_unique<NcclHostWait>(stream_));
    return CommHandle(std::make_unique<NcclPendingOp>(std::move(done), compute_));
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  int group_depth_ = 0;
  std::vector<Launch> group_launches_;
  std::vector<int> monitors_;  // the watchdog's monitors of comm_ and ce_comm_ (-1: none)
  int sms_ = 0;                // the GPU's multiprocessors: the grid of the sum and cast kernels
  // use_copy_engines(): the zero-CTA communicator, made at the first call and kept, and the
  // registered buffers while in use.
  ncclComm_t ce_comm_ = nullptr;
  std::vector<CopyEngines> ce_;
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

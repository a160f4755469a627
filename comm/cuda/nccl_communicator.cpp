#include "comm/cuda/nccl_communicator.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/cuda/nccl_check.h"
#include "comm/nccl_log.h"
#include "src/core/cuda/event_timer.h"
#include "src/core/runtime.h"
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

class NcclCopyEngines;

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommOptions& o) : compute_(static_cast<cudaStream_t>(o.compute_stream)) {
    LLMHPC_CHECK(o.gpu >= 0, "the nccl communicator needs this rank's GPU");
    MPI_CHECK(MPI_Comm_dup(o.parent, &mpi_comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));
    world_ranks_ = world_ranks_of(mpi_comm_);
    CUDA_CHECK(cudaSetDevice(o.gpu));
    // Collectives run beside backward on this stream; at high priority their blocks take SMs
    // as soon as compute blocks retire instead of queueing behind the compute stream's kernels,
    // which otherwise fill the GPU (bf16 backward, docs/results/ddp.md).
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    capture_nccl_log();  // before NCCL's first call reads its environment
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
    Watchdog::OpPtr init = watchdog.begin("ncclCommInitRank", "nccl", 0, world_ranks_);
    settle(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    Watchdog::complete(init);
    read_nccl_log();  // how NCCL connected this communicator's ranks
    monitors_.push_back(monitor(comm_));
  }
  ~NcclCommunicator() override;

  std::string backend_name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return true; }
  bool stream_ordered() const override { return true; }

  CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return issue("allreduce", count * dtype_size(dtype), [&] {
      if (!copy_alone(send, recv, count, dtype))
        settle(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_), "ncclAllReduce");
    });
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return issue("reducescatter", count * size_t(size_) * dtype_size(dtype), [&] {
      if (!copy_alone(send, recv, count, dtype))
        settle(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
               "ncclReduceScatter");
    });
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    return issue("allgather", count * size_t(size_) * dtype_size(dtype), [&] {
      if (!copy_alone(send, recv, count, dtype))
        settle(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAllGather");
    });
  }
  CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) override {
    LLMHPC_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " out of range");
    return issue("broadcast", count * dtype_size(dtype), [&] {
      if (!copy_alone(send, recv, count, dtype))
        settle(ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, stream_), "ncclBroadcast");
    });
  }
  CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) override {
    return issue("alltoall", count * size_t(size_) * dtype_size(dtype), [&] {
      if (!copy_alone(send, recv, count, dtype))
        settle(ncclAlltoAll(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAlltoAll");
    });
  }

  void group_start() override {
    NCCL_CHECK(ncclGroupStart());
    ++group_depth_;
  }
  // NCCL launches a group's operations here, so their completion events are recorded now.
  // A group's operations are timed as one span, around their launch.
  void group_end() override {
    LLMHPC_CHECK(group_depth_ > 0, "group_end() without group_start()");
    const cudaEvent_t start = group_depth_ == 1 ? span_start(/*launching_group=*/true) : nullptr;
    settle(ncclGroupEnd(), "ncclGroupEnd");
    if (--group_depth_ > 0) return;
    span_end(start, group_name(), group_bytes_);
    group_ops_.clear();
    group_bytes_ = 0;
    for (Launch& l : group_launches_) launch(l);
    group_launches_.clear();
  }

  // Not watched: the work waits for no other rank, and the operations around it are.
  CommHandle enqueue_async(const std::function<void(void* stream)>& work) override {
    LLMHPC_CHECK(group_depth_ == 0, "enqueue_async() inside a group");
    after_compute();
    const cudaEvent_t start = span_start();
    work(stream_);
    span_end(start, "stream work", 0);
    return completion(nullptr);
  }

  CopyEngines* copy_engines() override;

  void barrier() override {
    synchronize();
    Watchdog::OpPtr watched = Watchdog::instance().begin("barrier", "mpi (host)", 0, world_ranks_);
    MPI_CHECK(MPI_Barrier(mpi_comm_));
    Watchdog::complete(watched);
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  std::unique_ptr<Timer> make_timer(int num_marks) override { return make_event_timer(stream_, num_marks); }

  void time_operations(bool on) override {
    timing_ = on;
    if (on) return;
    for (const BusySpan& b : spans_) free_timing_.insert(free_timing_.end(), {b.start, b.end});
    spans_.clear();
  }
  bool busy_measured() const override { return timing_; }
  uint64_t busy_mark() const override { return spans_issued_; }
  std::vector<OperationSpan> take_busy_spans(uint64_t mark, const Timer* origin, int origin_mark) override {
    std::vector<OperationSpan> taken;
    const cudaEvent_t from = origin ? timer_event(*origin, origin_mark) : nullptr;
    if (from) CUDA_CHECK(cudaEventSynchronize(from));
    // Three calls a span: few, since they are taken where the host's time may count (mode ddp
    // and train take them while the device runs the next step: src/modes/step_timeline.h).
    for (; timing_ && !spans_.empty() && spans_.front().seq < mark; spans_.pop_front()) {
      const BusySpan& b = spans_.front();
      CUDA_CHECK(cudaEventSynchronize(b.end));
      float span = 0, start = 0;
      CUDA_CHECK(cudaEventElapsedTime(&span, b.start, b.end));
      if (from) CUDA_CHECK(cudaEventElapsedTime(&start, from, b.start));
      taken.push_back({b.name, b.bytes, double(start), double(start) + double(span)});
      free_timing_.insert(free_timing_.end(), {b.start, b.end});
    }
    return taken;
  }

 private:
  friend class NcclCopyEngines;

  // On one rank every collective is a copy of `count` elements (an average over one rank is the
  // value itself), done here: NCCL 2.28's single-rank out-of-place average of fp64 left the
  // elements past the first 65536 untouched (H100, test_comm with one rank, 2026-11-23).
  bool copy_alone(const void* send, void* recv, size_t count, DType dtype) {
    if (size_ != 1) return false;
    if (send != recv)
      CUDA_CHECK(cudaMemcpyAsync(recv, send, count * dtype_size(dtype), cudaMemcpyDeviceToDevice, stream_));
    return true;
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

  // One operation on the stream: after the compute stream's work, watched, timed, completed.
  CommHandle issue(const char* name, uint64_t bytes, const std::function<void()>& call, const char* backend = "nccl") {
    after_compute();
    Watchdog::OpPtr watched = watch(name, bytes, backend);
    const cudaEvent_t start = span_start();
    call();
    if (group_depth_ > 0) group_ops_.push_back(name), group_bytes_ += bytes;
    span_end(start, name, bytes);
    return completion(std::move(watched));
  }

  // Busy time (Communicator::time_operations): a timing event recorded on the stream before an
  // operation's call and one after it; nullptr and nothing recorded when not timing, or for an
  // operation inside a group, which is timed as a whole where group_end() launches it.
  cudaEvent_t span_start(bool launching_group = false) {
    if (!timing_ || (group_depth_ > 0 && !launching_group)) return nullptr;
    cudaEvent_t e = nullptr;
    if (!free_timing_.empty()) e = free_timing_.back(), free_timing_.pop_back();
    else CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, stream_));
    return e;
  }
  void span_end(cudaEvent_t start, std::string name, uint64_t bytes) {
    if (!start) return;
    const cudaEvent_t end = span_start(/*launching_group=*/true);
    spans_.push_back({spans_issued_++, start, end, std::move(name), bytes});
  }
  // A group's span: "allgather x4", or its operations' names joined by "+" where they differ.
  std::string group_name() const {
    if (group_ops_.empty()) return "group";
    if (std::all_of(group_ops_.begin(), group_ops_.end(),
                    [&](const char* n) { return std::string_view(n) == group_ops_[0]; }))
      return group_ops_.size() == 1 ? group_ops_[0]
                                    : group_ops_[0] + std::string(" x") + std::to_string(group_ops_.size());
    std::string joined;
    for (const char* n : group_ops_) joined += (joined.empty() ? "" : "+") + std::string(n);
    return joined;
  }

  // An NCCL call's result, with NCCL's last error message on failure.
  void settle(ncclResult_t rc, const char* call) {
    if (rc != ncclSuccess)
      fatal(__FILE__, __LINE__, call, std::string(ncclGetErrorString(rc)) + " (" + ncclGetLastError(comm_) + ")");
  }

  Watchdog::OpPtr watch(const char* name, uint64_t bytes, const char* backend = "nccl") const {
    return Watchdog::instance().begin(name, backend, bytes, world_ranks_);
  }

  // An operation's completion event, recorded after it on the communicator's stream, and the
  // watchdog's record of it.
  struct Launch {
    std::shared_ptr<CUevent_st> done;
    Watchdog::OpPtr watched;
  };
  void launch(const Launch& l) {
    CUDA_CHECK(cudaEventRecord(l.done.get(), stream_));
    Watchdog::launched(l.watched, l.done, poll_event);
  }

  // The handle, and the event the watchdog polls (one event serves both).
  CommHandle completion(Watchdog::OpPtr watched) {
    if (!compute_ && !watched) return CommHandle(std::make_unique<NcclHostWait>(stream_));
    Launch l{events_->take(), std::move(watched)};
    std::shared_ptr<CUevent_st> done = l.done;
    if (group_depth_ > 0) group_launches_.push_back(std::move(l));  // the operation is launched at group_end()
    else launch(l);
    if (!compute_) return CommHandle(std::make_unique<NcclHostWait>(stream_));
    return CommHandle(std::make_unique<NcclPendingOp>(std::move(done), compute_));
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<const std::vector<int>> world_ranks_;  // for the watchdog (null: every world rank)
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  int group_depth_ = 0;
  std::vector<Launch> group_launches_;
  struct BusySpan {
    uint64_t seq;  // the operation's place among those timed
    cudaEvent_t start, end;
    std::string name;
    uint64_t bytes;
  };
  std::vector<const char*> group_ops_;  // the names of the operations in the open group
  uint64_t group_bytes_ = 0;
  bool timing_ = false;
  uint64_t spans_issued_ = 0;
  std::deque<BusySpan> spans_;                     // recorded, not taken yet, in issue order
  std::vector<cudaEvent_t> free_timing_;           // timing events to reuse
  std::vector<int> monitors_;                      // the watchdog's monitors of comm_ and the copy engines' (-1: none)
  std::unique_ptr<NcclCopyEngines> copy_engines_;  // made at the first copy_engines()
};

// The copy engines: NCCL runs an all-to-all or all-gather between symmetric windows through
// them only on a communicator with the zero-CTA policy (NCCL 2.28); this one, split from the
// NcclCommunicator's, does nothing else, so every other collective keeps NCCL's default
// policy. Its calls go on the NcclCommunicator's stream, through its ordering and completion.
class NcclCopyEngines final : public CopyEngines {
 public:
  explicit NcclCopyEngines(NcclCommunicator& c) : c_(c) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    c_.settle(ncclCommSplit(c_.comm_, 0, c_.rank_, &comm_, &config), "ncclCommSplit");
    c_.monitors_.push_back(c_.monitor(comm_));
  }
  ~NcclCopyEngines() override {
    while (!windows_.empty()) deregister_window(windows_.back().begin);
    c_.settle(ncclCommFinalize(comm_), "ncclCommFinalize");
    NCCL_CHECK(ncclCommDestroy(comm_));
  }

  void register_window(void* buffer, size_t bytes) override {
    LLMHPC_CHECK(c_.group_depth_ == 0, "register_window() inside a group");
    const char* begin = static_cast<const char*>(buffer);
    for (const Window& w : windows_)
      LLMHPC_CHECK(begin + bytes <= w.begin || w.begin + w.bytes <= begin,
                   "a window overlaps one registered already (deregister_window() first)");
    c_.synchronize();
    Window w{static_cast<char*>(buffer), bytes};
    c_.settle(ncclCommWindowRegister(comm_, buffer, bytes, &w.window, NCCL_WIN_COLL_SYMMETRIC),
              "ncclCommWindowRegister");
    windows_.push_back(w);
  }
  void deregister_window(void* buffer) override {
    const auto w = std::find_if(windows_.begin(), windows_.end(), [&](const Window& x) { return x.begin == buffer; });
    if (w == windows_.end()) return;
    c_.synchronize();
    c_.settle(ncclCommWindowDeregister(comm_, w->window), "ncclCommWindowDeregister");
    windows_.erase(w);
  }

  CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t part = count * dtype_size(dtype);
    LLMHPC_CHECK(send == static_cast<const char*>(recv) + size_t(c_.rank_) * part,
                 "the copy engines' all-gather is in place");
    return issue("allgather", recv, recv, part * size_t(c_.size_), [&] {
      c_.settle(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, c_.stream_), "ncclAllGather");
    });
  }
  CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) override {
    return issue("alltoall", send, recv, count * size_t(c_.size_) * dtype_size(dtype), [&] {
      c_.settle(ncclAlltoAll(send, recv, count, nccl_type(dtype), comm_, c_.stream_), "ncclAlltoAll");
    });
  }

 private:
  struct Window {
    char* begin;
    size_t bytes;
    ncclWindow_t window = nullptr;
  };
  bool in_window(const void* data, size_t bytes) const {
    const char* p = static_cast<const char*>(data);
    for (const Window& w : windows_)
      if (w.begin <= p && p + bytes <= w.begin + w.bytes) return true;
    return false;
  }
  // One NCCL call of `bytes` from `send`'s window into `recv`'s, ordered and completed as the
  // NcclCommunicator's own operations, outside its groups: a group would launch it with the
  // other communicator's collectives.
  CommHandle issue(const char* name, const void* send, void* recv, size_t bytes, const std::function<void()>& call) {
    LLMHPC_CHECK(c_.group_depth_ == 0, "a copy-engine collective inside a group");
    LLMHPC_CHECK(in_window(send, bytes) && in_window(recv, bytes), "a copy-engine collective outside the windows");
    return c_.issue(name, bytes, call, "nccl (copy engines)");
  }

  NcclCommunicator& c_;
  ncclComm_t comm_ = nullptr;
  std::vector<Window> windows_;
};

NcclCommunicator::~NcclCommunicator() {
  for (int m : monitors_)
    if (m >= 0) Watchdog::instance().remove_monitor(m);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  copy_engines_.reset();
  settle(ncclCommFinalize(comm_), "ncclCommFinalize");
  NCCL_CHECK(ncclCommDestroy(comm_));
  cudaEventDestroy(compute_ready_);
  time_operations(false);
  for (cudaEvent_t e : free_timing_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
  MPI_Comm_free(&mpi_comm_);
}

CopyEngines* NcclCommunicator::copy_engines() {
  if (size_ == 1) return nullptr;
  LLMHPC_CHECK(group_depth_ == 0, "copy_engines() inside a group");
  if (!copy_engines_) copy_engines_ = std::make_unique<NcclCopyEngines>(*this);
  return copy_engines_.get();
}

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

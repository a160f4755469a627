// The Communicator interface: the collectives every distributed feature (DDP, optimizer
// sharding, the comm benchmark) is written against, and the one factory that makes one.
// Primitives only: what is composed of them (gradients through a bf16 wire, reductions through
// the copy engines) is src/dist's, as PyTorch keeps bf16_compress_hook in DDP.
//
// Two implementations:
//   mpi  (comm/mpi/mpi_communicator.cpp)       host buffers; the CPU baseline (what Gloo is to PyTorch).
//   nccl (comm/cuda/nccl_communicator.cpp) device buffers; stream-ordered on its own stream.
//
// Buffer conventions (the same as NCCL's, so code moves between backends unchanged):
//   all_reduce      send, recv: `count` elements each. In place: send == recv.
//   reduce_scatter  send: count * size() elements, recv: `count`. Rank r gets the reduced
//                   chunk [r*count, (r+1)*count). In place: recv == send + rank() * count.
//   all_gather      send: `count` elements, recv: count * size(); rank r's send lands at
//                   recv + r*count. In place: send == recv + rank() * count.
//   broadcast       root's send is copied to every rank's recv (`count` elements); send is
//                   read on the root only. In place: send == recv.
//   all_to_all      send, recv: count * size() elements each; rank r's chunk j of send lands
//                   in rank j's chunk r of recv. Out of place only.
// Sizes that do not divide by the rank count are the caller's business: reduce_scatter and
// all_gather take the per-rank count (see comm/collectives.h for what the benchmark does).
//
// Asynchrony: every collective has an *_async form that returns a CommHandle. What wait()
// guarantees depends on where the backend runs (stream_ordered()):
//   mpi:  the operation is complete on the host when wait() returns.
//   nccl: the operation is enqueued on the communicator's stream, after all work already
//         enqueued on the compute stream (a CUDA event orders them), and wait() makes the
//         compute stream wait for it: later compute work sees the result, the host does not
//         block. synchronize() blocks the host. Made without a compute stream (a benchmark
//         with no compute work), an operation is only the NCCL call, as in nccl-tests: the
//         caller has its inputs ready before issuing it, and wait() blocks the host.
// The blocking forms (all_reduce, ...) are the async form followed by wait().
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "src/core/attrs.h"
#include "src/core/dtype.h"
#include "src/core/timer.h"

namespace llmhpc {

enum class ReduceOp { Sum, Average };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg" (as nccl-tests names them)

// What a backend returns for an operation in flight. Implementations finish the
// operation's bookkeeping in their destructor (mpi: an operation is never abandoned, so
// a handle dropped without wait() completes it there; nccl: it stays ordered on the
// communicator's stream and only the event is released).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
};

// A handle on an asynchronous collective. Move-only; wait() is idempotent.
class CommHandle {
 public:
  CommHandle() = default;  // nothing pending
  explicit CommHandle(std::unique_ptr<PendingOp> op) : op_(std::move(op)) {}
  void wait() {
    if (op_) op_->wait();
    op_.reset();
  }
  bool pending() const { return op_ != nullptr; }

 private:
  std::unique_ptr<PendingOp> op_;
};

// Collectives that move bytes with the GPUs' copy engines instead of NCCL's kernels (NCCL's
// zero-CTA policy, on a communicator of their own that shares the Communicator's ranks and
// stream, so they are ordered among its operations as its own are). NCCL's kernels hold their
// SMs for a whole transfer, and one such block beside a persistent GEMM slows it by up to a
// fifth (docs/results/ddp.md); these leave the SMs to compute. They work between windows:
// memory from Allocator::allocate_shareable, one node's ranks only, registered by every rank
// with buffers of the same sizes (collective), none overlapping another. Not inside a group of
// the Communicator's. Layouts as the Communicator's (comm/communicator.h).
class CopyEngines {
 public:
  virtual ~CopyEngines() = default;
  // Until deregister_window(buffer), which must come before the buffer is freed.
  virtual void register_window(void* buffer, size_t bytes) = 0;
  virtual void deregister_window(void* buffer) = 0;
  // In place in a window: send == recv + rank() * count.
  virtual CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) = 0;
  // From a window into another (or another part of the same).
  virtual CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) = 0;
};

// One operation of a communicator as its stream ran it (Communicator::take_busy_spans).
struct OperationSpan {
  std::string name;    // "allreduce", ...; "allgather x4" for a group of four; "stream work" (enqueue_async)
  uint64_t bytes = 0;  // the payload, as the watchdog names it (0 for stream work)
  double start_ms = 0, end_ms = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string backend_name() const = 0;  // "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // true: buffers must be device memory of this rank's GPU (nccl); false: host memory.
  virtual bool device_buffers() const = 0;
  // true: operations run in order on a device stream (see the header comment).
  virtual bool stream_ordered() const = 0;

  virtual CommHandle all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual CommHandle reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual CommHandle all_gather_async(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual CommHandle broadcast_async(const void* send, void* recv, size_t count, DType dtype, int root) = 0;
  virtual CommHandle all_to_all_async(const void* send, void* recv, size_t count, DType dtype) = 0;

  // Blocking forms. A backend overrides them where it has a faster blocking call (MPI's
  // blocking collectives use better algorithms than its non-blocking ones).
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    all_reduce_async(send, recv, count, dtype, op).wait();
  }
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    reduce_scatter_async(send, recv, count, dtype, op).wait();
  }
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) {
    all_gather_async(send, recv, count, dtype).wait();
  }
  virtual void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
    broadcast_async(send, recv, count, dtype, root).wait();
  }

  // Operations between group_start() and group_end() are launched together (nccl:
  // ncclGroupStart/End, which fuses them; mpi: each starts at once, so a group is only a
  // bracket). Wait on their handles after group_end().
  virtual void group_start() = 0;
  virtual void group_end() = 0;

  // Work of the caller's (casts, sums) ordered among this communicator's operations, so that
  // the compute stream does not pay for it. nccl: `work` enqueues on the stream it is given
  // (the communicator's), after the compute stream's work as a collective is, and wait() orders
  // the compute stream after it; not inside a group, which launches its collectives at
  // group_end(), after the work. mpi: `work` runs now on the host, given nullptr: an operation
  // it reads is complete first.
  virtual CommHandle enqueue_async(const std::function<void(void* stream)>& work) = 0;

  // The copy-engine collectives of this communicator's ranks (see CopyEngines), made at the
  // first call (collective: every rank calls it) and kept; null where there are none: the mpi
  // backend, one rank.
  virtual CopyEngines* copy_engines() { return nullptr; }

  // Every rank arrives, after its own issued operations are complete.
  virtual void barrier() = 0;
  // The host waits until every operation this rank issued is complete (nccl: the
  // communicator's stream; mpi: nothing to do, an operation completes in its handle).
  virtual void synchronize() = 0;

  // Marks in the order of this communicator's operations (src/core/timer.h): CUDA events on
  // its stream (nccl), the host clock (mpi). On the same clock as the compute device's timer.
  virtual std::unique_ptr<Timer> make_timer(int num_marks) = 0;

  // Busy time: the device time of this communicator's operations (collectives, and work
  // enqueued with enqueue_async), each from when its stream reached it (its inputs ready, the
  // operations before it done) to its end. That is a collective's own time, its wait for the
  // other ranks included, what the ring model predicts and what Nsight draws on the stream,
  // whether or not compute hid it. Counted while time_operations(true) holds (off by default:
  // two timing events an operation); busy_mark() names the operations issued so far, and
  // take_busy_spans(mark, ...) returns those issued before `mark` not taken yet, waiting for
  // them to finish (take them where the host would wait for the device anyway: a wait between
  // two steps holds the next one back). Nothing where nothing measures it (busy_measured()
  // false): the mpi backend, whose operations have no stream and progress inside the host's MPI
  // calls.
  virtual void time_operations(bool /*on*/) {}
  virtual bool busy_measured() const { return false; }
  virtual uint64_t busy_mark() const { return 0; }
  // Each span's start and end in ms from mark `origin_mark` of `origin`, a timer on the same
  // device's clock (the compute stream's: a timeline of the step); without `origin` each starts at 0.
  virtual std::vector<OperationSpan> take_busy_spans(uint64_t /*mark*/, const Timer* /*origin*/ = nullptr,
                                                     int /*origin_mark*/ = 0) {
    return {};
  }
  // The spans' summed duration; NaN where busy time is not measured.
  double take_busy_ms(uint64_t mark);
};

enum class CommBackend { Mpi, Nccl };
const char* comm_backend_name(CommBackend backend);

struct CommOptions {
  CommBackend backend = CommBackend::Mpi;
  MPI_Comm parent = MPI_COMM_WORLD;  // the ranks taking part (duplicated, never used directly)
  int gpu = -1;                      // nccl: this rank's GPU
  void* compute_stream = nullptr;    // nccl: cudaStream_t producing inputs and using results (nullptr: none)
};

// Collective over `parent`: every rank calls it with the same backend. Throws UsageError
// when the backend is not compiled in.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options);

// Whether this build has the NCCL backend (the only place that knows is communicator.cpp).
bool nccl_compiled();

// The communication libraries this binary runs with: mpi_library_version
// (MPI_Get_library_version's first line) and, where built, nccl_version.
std::vector<std::pair<std::string, std::string>> comm_library_versions();
// For the rank files' root attributes: comm_library_versions() and environment_variables
// (launch_settings of this process's environment).
Attrs comm_environment();

// The variables of `env` (a NULL-terminated "NAME=value" array, as environ) that change how
// ranks are placed and how they communicate, sorted, one "NAME=value" per line: NCCL_*,
// OMPI_MCA_* (but mpirun's own wiring of the job: OMPI_MCA_orte_*, _ess*, _pmix, _initial_wdir,
// _shmem_RUNTIME_QUERY_hint), UCX_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS and Slurm's job, task and
// node counts. Without them a busbw or a step time cannot be reproduced (NCCL_ALGO, NCCL_P2P_DISABLE
// and NCCL_MAX_CTAS change both).
std::string launch_settings(const char* const* env);

}  // namespace llmhpc

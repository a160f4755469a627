// The collective benchmark's harness, nccl-tests' src/common.cu made with llmhpc's
// communicators: where a communicator's buffers live and how the host reads and writes them,
// the timing loop, and one run checked on verifiable data (comm/verifiable.h). Mode comm and
// the collective tests use it; nothing here knows their options, so a DDP benchmark can time
// its own operations with the same loop on the same buffers.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/verifiable.h"
#include "src/core/allocator.h"

namespace llmhpc {

// Where a communicator's buffers live: the memory it needs (Communicator::device_buffers())
// and the host's way in and out. Comm cannot see a compute Device (kernels/), so whoever has
// one implements this over it; HostBufferSpace is plain host memory.
class BufferSpace {
 public:
  virtual ~BufferSpace() = default;
  virtual Allocator& allocator() = 0;
  // Host bytes into a buffer. May be asynchronous: `host` must stay valid until settle().
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  // Every upload is done: operations issued afterwards see the data.
  virtual void settle() = 0;
  // Buffer bytes to the host, there when it returns. Sees an operation's result once the
  // operation is complete for this space's copies: after comm.synchronize(), or after its
  // handle's wait() where the copies run on the communicator's compute stream.
  virtual void download(void* host, const void* src, size_t bytes) = 0;
};

class HostBufferSpace final : public BufferSpace {
 public:
  explicit HostBufferSpace(size_t capacity_bytes) : allocator_(capacity_bytes) {}
  Allocator& allocator() override { return allocator_; }
  void upload(void* dst, const void* host, size_t bytes) override;
  void settle() override {}
  void download(void* host, const void* src, size_t bytes) override;

 private:
  HostAllocator allocator_;
};

// The send and recv buffers of an operation, largest_buffer_elements each (make_call's
// layout for either placement). Throws OutOfMemory.
struct CallBuffers {
  Buffer send, recv;
  CallBuffers() = default;
  CallBuffers(BufferSpace& space, const Operation& op, int nranks);
};

// The form the benchmark issues operations in: blocking where the host completes them anyway
// (mpi: its blocking collectives are faster than its non-blocking ones), async where they
// queue on a stream (nccl), so that the host goes on to enqueue the next one.
bool issue_blocking(const Communicator& comm);

// Per operation: a mark between consecutive operations. Back to back: a mark before the
// first and after the last only, nccl-tests' measurement. At small sizes the host's enqueue
// rate limits nccl, and the marks between operations add to it (2-3 us per 1 MB all-reduce
// on H200s, docs/results/comm.md): per-operation times are for the spread, the back-to-back
// mean is what the benchmark's table shows.
enum class Timing { PerOperation, BackToBack };

// Runs `operation` (which issues one or more collectives and returns the handle of the last)
// `n` times after a barrier, timed on the communicator's own timeline (its make_timer: CUDA
// events on its stream for nccl, the host clock for mpi), and returns microseconds: the n
// times of each (PerOperation), or the mean per operation (BackToBack, one value). Nothing
// for n = 0. Collective.
std::vector<double> time_operations(Communicator& comm, int64_t n, Timing timing,
                                    const std::function<CommHandle()>& operation);
// `call` issued in the benchmark's form (issue_blocking).
std::vector<double> time_call(Communicator& comm, const Call& call, int64_t n, Timing timing);

// `send` and `recv` below are the two buffers make_call lays the call out on.

// v's inputs into the buffers, settled: ready for what is issued afterwards.
void upload_inputs(BufferSpace& space, const Verifiable& v, void* send, void* recv);
// Downloads this rank's result from `recv` and compares it; call once the operation is
// complete for the space (see BufferSpace::download).
Mismatch check_result(BufferSpace& space, const Verifiable& v, const void* recv);
// One run of v's operation on its inputs, issued blocking or async and complete on the host
// before the result is checked: upload_inputs, issue, wait, synchronize, check_result.
Mismatch check_once(Communicator& comm, BufferSpace& space, const Verifiable& v, void* send, void* recv, bool blocking);

// A tiny all-reduce whose answer every rank knows, so a broken transport shows before a
// sweep: "" when right, else what it gave. Collective.
std::string sanity_all_reduce(Communicator& comm, BufferSpace& space);

}  // namespace llmhpc

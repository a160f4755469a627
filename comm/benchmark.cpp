// The collective benchmark's harness (comm/benchmark.h).
#include "comm/benchmark.h"

#include <cstring>

#include "src/core/table.h"
#include "src/core/watchdog.h"

namespace llmhpc {

void HostBufferSpace::upload(void* dst, const void* host, size_t bytes) { std::memcpy(dst, host, bytes); }

void HostBufferSpace::download(void* host, const void* src, size_t bytes) { std::memcpy(host, src, bytes); }

CallBuffers::CallBuffers(BufferSpace& space, const Operation& op, int nranks) {
  const Shape shape{int64_t(largest_buffer_elements(op.collective, op.count, nranks))};
  send = Buffer(space.allocator(), op.dtype, shape, "comm.send");
  recv = Buffer(space.allocator(), op.dtype, shape, "comm.recv");
}

bool issue_blocking(const Communicator& comm) { return !comm.stream_ordered(); }

std::vector<double> time_operations(Communicator& comm, int64_t n, Timing timing,
                                    const std::function<CommHandle()>& operation) {
  if (n == 0) return {};
  const bool each = timing == Timing::PerOperation;
  auto timer = comm.make_timer(each ? int(n) + 1 : 2);
  comm.barrier();  // ranks start together
  CommHandle last;
  timer->mark(0);
  Watchdog& watchdog = Watchdog::instance();
  for (int64_t k = 0; k < n; ++k) {
    watchdog.set_step(k);  // the iteration, for a watchdog report
    if (each && k > 0) timer->mark(int(k));
    last = operation();
  }
  timer->mark(each ? int(n) : 1);
  last.wait();
  comm.synchronize();
  if (!each) return {timer->elapsed_ms(0, 1) * 1e3 / double(n)};
  std::vector<double> times_us;
  for (int64_t k = 0; k < n; ++k) times_us.push_back(timer->elapsed_ms(int(k), int(k) + 1) * 1e3);
  return times_us;
}

std::vector<double> time_call(Communicator& comm, const Call& call, int64_t n, Timing timing) {
  const bool blocking = issue_blocking(comm);
  return time_operations(comm, n, timing, [&] { return issue(comm, call, blocking); });
}

void upload_inputs(BufferSpace& space, const Verifiable& v, void* send, void* recv) {
  if (!v.send.empty()) space.upload(send, v.send.data(), v.send.size());
  space.upload(recv, v.recv.data(), v.recv.size());
  space.settle();
}

Mismatch check_result(BufferSpace& space, const Verifiable& v, const void* recv) {
  std::vector<char> image(v.recv.size());
  space.download(image.data(), recv, image.size());
  return count_wrong(v, image);
}

Mismatch check_once(Communicator& comm, BufferSpace& space, const Verifiable& v, void* send, void* recv,
                    bool blocking) {
  upload_inputs(space, v, send, recv);
  issue(comm, make_call(v.op, v.rank, send, recv), blocking).wait();
  comm.synchronize();
  return check_result(space, v, recv);
}

std::string sanity_all_reduce(Communicator& comm, BufferSpace& space) {
  Operation op;
  op.count = 8;
  op.placement = Placement::InPlace;
  Buffer buf(space.allocator(), op.dtype, Shape{int64_t(op.count)}, "comm.sanity");
  const Verifiable v = make_verifiable(op, comm.rank(), comm.size(), average_rounding(comm));
  const Mismatch m = check_once(comm, space, v, buf.tensor().data, buf.tensor().data, false);
  if (m.count == 0) return "";
  return "start-up sanity all-reduce (" + comm.backend_name() + ") gave " + fmt(m.got) + " at element " +
         std::to_string(m.first) + ", expected " + fmt(m.expected);
}

}  // namespace llmhpc

// A host emulation of the CUDA execution model, just large enough to run the kernels of this
// folder on a CPU: with LLMHPC_FLASH_EMULATE defined, utils.cuh takes its PTX wrappers
// (cp.async, ldmatrix, mma.sync) from here, and the kernel templates compile as ordinary C++.
// tests/unit/test_flash_cpu.cpp uses it to check the kernels' indexing (fragment layouts,
// masks, tile loops, bounds) against the CPU reference on machines without a GPU.
//
// Model: blocks run one after another; the threads of a block are fibers (ucontext) on the
// calling thread, each run until it waits at a barrier, then the next (not OS threads, which
// would wake each other through the kernel at every warp barrier); a block barrier is
// __syncthreads, a per-warp barrier is __syncwarp; warp collectives (shuffles, ldmatrix, mma)
// exchange through per-warp scratch between two warp barriers. cp.async
// copies land when the wait_group that covers them returns. Shared memory is one static
// buffer, filled with 0xff bytes (NaN) before each block, so a read of shared memory nothing
// wrote (or before its copy was waited for) shows up as NaN.
// ldmatrix and mma follow the PTX ISA's fragment layouts (see utils.cuh). What this cannot
// show: races, timing, and whether the real instructions behave as documented.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n)
#define __shared__

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

namespace llmhpc::flash {

constexpr size_t kEmulatedSharedBytes = 192 * 1024;           // the fused backward takes up to 178 KiB
alignas(16) inline unsigned char smem[kEmulatedSharedBytes];  // the kernels' `extern __shared__ smem[]`

// The fiber running now and the scheduler's context it yields to (emulate_launch's).
inline thread_local ucontext_t* emu_fiber = nullptr;
inline thread_local ucontext_t* emu_scheduler = nullptr;
inline void emu_yield() { swapcontext(emu_fiber, emu_scheduler); }

// Arrivals at any barrier, and threads ended: what a round of the scheduler must change, or the
// block's threads wait for one another for ever.
inline thread_local uint64_t emu_progress = 0;

// The last of `parties` to arrive goes on; the others yield until it has.
class EmuBarrier {
 public:
  explicit EmuBarrier(int parties) : parties_(parties) {}
  void wait() {
    ++emu_progress;
    if (++count_ == parties_) {
      count_ = 0;
      ++generation_;
      return;
    }
    const uint64_t generation = generation_;
    do emu_yield();
    while (generation_ == generation);
  }

 private:
  int parties_, count_ = 0;
  uint64_t generation_ = 0;
};

struct EmuWarp {
  EmuBarrier barrier{32};
  const void* ptr[32];
  uint32_t word[32][10];
  float value[32][4];
};

struct EmuBlock {
  explicit EmuBlock(int threads) : barrier(threads), warps(threads / 32) {}
  EmuBarrier barrier;
  std::vector<EmuWarp> warps;
};

inline thread_local EmuBlock* emu_block = nullptr;

inline int emu_lane() { return int(threadIdx.x) % 32; }
inline EmuWarp& emu_warp() { return emu_block->warps[threadIdx.x / 32]; }

}  // namespace llmhpc::flash

inline void __syncthreads() { llmhpc::flash::emu_block->barrier.wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { llmhpc::flash::emu_warp().barrier.wait(); }
inline float __shfl_xor_sync(unsigned, float v, int offset) {
  llmhpc::flash::EmuWarp& w = llmhpc::flash::emu_warp();
  const int lane = llmhpc::flash::emu_lane();
  w.value[lane][0] = v;
  w.barrier.wait();
  const float r = w.value[lane ^ offset][0];
  w.barrier.wait();
  return r;
}

namespace llmhpc::flash {

inline int min(int a, int b) { return a < b ? a : b; }

// cp.async as the PTX ISA promises it and no more: a copy lands only when a wait_group
// that covers its group returns (here: exactly then), so a read of shared memory before the
// right wait sees the poison (or older data) rather than the copy.
struct EmuCopy {
  void* dst;
  const void* src;
  int src_bytes, bytes;  // bytes - src_bytes are zero-filled
};
inline thread_local std::vector<EmuCopy> emu_uncommitted;
inline thread_local std::vector<std::vector<EmuCopy>> emu_groups;  // oldest first

inline void cp_async_16(void* smem_dst, const void* gmem, int src_bytes) {
  emu_uncommitted.push_back({smem_dst, gmem, src_bytes, 16});
}
inline void cp_async_4(void* smem_dst, const void* gmem, int src_bytes) {
  emu_uncommitted.push_back({smem_dst, gmem, src_bytes, 4});
}
inline void cp_async_commit() {
  emu_groups.push_back(std::move(emu_uncommitted));
  emu_uncommitted.clear();
}
template <int N>
inline void cp_async_wait() {
  while (emu_groups.size() > size_t(N)) {
    for (const EmuCopy& c : emu_groups.front()) {
      std::memcpy(c.dst, c.src, size_t(c.src_bytes));
      std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, size_t(c.bytes - c.src_bytes));
    }
    emu_groups.erase(emu_groups.begin());
  }
}

inline uint16_t emu_bits(const __nv_bfloat16* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return b;
}

// Lane i gives the address of row i % 8 of matrix i / 8 (eight bf16 each). Register j:
// matrix j, row lane / 4, columns 2 (lane % 4) and 2 (lane % 4) + 1 (low half first); with
// `trans`, the transposed matrix: rows 2 (lane % 4) and 2 (lane % 4) + 1, column lane / 4.
inline void emu_ldmatrix(uint32_t (&r)[4], const __nv_bfloat16* row, bool trans) {
  EmuWarp& w = emu_warp();
  const int lane = emu_lane();
  w.ptr[lane] = row;
  w.barrier.wait();
  for (int j = 0; j < 4; ++j) {
    uint16_t lo, hi;
    if (!trans) {
      const auto* rp = static_cast<const __nv_bfloat16*>(w.ptr[8 * j + lane / 4]);
      lo = emu_bits(rp + 2 * (lane % 4));
      hi = emu_bits(rp + 2 * (lane % 4) + 1);
    } else {
      lo = emu_bits(static_cast<const __nv_bfloat16*>(w.ptr[8 * j + 2 * (lane % 4)]) + lane / 4);
      hi = emu_bits(static_cast<const __nv_bfloat16*>(w.ptr[8 * j + 2 * (lane % 4) + 1]) + lane / 4);
    }
    r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  w.barrier.wait();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) { emu_ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) { emu_ldmatrix(r, row, true); }

inline float emu_half(uint32_t word, int half) {
  const uint32_t bits = (half ? word >> 16 : word & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ex2.approx.ftz: within its error bound of exact exp2, subnormal results flushed to 0.
inline float fast_exp2(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}

// d (16x8 fp32) += a (16x16) b (16x8), in the fragment layout of mma.m16n8k16 (utils.cuh).
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  EmuWarp& w = emu_warp();
  const int lane = emu_lane();
  for (int i = 0; i < 4; ++i) w.word[lane][i] = a[i];
  w.word[lane][4] = b0;
  w.word[lane][5] = b1;
  w.barrier.wait();
  auto A = [&](int row, int k) {  // a0: (g, 2c..), a1: (g+8, 2c..), a2: (g, 2c+8..), a3: (g+8, 2c+8..)
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return emu_half(w.word[4 * (row % 8) + (k % 8) / 2][reg], k % 2);
  };
  auto B = [&](int k, int n) {  // b0: (2c.., g), b1: (2c+8.., g)
    return emu_half(w.word[4 * n + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k % 2);
  };
  const int g = lane / 4, c = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * c + (e % 2);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    out[e] = acc;
  }
  w.barrier.wait();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// A fiber's stack with an inaccessible page below it: an overflow faults at once instead of
// writing over the heap.
class EmuStack {
 public:
  static constexpr size_t kBytes = 256 * 1024;  // the kernels' per-thread arrays take about 1 KiB
  EmuStack() {
    page_ = size_t(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, page_ + kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (p == MAP_FAILED || mprotect(p, page_, PROT_NONE) != 0)
      throw std::runtime_error("emulate_launch: cannot map a thread's stack");
    base_ = static_cast<char*>(p);
  }
  EmuStack(const EmuStack&) = delete;
  EmuStack& operator=(const EmuStack&) = delete;
  ~EmuStack() { munmap(base_, page_ + kBytes); }
  char* bottom() const { return base_ + page_; }

 private:
  char* base_ = nullptr;
  size_t page_ = 0;
};

// One emulated thread: its context, stack and what CUDA keeps per thread (its index, its
// cp.async groups), swapped into the thread_locals above while it runs.
struct EmuThread {
  ucontext_t context;
  EmuStack stack;
  uint3 index;
  std::vector<EmuCopy> uncommitted;
  std::vector<std::vector<EmuCopy>> groups;
  bool done = false;
};
inline thread_local std::function<void()>* emu_body = nullptr;  // the block's kernel call
inline thread_local EmuThread* emu_starting = nullptr;
inline thread_local std::exception_ptr emu_failure;
inline void emu_thread_main() {
  EmuThread& self = *emu_starting;
  try {
    (*emu_body)();
  } catch (...) {  // not across the context switch: the scheduler rethrows it
    emu_failure = std::current_exception();
  }
  self.done = true;
  ++emu_progress;
}  // returns to uc_link: the scheduler

// Runs kernel(p) on every block of `grid` with `threads` threads each, blocks one by one in
// launch order (x fastest, then y, then z); a block's threads take turns, each running until
// it waits at a barrier or ends, in thread order.
template <class Params>
void emulate_launch(void (*kernel)(const Params), dim3 grid, int threads, size_t smem_bytes, const Params& p) {
  if (smem_bytes > kEmulatedSharedBytes) throw std::runtime_error("emulate_launch: too much shared memory");
  if (threads % 32 != 0) throw std::runtime_error("emulate_launch: threads must be whole warps");
  std::vector<EmuThread> pool(threads);
  std::function<void()> body = [&] { kernel(p); };
  ucontext_t scheduler;
  blockDim = dim3(unsigned(threads));
  gridDim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(smem, 0xff, kEmulatedSharedBytes);
        EmuBlock block(threads);
        emu_block = &block;
        blockIdx = uint3{bx, by, bz};
        for (int t = 0; t < threads; ++t) {
          EmuThread& th = pool[t];
          if (getcontext(&th.context) != 0) throw std::runtime_error("emulate_launch: getcontext failed");
          th.context.uc_stack = {th.stack.bottom(), 0, EmuStack::kBytes};
          th.context.uc_link = &scheduler;
          makecontext(&th.context, emu_thread_main, 0);
          th.index = uint3{unsigned(t), 0, 0};
          th.uncommitted.clear();
          th.groups.clear();
          th.done = false;
        }
        emu_body = &body;
        emu_scheduler = &scheduler;
        for (int left = threads; left > 0;) {
          const uint64_t before = emu_progress;
          for (EmuThread& th : pool) {
            if (th.done) continue;
            threadIdx = th.index;
            std::swap(emu_uncommitted, th.uncommitted);
            std::swap(emu_groups, th.groups);
            emu_fiber = &th.context;
            emu_starting = &th;
            swapcontext(&scheduler, &th.context);
            std::swap(emu_uncommitted, th.uncommitted);
            std::swap(emu_groups, th.groups);
            left -= th.done;
            // The others may wait at a barrier this thread will never reach: they are left.
            if (emu_failure) std::rethrow_exception(std::exchange(emu_failure, nullptr));
          }
          if (left > 0 && emu_progress == before)
            throw std::runtime_error("emulate_launch: block (" + std::to_string(bx) + "," + std::to_string(by) + "," +
                                     std::to_string(bz) + "): " + std::to_string(left) +
                                     " thread(s) wait at a barrier the others never reach");
        }
      }
}

}  // namespace llmhpc::flash

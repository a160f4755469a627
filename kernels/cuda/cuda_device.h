// The CUDA Device: one GPU, one compute stream, CUDA-event timers, and a caching device
// allocator (under the TracingAllocator every tensor allocation goes through).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/gpu_info.h"

namespace llmhpc {

// Keeps freed device blocks for reuse, so a training step allocates without cudaMalloc
// (which synchronises the device). `limit` caps the bytes held from cudaMalloc, live and
// cached together. A request that does not fit (over the limit, or cudaMalloc fails)
// first frees the cache and tries once more, then throws OutOfMemory.
//
// Blocks are reused in the order of the compute stream: work on another stream that uses
// a block must be finished, or ordered before the compute stream, before the block is freed.
// Paged and shareable allocations (DevicePages) are not cached; they count towards the limit
// by the pages they hold.
class CachingDeviceAllocator final : public Allocator {
 public:
  CachingDeviceAllocator(size_t limit, int ordinal) : limit_(limit), pages_(ordinal) {}
  ~CachingDeviceAllocator() override;
  void* allocate(size_t bytes, const std::string& tag) override;
  void deallocate(void* p) override;
  size_t page_bytes() const override { return pages_.page_bytes(); }
  void* allocate_paged(size_t bytes, const std::string& tag) override;
  void* allocate_shareable(size_t bytes, const std::string& tag) override;
  bool shares_memory() const override { return pages_.shareable(); }
  size_t release_pages(void* base, size_t offset, size_t bytes) override;
  size_t restore_pages(void* base, size_t offset, size_t bytes) override;

  void release_cache();  // cudaFree every cached block

  // While a graph is captured, the blocks it uses are handed out and taken back as usual (the
  // recorded work reuses them in stream order, as eager work would); end_capture() then holds
  // those that came back, out of the cache, so that no later allocation can take a block the
  // graph's replays still write. release() gives them back when the graph is destroyed.
  void begin_capture();
  std::vector<void*> end_capture();
  void release(const std::vector<void*>& held);
  size_t reserved_bytes() const { return reserved_; }
  size_t cached_bytes() const { return cached_bytes_; }

 private:
  // Paged or shareable memory of `bytes` from `get` (DevicePages), within the limit as obtain().
  void* from_pages(size_t bytes, const std::string& tag, const std::function<void*()>& get);
  void* device_malloc(size_t bytes);  // nullptr on failure, with the CUDA error cleared
  // `size` bytes within the limit from `get` (nullptr when the device is full): the cache is
  // released first when over the limit, and once more when the device is full; else throws
  // OutOfMemory naming `tag`. Adds nothing to reserved_.
  void* obtain(size_t size, const std::string& tag, const std::function<void*()>& get);

  size_t limit_;
  size_t reserved_ = 0, cached_bytes_ = 0;
  std::unordered_map<void*, size_t> live_;  // pointer -> block size
  std::multimap<size_t, void*> cached_;     // block size -> free block
  bool capturing_ = false;
  std::unordered_set<void*> captured_;      // blocks handed out during the capture
  std::unordered_map<void*, size_t> held_;  // blocks of live graphs -> block size
  DevicePages pages_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const BackendOptions& options);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override { return name_; }
  int ordinal() const override { return ordinal_; }
  size_t memory_capacity() const override { return capacity_; }
  int64_t memory_used() const override;
  Attrs environment() const override;
  bool read_sensors(DeviceReading& out) const override { return sensors_.read(out); }
  TracingAllocator& allocator() override { return tracer_; }

  void synchronize() override;
  std::unique_ptr<Timer> make_timer(int num_marks) override;

  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void* native_stream() override { return stream_; }
  std::unique_ptr<DeviceGraph> capture(const std::function<void()>& work) override;

  cudaStream_t stream() const { return stream_; }
  int multiprocessors() const { return multiprocessors_; }
  CachingDeviceAllocator& caching_allocator() { return cache_; }

 private:
  int ordinal_;
  std::string name_;
  size_t capacity_;
  int multiprocessors_ = 1;
  cudaStream_t stream_ = nullptr;
  CachingDeviceAllocator cache_;
  TracingAllocator tracer_;
  GpuSensors sensors_{ordinal_};
};

}  // namespace llmhpc

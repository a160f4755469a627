// CudaDevice and its caching allocator (see cuda_device.h).
#include "kernels/cuda/cuda_device.h"

#include <functional>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_info.h"
#include "src/core/cuda/event_timer.h"

namespace llmhpc {
namespace {

// Small blocks round to 512 bytes, large ones to 2 MiB, so that similar requests share
// cached blocks; a cached block serves a request up to 1/8 smaller than itself.
size_t block_size_for(size_t bytes) {
  const size_t small = 512, large = size_t(2) << 20;
  if (bytes == 0) bytes = 1;
  return bytes < (size_t(1) << 20) ? (bytes + small - 1) / small * small : (bytes + large - 1) / large * large;
}

// Makes `ordinal` the current GPU of this thread; returns it.
int select_device(int ordinal) {
  CUDA_CHECK(cudaSetDevice(ordinal));
  return ordinal;
}

// The device's memory, or the user's smaller limit.
size_t capacity_for(const BackendOptions& options) {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return options.memory_limit ? std::min(options.memory_limit, total) : total;
}

}  // namespace

// ---- CachingDeviceAllocator ----------------------------------------------------------------

CachingDeviceAllocator::~CachingDeviceAllocator() {
  cudaDeviceSynchronize();  // the paged blocks' pages are unmapped, which nothing may be using
  release_cache();
  for (auto& [p, size] : held_) cudaFree(p);  // a graph outlived the device
  for (auto& [p, size] : live_) cudaFree(p);  // leaked by a caller; the device is going away
}

void* CachingDeviceAllocator::device_malloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc == cudaSuccess) return p;
  LLMHPC_CHECK(rc == cudaErrorMemoryAllocation || capturing_, std::string("cudaMalloc: ") + cudaGetErrorString(rc));
  cudaGetLastError();  // clear the sticky-free allocation error so later calls succeed
  return nullptr;
}

void* CachingDeviceAllocator::allocate(size_t bytes, const std::string& tag) {
  const size_t size = block_size_for(bytes);
  auto hit = cached_.lower_bound(size);
  if (hit != cached_.end() && hit->first <= size + size / 8) {
    void* p = hit->second;
    live_[p] = hit->first;
    if (capturing_) captured_.insert(p);
    cached_bytes_ -= hit->first;
    cached_.erase(hit);
    return p;
  }
  void* p = obtain(size, tag, [&] { return device_malloc(size); });
  reserved_ += size;
  live_[p] = size;
  if (capturing_) captured_.insert(p);
  return p;
}

void* CachingDeviceAllocator::obtain(size_t size, const std::string& tag, const std::function<void*()>& get) {
  // While a graph is recorded the cache is not released (cudaFree would wait for the device).
  const bool may_release = !capturing_;
  if (may_release && reserved_ + size > limit_) release_cache();
  void* p = reserved_ + size <= limit_ ? get() : nullptr;
  if (!p && may_release && reserved_ + size <= limit_) {
    release_cache();
    p = get();
  }
  if (!p)
    throw OutOfMemory("device allocation of " + format_bytes(double(size)) + " for '" + tag + "' does not fit: " +
                      format_bytes(double(reserved_)) + " in use of a limit of " + format_bytes(double(limit_)) +
                      (capturing_ ? " (while recording a CUDA graph, which cannot release the cache)" : ""));
  return p;
}

void* CachingDeviceAllocator::allocate_paged(size_t bytes, const std::string& tag) {
  if (pages_.page_bytes() == 0) return allocate(bytes, tag);
  return from_pages(bytes, tag, [&] { return pages_.allocate(bytes); });
}

void* CachingDeviceAllocator::allocate_shareable(size_t bytes, const std::string& tag) {
  if (!pages_.shareable()) return allocate(bytes, tag);  // NCCL cannot register it (shares_memory())
  return from_pages(bytes, tag, [&] { return pages_.allocate_shareable(bytes); });
}

void* CachingDeviceAllocator::from_pages(size_t bytes, const std::string& tag, const std::function<void*()>& get) {
  LLMHPC_CHECK(!capturing_, "paged or shareable memory while recording a CUDA graph");
  const size_t size = (bytes + pages_.page_bytes() - 1) / pages_.page_bytes() * pages_.page_bytes();
  void* p = obtain(size, tag, get);
  reserved_ += pages_.size_of(p);
  return p;
}

size_t CachingDeviceAllocator::release_pages(void* base, size_t offset, size_t bytes) {
  if (!pages_.owns(base)) return 0;     // an ordinary block (no virtual memory management here)
  CUDA_CHECK(cudaDeviceSynchronize());  // nothing may still be using the pages
  const size_t n = pages_.release(base, offset, bytes);
  reserved_ -= n;
  return n;
}

size_t CachingDeviceAllocator::restore_pages(void* base, size_t offset, size_t bytes) {
  if (!pages_.owns(base)) return 0;
  const size_t held = pages_.held_bytes(base);
  // Room for at most every page of the block; a retry maps only the pages still missing.
  obtain(pages_.size_of(base) - held, "pages taken back",
         [&]() -> void* { return pages_.restore(base, offset, bytes) ? base : nullptr; });
  const size_t n = pages_.held_bytes(base) - held;
  reserved_ += n;
  return n;
}

void CachingDeviceAllocator::deallocate(void* p) {
  if (!p) return;
  if (pages_.owns(p)) {
    CUDA_CHECK(cudaDeviceSynchronize());  // unmapping: nothing may still be using the pages
    reserved_ -= pages_.held_bytes(p);
    pages_.free(p);
    return;
  }
  auto it = live_.find(p);
  LLMHPC_CHECK(it != live_.end(), "free of a pointer the CUDA allocator did not allocate");
  cached_.emplace(it->second, p);
  cached_bytes_ += it->second;
  live_.erase(it);
}

void CachingDeviceAllocator::begin_capture() {
  LLMHPC_CHECK(!capturing_, "two captures at once");
  capturing_ = true;
  captured_.clear();
}

std::vector<void*> CachingDeviceAllocator::end_capture() {
  capturing_ = false;
  std::vector<void*> held;
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (!captured_.count(it->second)) {
      ++it;
      continue;
    }
    held.push_back(it->second);
    held_[it->second] = it->first;
    cached_bytes_ -= it->first;
    it = cached_.erase(it);
  }
  captured_.clear();
  return held;
}

void CachingDeviceAllocator::release(const std::vector<void*>& held) {
  for (void* p : held) {
    auto it = held_.find(p);
    LLMHPC_CHECK(it != held_.end(), "release of a block no graph holds");
    cached_.emplace(it->second, p);
    cached_bytes_ += it->second;
    held_.erase(it);
  }
}

void CachingDeviceAllocator::release_cache() {
  for (auto& [size, p] : cached_) {
    CUDA_CHECK(cudaFree(p));  // synchronises the device: no pending work can still use p
    reserved_ -= size;
  }
  cached_.clear();
  cached_bytes_ = 0;
}

// ---- CudaDevice ----------------------------------------------------------------------------

CudaDevice::CudaDevice(const BackendOptions& options)
    : ordinal_(select_device(options.ordinal)), capacity_(capacity_for(options)), cache_(capacity_, ordinal_),
      tracer_(cache_) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  name_ = prop.name;
  multiprocessors_ = prop.multiProcessorCount;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  cudaStreamSynchronize(stream_);
  cache_.release_cache();
  cudaStreamDestroy(stream_);
}

Attrs CudaDevice::environment() const { return gpu_environment(ordinal_); }

int64_t CudaDevice::memory_used() const {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return int64_t(total - free_bytes);
}

void CudaDevice::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::unique_ptr<Timer> CudaDevice::make_timer(int num_marks) { return make_event_timer(stream_, num_marks); }

void CudaDevice::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  // From pageable memory this returns once the source is staged, so the caller may reuse it.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaDevice::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::copy_on_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaDevice::fill_zero(void* dst, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_)); }

namespace {

class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraph_t graph, cudaStream_t stream, CachingDeviceAllocator& cache, std::vector<void*> held)
      : graph_(graph), stream_(stream), cache_(cache), held_(std::move(held)) {
    CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CudaGraph() override {
    cudaStreamSynchronize(stream_);  // a replay may still run: its blocks go back only after it
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cache_.release(held_);
  }
  void launch() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_;
  CachingDeviceAllocator& cache_;
  std::vector<void*> held_;
};

}  // namespace

// Thread-local capture: calls of this thread that are unsafe while capturing (a blocking
// copy, a cudaFree that synchronises the device) are errors, so a step that is not
// capturable fails at once rather than recording something else.
std::unique_ptr<DeviceGraph> CudaDevice::capture(const std::function<void()>& work) {
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cache_.begin_capture();
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cache_.release(cache_.end_capture());
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  return std::make_unique<CudaGraph>(graph, stream_, cache_, cache_.end_capture());
}

}  // namespace llmhpc

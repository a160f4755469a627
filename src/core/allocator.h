// Memory: the Allocator interface, a tracing decorator, and Buffer (RAII owner).
//
// Every device or host tensor the program allocates goes through a TracingAllocator, so
// the memory mode and the OOM path see every allocation with its tag ("layers.3.attn.qkv"),
// size and time, and the live bytes can be told apart by what they are for (categories of
// tag prefixes). Backends implement the raw allocator; OutOfMemory is thrown when a request
// does not fit (the caller decides whether that ends a configuration or the run).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/tensor.h"

namespace llmhpc {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemory when the request cannot be met.
  virtual void* allocate(size_t bytes, const std::string& tag) = 0;
  virtual void deallocate(void* p) = 0;

  // Paged memory: an allocation whose pages can be given back while its addresses stay (the
  // master weights of ranges other ranks own, which nobody reads until a checkpoint). Where
  // the allocator has no pages (page_bytes() 0), allocate_paged() is allocate() and nothing is
  // given back.
  virtual size_t page_bytes() const { return 0; }
  virtual void* allocate_paged(size_t bytes, const std::string& tag) { return allocate(bytes, tag); }
  // Of a paged allocation at `base`: gives back every page wholly inside [offset, offset +
  // bytes), after waiting for the device's work; touching them then faults. Returns the bytes
  // given back (pages given back already count nothing).
  virtual size_t release_pages(void* base, size_t offset, size_t bytes) { return 0; }
  // Takes again every page given back that [offset, offset + bytes) touches, its contents
  // undefined. Returns the bytes taken.
  virtual size_t restore_pages(void* base, size_t offset, size_t bytes) { return 0; }

  // Shareable memory: one allocation the node's other ranks can map, which collectives through
  // the copy engines need (CopyEngines::register_window). Where the allocator has nothing of
  // the kind (host memory, a GPU without virtual memory management, a driver that does not
  // export it) it is allocate(), and shares_memory() says so.
  virtual void* allocate_shareable(size_t bytes, const std::string& tag) { return allocate(bytes, tag); }
  virtual bool shares_memory() const { return false; }
};

struct AllocEvent {
  double time_ms;      // since the tracer was created
  int64_t delta;       // +bytes on allocation, -bytes on free
  int64_t live_after;  // bytes live after this event
  uint64_t address;
  std::string tag;
  std::string phase;   // the phase set by set_phase() when the event happened
  bool pages = false;  // pages of a paged allocation given back (delta < 0) or taken again: it stays allocated
};

// What some allocations are for, told by their tags: "params" and "params.bf16" are
// parameters if one prefix is "params". Whoever names the tags names the categories (the
// model: src/model/train_step.h), so a later consumer (a memory mode) groups the same way.
struct TagCategory {
  std::string name;
  std::vector<std::string> tag_prefixes;
};

// The index of the first category one of whose prefixes `tag` starts with, else
// categories.size() ("other", last in a MemoryBreakdown); and that category's name.
size_t category_index(const std::string& tag, const std::vector<TagCategory>& categories);
const std::string& tag_category(const std::string& tag, const std::vector<TagCategory>& categories);

// One allocation that is live: where, how large, and its tag.
struct LiveAllocation {
  uint64_t address;
  int64_t bytes;
  std::string tag;
};

// Live bytes per category, in the order the categories were given, then "other" for
// allocations no prefix matched; the categories sum to `total`.
struct MemoryBreakdown {
  std::vector<std::pair<std::string, int64_t>> bytes;
  int64_t total = 0;
  int64_t of(const std::string& category) const;  // 0 for a category not in the list
};

class TracingAllocator final : public Allocator {
 public:
  explicit TracingAllocator(Allocator& inner);
  void* allocate(size_t bytes, const std::string& tag) override;
  void deallocate(void* p) override;
  // Paged allocations count what they hold: their size less the pages given back.
  size_t page_bytes() const override { return inner_.page_bytes(); }
  void* allocate_paged(size_t bytes, const std::string& tag) override;
  size_t release_pages(void* base, size_t offset, size_t bytes) override;
  size_t restore_pages(void* base, size_t offset, size_t bytes) override;
  void* allocate_shareable(size_t bytes, const std::string& tag) override;
  bool shares_memory() const override { return inner_.shares_memory(); }

  int64_t live_bytes() const { return live_; }
  int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = live_; }
  // An allocation counts towards the first category one of whose prefixes its tag starts with.
  MemoryBreakdown live_by_category(const std::vector<TagCategory>& categories) const;
  // Every live allocation, by address.
  std::vector<LiveAllocation> live_allocations() const;

  // Event recording is off by default (it costs a string per allocation).
  void set_recording(bool on) { recording_ = on; }
  void set_phase(const std::string& phase) { phase_ = phase; }
  double now_ms() const;  // on the events' clock
  const std::vector<AllocEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }

 private:
  struct Live {
    size_t bytes;
    std::string tag;
  };
  void note(void* p, int64_t delta, const std::string& tag, bool pages = false);  // live bytes, peak, event
  size_t count_pages(void* base, int64_t delta);  // pages of `base` given back (< 0) or taken; returns |delta|
  Allocator& inner_;
  std::chrono::steady_clock::time_point t0_;
  std::unordered_map<void*, Live> live_allocs_;
  int64_t live_ = 0, peak_ = 0;
  bool recording_ = false;
  std::string phase_;
  std::vector<AllocEvent> events_;
};

// Physical memory of this machine in bytes.
size_t host_physical_memory();
// What a node's ranks may allocate together by default (the capacity of host memory): 85% of the
// memory available now (/proc/meminfo's MemAvailable, within a memory cgroup's limit where one
// is set; physical memory where neither can be read),
// the rest left to what the allocator does not count (each process's code, MPI's buffers, the
// heap's own) and the system. With all of it, 2 ranks of a 23 GB machine were killed by the
// kernel at 12.2 GB each under limits of 11.8 GB.
size_t host_usable_memory();
// This process's resident set in bytes (/proc/self/statm), -1 where it cannot be read.
int64_t host_resident_bytes();

// Host memory with a capacity: beyond it, allocate() throws OutOfMemory, so a CPU sweep
// can hit "oom" like a GPU one instead of being killed by the kernel. Paged allocations are
// mapped pages of their own: a page given back goes back to the system (madvise) and is
// protected, so touching it faults.
class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  ~HostAllocator() override;
  void* allocate(size_t bytes, const std::string& tag) override;
  void deallocate(void* p) override;
  size_t page_bytes() const override;
  void* allocate_paged(size_t bytes, const std::string& tag) override;
  size_t release_pages(void* base, size_t offset, size_t bytes) override;
  size_t restore_pages(void* base, size_t offset, size_t bytes) override;
  size_t capacity() const { return capacity_; }

 private:
  void reserve(size_t bytes, const std::string& tag);  // throws OutOfMemory beyond the capacity
  // Gives back (held false) or takes again pages [first, last) of a paged allocation; returns the bytes changed.
  size_t set_pages(void* base, std::pair<size_t, size_t> pages, bool held);
  size_t capacity_;
  size_t live_ = 0;
  std::unordered_map<void*, size_t> sizes_;
  std::unordered_map<void*, std::vector<bool>> pages_;  // paged allocations: which pages are held
};

// The pages a paged allocation gives back or takes again for [offset, offset + bytes): whole
// pages inside it (release) or every page it touches (restore), as page indices [first, last).
std::pair<size_t, size_t> pages_inside(size_t offset, size_t bytes, size_t page);
std::pair<size_t, size_t> pages_touched(size_t offset, size_t bytes, size_t page);

// Which of the Allocator's calls a Buffer's memory comes from: allocate, allocate_paged, allocate_shareable.
enum class MemoryKind { Plain, Paged, Shareable };

// Owns one allocation and views it as a tensor. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& alloc, DType dtype, Shape shape, const std::string& tag, MemoryKind kind = MemoryKind::Plain);
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }
  bool empty() const { return tensor_.empty(); }
  void release();

 private:
  Allocator* alloc_ = nullptr;
  Tensor tensor_;
};

std::string format_bytes(double bytes);

}  // namespace llmhpc

#include "src/core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace llmhpc {

TracingAllocator::TracingAllocator(Allocator& inner) : inner_(inner), t0_(std::chrono::steady_clock::now()) {}

double TracingAllocator::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

void TracingAllocator::note(void* p, int64_t delta, const std::string& tag, bool pages) {
  live_ += delta;
  if (live_ > peak_) peak_ = live_;
  if (recording_) events_.push_back({now_ms(), delta, live_, reinterpret_cast<uint64_t>(p), tag, phase_, pages});
}

void* TracingAllocator::allocate(size_t bytes, const std::string& tag) {
  void* p = inner_.allocate(bytes, tag);
  live_allocs_[p] = Live{bytes, tag};
  note(p, int64_t(bytes), tag);
  return p;
}

void* TracingAllocator::allocate_paged(size_t bytes, const std::string& tag) {
  void* p = inner_.allocate_paged(bytes, tag);
  live_allocs_[p] = Live{bytes, tag};
  note(p, int64_t(bytes), tag);
  return p;
}

void* TracingAllocator::allocate_shareable(size_t bytes, const std::string& tag) {
  void* p = inner_.allocate_shareable(bytes, tag);
  live_allocs_[p] = Live{bytes, tag};
  note(p, int64_t(bytes), tag);
  return p;
}

size_t TracingAllocator::release_pages(void* base, size_t offset, size_t bytes) {
  return count_pages(base, -int64_t(inner_.release_pages(base, offset, bytes)));
}

size_t TracingAllocator::restore_pages(void* base, size_t offset, size_t bytes) {
  return count_pages(base, int64_t(inner_.restore_pages(base, offset, bytes)));
}

size_t TracingAllocator::count_pages(void* base, int64_t delta) {
  auto it = live_allocs_.find(base);
  LLMHPC_CHECK(it != live_allocs_.end(), "pages of a pointer this allocator did not allocate");
  it->second.bytes = size_t(int64_t(it->second.bytes) + delta);
  if (delta) note(base, delta, it->second.tag, /*pages=*/true);
  return size_t(delta < 0 ? -delta : delta);
}

void TracingAllocator::deallocate(void* p) {
  if (!p) return;
  auto it = live_allocs_.find(p);
  LLMHPC_CHECK(it != live_allocs_.end(), "free of a pointer this allocator did not allocate");
  note(p, -int64_t(it->second.bytes), it->second.tag);
  live_allocs_.erase(it);
  inner_.deallocate(p);
}

int64_t MemoryBreakdown::of(const std::string& category) const {
  for (const auto& [name, n] : bytes)
    if (name == category) return n;
  return 0;
}

size_t category_index(const std::string& tag, const std::vector<TagCategory>& categories) {
  for (size_t k = 0; k < categories.size(); ++k)
    for (const std::string& prefix : categories[k].tag_prefixes)
      if (tag.rfind(prefix, 0) == 0) return k;
  return categories.size();
}

const std::string& tag_category(const std::string& tag, const std::vector<TagCategory>& categories) {
  static const std::string other = "other";
  const size_t k = category_index(tag, categories);
  return k < categories.size() ? categories[k].name : other;
}

MemoryBreakdown TracingAllocator::live_by_category(const std::vector<TagCategory>& categories) const {
  MemoryBreakdown out;
  for (const TagCategory& c : categories) out.bytes.push_back({c.name, 0});
  out.bytes.push_back({"other", 0});
  for (const auto& [ptr, live] : live_allocs_) {
    out.bytes[category_index(live.tag, categories)].second += int64_t(live.bytes);
    out.total += int64_t(live.bytes);
  }
  return out;
}

std::vector<LiveAllocation> TracingAllocator::live_allocations() const {
  std::vector<LiveAllocation> out;
  for (const auto& [ptr, live] : live_allocs_)
    out.push_back({reinterpret_cast<uint64_t>(ptr), int64_t(live.bytes), live.tag});
  std::sort(out.begin(), out.end(),
            [](const LiveAllocation& a, const LiveAllocation& b) { return a.address < b.address; });
  return out;
}

size_t host_physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(1) << 34;
}

namespace {
// The first number in `path` (a cgroup's memory file), or -1: no file, or "max" (no limit).
long long read_number(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}
}  // namespace

size_t host_usable_memory() {
  size_t available = host_physical_memory();
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        available = std::min(available, size_t(kib) * 1024);
        break;
      }
    std::fclose(f);
  }
  // A memory cgroup's limit (Slurm's --mem, a container's), less what it holds: /proc/meminfo
  // shows the host's memory, and the kernel kills within the limit.
  for (const auto& [limit_file, usage_file] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const long long limit = read_number(limit_file), used = read_number(usage_file);
    if (limit > 0 && used >= 0 && size_t(limit) < available + size_t(used))
      available = size_t(std::max(0LL, limit - used));
  }
  return available / 100 * 85;
}

int64_t host_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = -1;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  const long page = sysconf(_SC_PAGE_SIZE);
  return read == 2 && page > 0 ? int64_t(resident) * page : -1;
}

void HostAllocator::reserve(size_t bytes, const std::string& tag) {
  if (live_ + bytes > capacity_)
    throw OutOfMemory("host allocation of " + format_bytes(double(bytes)) + " for '" + tag + "' exceeds the limit of " +
                      format_bytes(double(capacity_)) + " (" + format_bytes(double(live_)) + " in use)");
}

void* HostAllocator::allocate(size_t bytes, const std::string& tag) {
  reserve(bytes, tag);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw OutOfMemory("host allocation of " + format_bytes(double(bytes)) + " for '" + tag + "' failed");
  live_ += bytes;
  sizes_[p] = bytes;
  return p;
}

void HostAllocator::deallocate(void* p) {
  auto it = sizes_.find(p);
  LLMHPC_CHECK(it != sizes_.end(), "free of unknown host pointer");
  auto paged = pages_.find(p);
  if (paged != pages_.end()) {
    const size_t page = page_bytes();
    for (bool held : paged->second) live_ -= held ? page : 0;
    munmap(p, paged->second.size() * page);
    pages_.erase(paged);
  } else {
    live_ -= it->second;
    std::free(p);
  }
  sizes_.erase(it);
}

HostAllocator::~HostAllocator() {
  for (const auto& [p, held] : pages_) munmap(p, held.size() * page_bytes());
}

size_t HostAllocator::page_bytes() const { return size_t(sysconf(_SC_PAGE_SIZE)); }

void* HostAllocator::allocate_paged(size_t bytes, const std::string& tag) {
  const size_t page = page_bytes(), pages = std::max<size_t>(1, (bytes + page - 1) / page);
  reserve(pages * page, tag);
  void* p = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw OutOfMemory("host allocation of " + format_bytes(double(bytes)) + " for '" + tag + "' failed");
  live_ += pages * page;
  sizes_[p] = bytes;
  pages_[p] = std::vector<bool>(pages, true);
  return p;
}

size_t HostAllocator::set_pages(void* base, std::pair<size_t, size_t> pages, bool held) {
  auto it = pages_.find(base);
  LLMHPC_CHECK(it != pages_.end(), "pages of an allocation that is not paged");
  const size_t page = page_bytes();
  size_t changed = 0;
  for (size_t k = pages.first; k < pages.second && k < it->second.size(); ++k) {
    if (it->second[k] == held) continue;
    char* at = static_cast<char*>(base) + k * page;
    const bool ok = held ? mprotect(at, page, PROT_READ | PROT_WRITE) == 0
                         : madvise(at, page, MADV_DONTNEED) == 0 && mprotect(at, page, PROT_NONE) == 0;
    LLMHPC_CHECK(ok, held ? "taking a host page again failed" : "giving back a host page failed");
    it->second[k] = held;
    changed += page;
  }
  live_ = held ? live_ + changed : live_ - changed;
  return changed;
}

size_t HostAllocator::release_pages(void* base, size_t offset, size_t bytes) {
  return set_pages(base, pages_inside(offset, bytes, page_bytes()), false);
}

size_t HostAllocator::restore_pages(void* base, size_t offset, size_t bytes) {
  return set_pages(base, pages_touched(offset, bytes, page_bytes()), true);
}

std::pair<size_t, size_t> pages_inside(size_t offset, size_t bytes, size_t page) {
  const size_t first = (offset + page - 1) / page, last = (offset + bytes) / page;
  return {first, std::max(first, last)};
}

std::pair<size_t, size_t> pages_touched(size_t offset, size_t bytes, size_t page) {
  return {offset / page, bytes == 0 ? offset / page : (offset + bytes + page - 1) / page};
}

Buffer::Buffer(Allocator& alloc, DType dtype, Shape shape, const std::string& tag, MemoryKind kind) : alloc_(&alloc) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = kind == MemoryKind::Paged       ? alloc.allocate_paged(bytes, tag)
            : kind == MemoryKind::Shareable ? alloc.allocate_shareable(bytes, tag)
                                            : alloc.allocate(bytes, tag);
  tensor_ = Tensor(p, dtype, shape);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    alloc_ = o.alloc_;
    tensor_ = o.tensor_;
    o.alloc_ = nullptr;
    o.tensor_ = Tensor();
  }
  return *this;
}

void Buffer::release() {
  if (alloc_ && tensor_.data) alloc_->deallocate(tensor_.data);
  alloc_ = nullptr;
  tensor_ = Tensor();
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace llmhpc

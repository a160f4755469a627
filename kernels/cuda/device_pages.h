// Device memory whose pages can be given back and taken again while its addresses stay
// (CUDA's virtual memory management): one reserved address range per allocation, one
// physical allocation per page mapped into it. The driver's functions are looked up through
// the runtime (cudaGetDriverEntryPointByVersion), so the binary needs no libcuda at link time
// and still runs where there is no driver (the CPU machines that run the tests).
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace llmhpc {

class DevicePages {
 public:
  explicit DevicePages(int ordinal);
  ~DevicePages();
  DevicePages(const DevicePages&) = delete;
  DevicePages& operator=(const DevicePages&) = delete;

  // The page (the driver's allocation granularity); 0 where the driver has no virtual memory
  // management, and then nothing here may be called.
  size_t page_bytes() const { return page_; }
  // `bytes` rounded up to pages, every page held; nullptr when the device has no room.
  void* allocate(size_t bytes);
  // `bytes` rounded up to pages as one physical allocation that can be exported as a POSIX
  // file descriptor: memory the node's other ranks can map (NCCL's windows, for collectives
  // through the copy engines), which a block of separate pages cannot be. Its pages cannot be
  // given back. nullptr when the device has no room. Only where shareable().
  void* allocate_shareable(size_t bytes);
  bool shareable() const { return shareable_; }
  bool owns(void* p) const { return blocks_.count(p) != 0; }
  size_t size_of(void* p) const;     // the pages it spans, in bytes
  size_t held_bytes(void* p) const;  // of those, held
  void free(void* p);
  // Unmaps and frees every held page wholly inside [offset, offset + bytes) of `base`; the
  // caller has waited for the device. Returns the bytes given back.
  size_t release(void* base, size_t offset, size_t bytes);
  // Maps a new page for every page given back that the range touches. False when the device
  // is full (the pages mapped so far stay: a retry maps the rest).
  bool restore(void* base, size_t offset, size_t bytes);

 private:
  struct Block {
    size_t pages;
    std::vector<unsigned long long> handles;  // one per page, 0: given back; shareable: one for all
    bool shareable = false;
  };
  // One physical allocation of `size` bytes mapped at `at` (false when out of memory), and back.
  bool map(char* at, size_t size, bool shareable, unsigned long long& handle);
  void unmap(char* at, size_t size, unsigned long long& handle);
  int ordinal_;
  size_t page_ = 0;
  bool shareable_ = false;  // the device exports its memory as POSIX file descriptors
  std::unordered_map<void*, Block> blocks_;
};

}  // namespace llmhpc

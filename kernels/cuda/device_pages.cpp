#include "kernels/cuda/device_pages.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "src/core/allocator.h"

namespace llmhpc {
namespace {

// The driver's virtual memory functions, looked up once; every pointer null where the driver
// lacks one.
struct Driver {
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  bool complete() const {
    return granularity && reserve && address_free && create && release && map && unmap && set_access;
  }
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    auto find = [](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
          found == cudaDriverEntryPointSuccess)
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      else cudaGetLastError();
    };
    find("cuMemGetAllocationGranularity", out.granularity);
    find("cuMemAddressReserve", out.reserve);
    find("cuMemAddressFree", out.address_free);
    find("cuMemCreate", out.create);
    find("cuMemRelease", out.release);
    find("cuMemMap", out.map);
    find("cuMemUnmap", out.unmap);
    find("cuMemSetAccess", out.set_access);
    find("cuDeviceGetAttribute", out.attribute);
    return out;
  }();
  return d;
}

CUmemAllocationProp device_memory(int ordinal, bool shareable = false) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // what NCCL imports
  return prop;
}

void check(CUresult rc, const char* what) {
  LLMHPC_CHECK(rc == CUDA_SUCCESS, std::string(what) + " failed (CUresult " + std::to_string(int(rc)) + ")");
}

CUdeviceptr address(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

DevicePages::DevicePages(int ordinal) : ordinal_(ordinal) {
  const Driver& d = driver();
  if (!d.complete()) return;
  const CUmemAllocationProp prop = device_memory(ordinal);
  size_t g = 0;
  if (d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS) page_ = g;
  // Shareable where the device says it exports memory as file descriptors and one page of it
  // can be made (a driver or container may refuse): else allocate_shareable is not offered.
  int fd = 0;
  if (page_ > 0 && d.attribute &&
      d.attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, CUdevice(ordinal)) ==
          CUDA_SUCCESS &&
      fd != 0) {
    const CUmemAllocationProp shareable = device_memory(ordinal, /*shareable=*/true);
    CUmemGenericAllocationHandle h = 0;
    if (d.create(&h, page_, &shareable, 0) == CUDA_SUCCESS) {
      d.release(h);
      shareable_ = true;
    }
  }
}

DevicePages::~DevicePages() {
  while (!blocks_.empty()) free(blocks_.begin()->first);
}

bool DevicePages::map(char* at, size_t size, bool shareable, unsigned long long& handle) {
  const Driver& d = driver();
  const CUmemAllocationProp prop = device_memory(ordinal_, shareable);
  CUmemGenericAllocationHandle h = 0;
  const CUresult rc = d.create(&h, size, &prop, 0);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return false;
  check(rc, "cuMemCreate");
  check(d.map(address(at), size, 0, h, 0), "cuMemMap");
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(d.set_access(address(at), size, &access, 1), "cuMemSetAccess");
  handle = h;
  return true;
}

void DevicePages::unmap(char* at, size_t size, unsigned long long& handle) {
  const Driver& d = driver();
  check(d.unmap(address(at), size), "cuMemUnmap");
  check(d.release(handle), "cuMemRelease");
  handle = 0;
}

void* DevicePages::allocate(size_t bytes) {
  LLMHPC_CHECK(page_ > 0, "paged device memory without the driver's virtual memory management");
  const size_t pages = std::max<size_t>(1, (bytes + page_ - 1) / page_);
  CUdeviceptr base = 0;
  check(driver().reserve(&base, pages * page_, page_, 0, 0), "cuMemAddressReserve");
  char* p = reinterpret_cast<char*>(uintptr_t(base));
  Block block{pages, std::vector<unsigned long long>(pages, 0)};
  for (size_t k = 0; k < pages; ++k) {
    if (map(p + k * page_, page_, /*shareable=*/false, block.handles[k])) continue;
    for (size_t j = 0; j < k; ++j) unmap(p + j * page_, page_, block.handles[j]);
    check(driver().address_free(base, pages * page_), "cuMemAddressFree");
    return nullptr;
  }
  blocks_[p] = std::move(block);
  return p;
}

void* DevicePages::allocate_shareable(size_t bytes) {
  LLMHPC_CHECK(shareable_, "shareable device memory where the driver cannot export it");
  const size_t pages = std::max<size_t>(1, (bytes + page_ - 1) / page_);
  CUdeviceptr base = 0;
  check(driver().reserve(&base, pages * page_, page_, 0, 0), "cuMemAddressReserve");
  char* p = reinterpret_cast<char*>(uintptr_t(base));
  Block block{pages, {0}, true};
  if (!map(p, pages * page_, /*shareable=*/true, block.handles[0])) {
    check(driver().address_free(base, pages * page_), "cuMemAddressFree");
    return nullptr;
  }
  blocks_[p] = std::move(block);
  return p;
}

size_t DevicePages::size_of(void* p) const { return blocks_.at(p).pages * page_; }

size_t DevicePages::held_bytes(void* p) const {
  if (blocks_.at(p).shareable) return size_of(p);
  size_t n = 0;
  for (unsigned long long h : blocks_.at(p).handles) n += h ? page_ : 0;
  return n;
}

void DevicePages::free(void* p) {
  auto it = blocks_.find(p);
  LLMHPC_CHECK(it != blocks_.end(), "free of a pointer that is not paged device memory");
  char* base = static_cast<char*>(p);
  if (it->second.shareable) {
    unmap(base, it->second.pages * page_, it->second.handles[0]);
  } else {
    for (size_t k = 0; k < it->second.pages; ++k)
      if (it->second.handles[k]) unmap(base + k * page_, page_, it->second.handles[k]);
  }
  check(driver().address_free(address(p), it->second.pages * page_), "cuMemAddressFree");
  blocks_.erase(it);
}

size_t DevicePages::release(void* base, size_t offset, size_t bytes) {
  Block& block = blocks_.at(base);
  if (block.shareable) return 0;  // one physical allocation: nothing to give back
  const auto [first, last] = pages_inside(offset, bytes, page_);
  size_t given = 0;
  for (size_t k = first; k < last && k < block.pages; ++k) {
    if (!block.handles[k]) continue;
    unmap(static_cast<char*>(base) + k * page_, page_, block.handles[k]);
    given += page_;
  }
  return given;
}

bool DevicePages::restore(void* base, size_t offset, size_t bytes) {
  Block& block = blocks_.at(base);
  if (block.shareable) return true;
  const auto [first, last] = pages_touched(offset, bytes, page_);
  for (size_t k = first; k < last && k < block.pages; ++k)
    if (!block.handles[k] && !map(static_cast<char*>(base) + k * page_, page_, /*shareable=*/false, block.handles[k]))
      return false;
  return true;
}

}  // namespace llmhpc

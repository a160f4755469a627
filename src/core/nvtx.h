// NVTX ranges for Nsight and CUPTI. With the CUDA toolkit they are nvtx3 (header-only,
// near-free when no tool listens); without it they compile to nothing.
#pragma once
#if defined(LLMHPC_WITH_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif
#include <string>

namespace llmhpc {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if defined(LLMHPC_WITH_CUDA)
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  explicit NvtxRange(const std::string& name) : NvtxRange(name.c_str()) {}
  ~NvtxRange() {
#if defined(LLMHPC_WITH_CUDA)
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace llmhpc

// NCCL return-code checks, next to the CUDA runtime's (src/core/cuda/check.h).
#pragma once
#include <nccl.h>

#include <string>

#include "src/core/cuda/check.h"

#define NCCL_CHECK(call)                                           \
  LLMHPC_CHECK_CALL(call, ncclResult_t, llmhpc_rc_ == ncclSuccess, \
                    std::string(ncclGetErrorString(llmhpc_rc_)) + " (" + ncclGetLastError(nullptr) + ")")

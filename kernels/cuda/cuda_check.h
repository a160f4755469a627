// cuBLAS return-code checks, next to the CUDA runtime's (src/core/cuda_check.h).
#pragma once
#include <cublas_v2.h>

#include "src/core/cuda_check.h"

#define CUBLAS_CHECK(call)                                                   \
  LLMHPC_CHECK_CALL(call, cublasStatus_t, llmhpc_rc_ == CUBLAS_STATUS_SUCCESS, \
                    cublasGetStatusString(llmhpc_rc_))

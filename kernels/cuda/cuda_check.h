// cuBLAS return-code checks, next to the CUDA runtime's (src/core/cuda/check.h).
#pragma once
#include <cublas_v2.h>

#include "src/core/cuda/check.h"

#define CUBLAS_CHECK(call) \
  LLMHPC_CHECK_CALL(call, cublasStatus_t, llmhpc_rc_ == CUBLAS_STATUS_SUCCESS, cublasGetStatusString(llmhpc_rc_))

// Return-code checks for the CUDA runtime and cuBLAS, built on LLMHPC_CHECK_CALL (one
// fatal path: rank, host, device, file:line, the failing call). CUDA_CHECK_LAUNCH() goes
// after every kernel launch: it reports bad launch configurations at the launch site.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "src/core/check.h"

#define CUDA_CHECK(call) \
  LLMHPC_CHECK_CALL(call, cudaError_t, llmhpc_rc_ == cudaSuccess, cudaGetErrorString(llmhpc_rc_))

#define CUBLAS_CHECK(call)                                                   \
  LLMHPC_CHECK_CALL(call, cublasStatus_t, llmhpc_rc_ == CUBLAS_STATUS_SUCCESS, \
                    cublasGetStatusString(llmhpc_rc_))

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

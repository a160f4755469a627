// Return-code checks for the CUDA runtime, built on LLMHPC_CHECK_CALL (one fatal path:
// rank, host, device, file:line, the failing call, the error). Only CUDA code includes
// this. CUDA_CHECK_LAUNCH() goes after every kernel launch: it reports a bad launch at
// the launch site. cuBLAS and NCCL add their own checks on top (kernels/cuda/cuda_check.h,
// comm/cuda/nccl_check.h).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "src/core/check.h"

#define CUDA_CHECK(call)                                          \
  LLMHPC_CHECK_CALL(call, cudaError_t, llmhpc_rc_ == cudaSuccess, \
                    std::string(cudaGetErrorName(llmhpc_rc_)) + ": " + cudaGetErrorString(llmhpc_rc_))

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

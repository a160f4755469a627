// Matrix products through cuBLAS, in row-major terms. fp32 operands use SGEMM arithmetic
// (TF32 tensor cores only when allowed); bf16 operands accumulate in fp32 and may write
// bf16 or fp32 results.
#pragma once
#include <cublas_v2.h>

#include "kernels/ops.h"

namespace llmhpc::cuda {

// A row-major matrix in device memory: `ld` elements between rows, `batch_stride`
// elements between the matrices of a batch.
struct MatrixRef {
  const void* data;
  DType dtype;
  int64_t ld;
  int64_t batch_stride = 0;
};

class Gemm {
 public:
  // sm_margin > 0: cuBLAS plans its grids for the device's SMs less that many, so that work
  // running beside a product (NCCL's all-reduce kernels) does not leave a wave's tail waiting.
  Gemm(cudaStream_t stream, Allocator& workspace_allocator, bool allow_tf32, int sm_margin = 0);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // C (M,N) = alpha op(A) op(B) + beta C for each of `batch` matrices; op(X) = X^T when
  // the trans flag is set, so op(A) is (M,K) and op(B) is (K,N). A and B share a dtype.
  void run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, MatrixRef A, MatrixRef B,
           float beta, MatrixRef C, int64_t batch = 1);

 private:
  cublasHandle_t handle_ = nullptr;
  Buffer workspace_;
  bool allow_tf32_;
};

}  // namespace llmhpc::cuda

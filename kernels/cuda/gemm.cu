// Row-major GEMMs on cuBLAS (see gemm.h).
#include "kernels/cuda/gemm.h"

#include <climits>

#include "kernels/cuda/cuda_check.h"

namespace llmhpc::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS asks for on Hopper

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default:
      throw UsageError(std::string("matrix products on the CUDA backend take fp32 or bf16, not ") + dtype_name(t));
  }
}

int as_int(int64_t v, const char* what) {
  LLMHPC_CHECK(v >= 0 && v <= INT_MAX, std::string("GEMM ") + what + " exceeds cuBLAS's 32-bit range");
  return int(v);
}

}  // namespace

Gemm::Gemm(cudaStream_t stream, Allocator& workspace_allocator, bool allow_tf32, int sm_margin)
    : allow_tf32_(allow_tf32) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  CUBLAS_CHECK(cublasSetStream(handle_, stream));
  workspace_ = Buffer(workspace_allocator, DType::F32, {int64_t(kWorkspaceBytes / 4)}, "cublas.workspace");
  CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.tensor().data, kWorkspaceBytes));
  // Only what the compute type allows: no TF32 for fp32 unless run() asks for it.
  CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  if (sm_margin > 0) {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (sm_margin >= sms)
      throw UsageError("--gemm-sm-margin " + std::to_string(sm_margin) + ": this GPU has " + std::to_string(sms) +
                       " SMs; leave at least one to the matrix products (0 to " + std::to_string(sms - 1) + ")");
    CUBLAS_CHECK(cublasSetSmCountTarget(handle_, sms - sm_margin));
  }
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same memory read
// column-major is the transpose, so cuBLAS gets B first and the dimensions swapped.
void Gemm::run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, MatrixRef A, MatrixRef B,
               float beta, MatrixRef C, int64_t batch) {
  if (A.dtype != B.dtype) throw UsageError("GEMM operands must share a dtype on the CUDA backend");
  if (M == 0 || N == 0 || batch == 0) return;
  const cublasComputeType_t compute =
      A.dtype == DType::F32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K");
  const int ldb = as_int(B.ld, "ldb"), lda = as_int(A.ld, "lda"), ldc = as_int(C.ld, "ldc");
  void* c_data = const_cast<void*>(C.data);
  if (batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(handle_, op_b, op_a, m, n, k, &alpha, B.data, cuda_type(B.dtype), ldb, A.data,
                              cuda_type(A.dtype), lda, &beta, c_data, cuda_type(C.dtype), ldc, compute,
                              CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_, op_b, op_a, m, n, k, &alpha, B.data, cuda_type(B.dtype), ldb,
                                            B.batch_stride, A.data, cuda_type(A.dtype), lda, A.batch_stride, &beta,
                                            c_data, cuda_type(C.dtype), ldc, C.batch_stride, as_int(batch, "batch"),
                                            compute, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace llmhpc::cuda

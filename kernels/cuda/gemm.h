// Matrix products through cuBLASLt, in row-major terms. fp32 operands use SGEMM arithmetic
// (TF32 tensor cores only when allowed); bf16 operands accumulate in fp32 and may write
// bf16 or fp32 results.
//
// Why cuBLASLt with plans rather than cublasGemmEx: cublasGemmEx spends 10-13 us of host time
// per call on an H100 host (it builds descriptors and queries its heuristics every time), more
// than most of a small model's GEMMs take on the GPU, so small bf16 steps waited for the host
// (docs/results/profile.md). A plan (descriptors and the heuristic's algorithm) is made once
// per shape, layout, dtype and pointer alignment, and each call only launches it.
//
// Autotuning (--gemm-autotune): the heuristic's first algorithm is often not the fastest for
// this GPU and shape (on an H100, a train step's products took 0.8-8.4% longer than the
// fastest of its first 8 candidates, docs/results/cuda-notes.md). With it, a plan's
// first call that writes C without reading it (beta 0) times each candidate on the call's own
// operands and keeps the fastest; calls while a CUDA graph is being recorded never time (they
// launch the heuristic's choice until an eager call has tuned the plan). The choice is kept for
// the run, so results are bitwise reproducible within a run, not across runs.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

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
  Gemm(cudaStream_t stream, Allocator& workspace_allocator, bool allow_tf32, int sm_margin = 0, bool autotune = false);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // C (M,N) = alpha op(A) op(B) + beta C for each of `batch` matrices; op(X) = X^T when
  // the trans flag is set, so op(A) is (M,K) and op(B) is (K,N). A and B share a dtype.
  void run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, MatrixRef A, MatrixRef B,
           float beta, MatrixRef C, int64_t batch = 1);

  // Plans made so far (one per distinct product; the tests check that repeats reuse them).
  size_t plans() const { return plans_.size(); }
  // Of them, those with no candidates left to time (tuned, or with one algorithm to choose from).
  size_t tuned_plans() const;

 private:
  // Everything cuBLASLt's choice of algorithm depends on, in cuBLAS's column-major terms.
  struct Key {
    int32_t trans_a, trans_b, m, n, k, lda, ldb, ldc, batch;
    int64_t stride_a, stride_b, stride_c;
    int32_t type_ab, type_c, compute, align_a, align_b, align_c;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;

  Plan& plan_for(const Key& key);
  // Times each of the plan's candidate algorithms on these operands and keeps the fastest.
  void tune(Plan& p, const float* alpha, const void* a, const void* b, void* c);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  bool allow_tf32_;
  int sm_count_target_ = 0;  // 0: every SM
  bool autotune_;
  cudaEvent_t tune_start_ = nullptr, tune_end_ = nullptr;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace llmhpc::cuda

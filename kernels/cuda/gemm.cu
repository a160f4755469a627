// Row-major GEMMs on cuBLASLt, one plan per distinct product (see gemm.h).
#include "kernels/cuda/gemm.h"

#include <climits>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace llmhpc::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS asks for on Hopper
constexpr int kCandidates = 8;                        // algorithms timed per product when autotuning
constexpr int kTunedRuns = 3;                         // timed launches per candidate, after one untimed
// Another candidate replaces the heuristic's first only when this much faster: timing noise
// must not make the choice flip between runs.
constexpr float kTuneMargin = 0.01f;

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

// The largest power of two (up to 256) that divides the address: cuBLASLt's fastest kernels
// need 16-byte aligned operands, and a sub-matrix (a head of qkv) may be aligned less.
int32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (int32_t bytes = 256; bytes > 1; bytes /= 2)
    if (a % uintptr_t(bytes) == 0) return bytes;
  return 1;
}

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, T value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}
template <class T>
void set(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, T value) {
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof value));
}
template <class T>
void set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
}

// A column-major (rows, cols) layout with `ld`, batched when batch > 1.
cublasLtMatrixLayout_t make_layout(int32_t type, int rows, int cols, int ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cudaDataType_t(type), uint64_t(rows), uint64_t(cols), int64_t(ld)));
  if (batch > 1) {
    set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(batch));
    set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return l;
}

}  // namespace

// The descriptors of one product and the algorithm cuBLASLt's heuristic chose for it (or, after
// tuning, the fastest of its candidates).
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's others, best first; none once tuned
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

bool Gemm::Key::operator==(const Key& o) const {
  return trans_a == o.trans_a && trans_b == o.trans_b && m == o.m && n == o.n && k == o.k && lda == o.lda &&
         ldb == o.ldb && ldc == o.ldc && batch == o.batch && stride_a == o.stride_a && stride_b == o.stride_b &&
         stride_c == o.stride_c && type_ab == o.type_ab && type_c == o.type_c && compute == o.compute &&
         align_a == o.align_a && align_b == o.align_b && align_c == o.align_c;
}

size_t Gemm::KeyHash::operator()(const Key& k) const {
  size_t h = 0;
  for (int64_t v :
       {int64_t(k.trans_a), int64_t(k.trans_b), int64_t(k.m), int64_t(k.n), int64_t(k.k), int64_t(k.lda),
        int64_t(k.ldb), int64_t(k.ldc), int64_t(k.batch), k.stride_a, k.stride_b, k.stride_c, int64_t(k.type_ab),
        int64_t(k.type_c), int64_t(k.compute), int64_t(k.align_a), int64_t(k.align_b), int64_t(k.align_c)})
    h = h * 1000003u ^ std::hash<int64_t>()(v);
  return h;
}

Gemm::Gemm(cudaStream_t stream, Allocator& workspace_allocator, bool allow_tf32, int sm_margin, bool autotune)
    : stream_(stream), allow_tf32_(allow_tf32), autotune_(autotune) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (autotune_) {
    CUDA_CHECK(cudaEventCreate(&tune_start_));
    CUDA_CHECK(cudaEventCreate(&tune_end_));
  }
  workspace_ = Buffer(workspace_allocator, DType::F32, {int64_t(kWorkspaceBytes / 4)}, "cublas.workspace");
  if (sm_margin > 0) {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (sm_margin >= sms)
      throw UsageError("{gemm_sm_margin} " + std::to_string(sm_margin) + ": this GPU has " + std::to_string(sms) +
                       " SMs; leave at least one to the matrix products (0 to " + std::to_string(sms - 1) + ")");
    sm_count_target_ = sms - sm_margin;
  }
}

Gemm::~Gemm() {
  plans_.clear();  // their descriptors before the handle
  if (handle_) cublasLtDestroy(handle_);
  if (tune_start_) cudaEventDestroy(tune_start_);
  if (tune_end_) cudaEventDestroy(tune_end_);
}

size_t Gemm::tuned_plans() const {
  size_t n = 0;
  for (const auto& entry : plans_) n += entry.second->candidates.empty() ? 1 : 0;
  return n;
}

Gemm::Plan& Gemm::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, cublasComputeType_t(key.compute), CUDA_R_32F));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(key.trans_a));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(key.trans_b));
  if (sm_count_target_ > 0) set(plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t(sm_count_target_));
  const bool ta = key.trans_a == CUBLAS_OP_T, tb = key.trans_b == CUBLAS_OP_T;
  plan->a = make_layout(key.type_ab, ta ? key.k : key.m, ta ? key.m : key.k, key.lda, key.batch, key.stride_a);
  plan->b = make_layout(key.type_ab, tb ? key.n : key.k, tb ? key.k : key.n, key.ldb, key.batch, key.stride_b);
  plan->c = make_layout(key.type_c, key.m, key.n, key.ldc, key.batch, key.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(key.align_a));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(key.align_b));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(key.align_c));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(key.align_c));
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                                           pref, autotune_ ? kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0)
    LLMHPC_FATAL("cuBLASLt has no algorithm for the product (column-major) m " + std::to_string(key.m) + " n " +
                 std::to_string(key.n) + " k " + std::to_string(key.k) + " ld " + std::to_string(key.lda) + "/" +
                 std::to_string(key.ldb) + "/" + std::to_string(key.ldc) + " batch " + std::to_string(key.batch) +
                 ": " + cublasGetStatusString(rc));
  plan->algo = results[0].algo;
  if (autotune_)
    for (int i = 1; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i].algo);
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void Gemm::tune(Plan& p, const float* alpha, const void* a, const void* b, void* c) {
  const float beta = 0;
  auto time_of = [&](const cublasLtMatmulAlgo_t& algo) {
    auto launch = [&] {
      return cublasLtMatmul(handle_, p.desc, alpha, a, p.a, b, p.b, &beta, c, p.c, c, p.c, &algo,
                            workspace_.tensor().data, kWorkspaceBytes, stream_);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) return INFINITY;  // a candidate may refuse these operands
    CUDA_CHECK(cudaEventRecord(tune_start_, stream_));
    for (int r = 0; r < kTunedRuns; ++r) CUBLAS_CHECK(launch());
    CUDA_CHECK(cudaEventRecord(tune_end_, stream_));
    CUDA_CHECK(cudaEventSynchronize(tune_end_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, tune_start_, tune_end_));
    return ms;
  };
  float best = time_of(p.algo);
  for (const cublasLtMatmulAlgo_t& algo : p.candidates)
    if (const float t = time_of(algo); t < best * (1 - kTuneMargin)) {
      best = t;
      p.algo = algo;
    }
  p.candidates.clear();
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same memory read
// column-major is the transpose, so cuBLAS gets B first and the dimensions swapped.
void Gemm::run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, MatrixRef A, MatrixRef B,
               float beta, MatrixRef C, int64_t batch) {
  if (A.dtype != B.dtype) throw UsageError("GEMM operands must share a dtype on the CUDA backend");
  if (M == 0 || N == 0 || batch == 0) return;
  const cublasComputeType_t compute =
      A.dtype == DType::F32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const bool batched = batch > 1;
  const Key key{trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                as_int(N, "N"),
                as_int(M, "M"),
                as_int(K, "K"),
                as_int(B.ld, "ldb"),
                as_int(A.ld, "lda"),
                as_int(C.ld, "ldc"),
                as_int(batch, "batch"),
                batched ? B.batch_stride : 0,
                batched ? A.batch_stride : 0,
                batched ? C.batch_stride : 0,
                int32_t(cuda_type(B.dtype)),
                int32_t(cuda_type(C.dtype)),
                int32_t(compute),
                alignment(B.data),
                alignment(A.data),
                alignment(C.data)};
  Plan& p = plan_for(key);
  void* c_data = const_cast<void*>(C.data);
  if (!p.candidates.empty() && beta == 0) {  // C only written: the candidates may write it too
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture == cudaStreamCaptureStatusNone) tune(p, &alpha, B.data, A.data, c_data);
  }
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, B.data, p.a, A.data, p.b, &beta, c_data, p.c, c_data, p.c,
                              &p.algo, workspace_.tensor().data, kWorkspaceBytes, stream_));
}

}  // namespace llmhpc::cuda

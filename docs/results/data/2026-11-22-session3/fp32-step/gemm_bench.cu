// The fp32 GEMMs of a medium (d 1024, ff 4096, vocab 10000) step at N tokens, as llmhpc calls
// them (row-major -> column-major swap), timed: cublasGemmEx default, each cublasLt heuristic
// algorithm, and PyTorch's split shapes (q|k|v, w1|w3 separate).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#define CK(x) do { auto e = (x); if (int(e) != 0) { std::printf("error %d at %s:%d\n", int(e), __FILE__, __LINE__); std::exit(1); } } while (0)

__global__ void fill(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = float(h & 0xffff) / 65536.f - 0.5f;
  }
}

cudaEvent_t e0, e1;
double time_ms(const std::function<void()>& f, int reps = 15) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(e0); f(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

cublasHandle_t h;
cublasLtHandle_t lt;
void* ws; const size_t kWs = 32u << 20;

// Row-major C(M,N) = op(A) op(B), as kernels/cuda/gemm.cu.
void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  float alpha = 1.f;
  CK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb,
                  A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void lt_all(const char* name, bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof(opb)));
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof(opa)));
  // column-major: first operand B (rows: tb ? K : N), second A
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, tb ? K : N, tb ? N : K, ldb));
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ta ? M : K, ta ? K : M, lda));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof(kWs)));
  cublasLtMatmulHeuristicResult_t res[12]; int n = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 12, res, &n));
  float alpha = 1.f, beta = 0.f;
  std::printf("LT %-22s", name);
  for (int i = 0; i < n; ++i) {
    double ms = time_ms([&] { CK(cublasLtMatmul(lt, op, &alpha, B, lb, A, la, &beta, C, lc, C, lc, &res[i].algo, ws, kWs, 0)); });
    int tile = 0, splitk = 0, red = 0, stages = 0; size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
    std::printf(" | %d:%.3f(t%d,s%d,k%d,r%d)", i, ms, tile, stages, splitk, red);
  }
  std::printf("\n");
  cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(op);
}

int main() {
  CK(cublasCreate(&h)); CK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, kWs)); CK(cublasSetWorkspace(h, ws, kWs));
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  const size_t big = size_t(4096) * 10000;
  float *x, *w, *y, *z;
  CK(cudaMalloc(&x, big * 4)); CK(cudaMalloc(&w, big * 4)); CK(cudaMalloc(&y, big * 4)); CK(cudaMalloc(&z, big * 4));
  fill<<<1024, 256>>>(x, big, 1); fill<<<1024, 256>>>(w, big, 2); fill<<<1024, 256>>>(y, big, 3);
  struct L { const char* name; int out, in, split; };
  const L lin[] = {{"qkv", 3072, 1024, 3}, {"o", 1024, 1024, 1}, {"w13", 8192, 1024, 2}, {"w2", 1024, 4096, 1}, {"head", 10000, 1024, 1}};
  for (int N : {4096, 2048}) {
    std::printf("=== N = %d tokens\n", N);
    for (const L& l : lin) {
      const int o = l.out, i = l.in, s = l.split, os = o / s;
      char nm[64];
      // fwd: y(N,o) = x(N,i) w(o,i)^T
      double f = time_ms([&] { gemm(false, true, N, o, i, x, i, w, i, 0.f, y, o); });
      double fs = time_ms([&] { for (int k = 0; k < s; ++k) gemm(false, true, N, os, i, x, i, w + size_t(k) * os * i, i, 0.f, y + size_t(k) * N * os, os); });
      // dx: dx(N,i) = dy(N,o) w(o,i)
      double d = time_ms([&] { gemm(false, false, N, i, o, y, o, w, i, 0.f, z, i); });
      double ds = time_ms([&] { for (int k = 0; k < s; ++k) gemm(false, false, N, i, os, y + size_t(k) * N * os, os, w + size_t(k) * os * i, i, k ? 1.f : 0.f, z, i); });
      // dw: dw(o,i) = dy(N,o)^T x(N,i)
      double g = time_ms([&] { gemm(true, false, o, i, N, y, o, x, i, 0.f, z, i); });
      double g1 = time_ms([&] { gemm(true, false, o, i, N, y, o, x, i, 1.f, z, i); });
      double gs = time_ms([&] { for (int k = 0; k < s; ++k) gemm(true, false, os, i, N, y + size_t(k) * N * os, os, x, i, 0.f, z + size_t(k) * os * i, i); });
      const double fl = 2.0 * N * o * i / 1e9;
      std::printf("GEMM %-5s N=%d  fwd %.3f (split %.3f)  dx %.3f (split %.3f)  dw %.3f (beta1 %.3f, split %.3f)  TFLOP/s fwd %.1f dx %.1f dw %.1f\n",
                  l.name, N, f, fs, d, ds, g, g1, gs, fl / f, fl / d, fl / g);
      std::snprintf(nm, sizeof nm, "%s fwd N%d", l.name, N); lt_all(nm, false, true, N, o, i, x, i, w, i, y, o);
      std::snprintf(nm, sizeof nm, "%s dx N%d", l.name, N); lt_all(nm, false, false, N, i, o, y, o, w, i, z, i);
      std::snprintf(nm, sizeof nm, "%s dw N%d", l.name, N); lt_all(nm, true, false, o, i, N, y, o, x, i, z, i);
    }
  }
  return 0;
}

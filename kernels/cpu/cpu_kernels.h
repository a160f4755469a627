// The readable reference kernels: plain loops (OpenMP across rows) and OpenBLAS GEMMs.
// Templated on the element type so the same code runs in fp32 (what users run) and fp64
// (the reference the tests and the CUDA backend are checked against). Reductions
// accumulate in double. Shapes follow kernels/ops.h.
#pragma once
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "src/core/check.h"
#include "src/core/dtype.h"
#include "kernels/ops.h"

namespace llmhpc::cpu {

constexpr double kRmsEps = 1e-5;

// ---- GEMM through OpenBLAS, row-major: C (M,N) = alpha * op(A) op(B) + beta * C --------
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// ---- embedding ------------------------------------------------------------------------
// wte (V,C) holds the rows [vocab_begin, vocab_begin + V) of the table: a token outside them
// reads a row of zeros (forward) and adds nothing (backward).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t V, int64_t C,
                       int64_t vocab_begin) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = int64_t(tokens[n]) - vocab_begin;
    if (row >= 0 && row < V) std::copy(wte + row * C, wte + (row + 1) * C, out + n * C);
    else std::fill(out + n * C, out + (n + 1) * C, T(0));
  }
}

// Threads own disjoint column blocks, so rows sharing a token never race.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t V, int64_t C, bool accumulate,
                        int64_t vocab_begin) {
  if (!accumulate) std::fill(dwte, dwte + V * C, T(0));
  const int64_t block = 64;
#pragma omp parallel for
  for (int64_t c0 = 0; c0 < C; c0 += block) {
    int64_t c1 = std::min(C, c0 + block);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = int64_t(tokens[n]) - vocab_begin;
      if (row < 0 || row >= V) continue;
      for (int64_t c = c0; c < c1; ++c) dwte[row * C + c] += dout[n * C + c];
    }
  }
}

// ---- RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) --------------------------
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    double r = 1.0 / std::sqrt(ss / C + kRmsEps);
    rstd[n] = T(r);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = T(xr[c] * r * w[c]);
  }
}

// dx_j += r g_j - r^3 x_j mean(g x), g = dout * w;  dw (=, or +=) dout * x * r summed over rows.
// dw is summed in double per fixed block of rows, and the blocks' sums added in block order, so
// its bits do not depend on the thread count or on which thread finishes first (a critical
// section per thread did: sharded and unsharded runs then differed in the last bits).
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N, int64_t C,
                      bool accumulate) {
  constexpr int64_t kRows = 64;
  const int64_t blocks = (N + kRows - 1) / kRows;
  std::vector<double> partial(size_t(blocks * C), 0.0);
#pragma omp parallel for
  for (int64_t b = 0; b < blocks; ++b) {
    double* dw_block = partial.data() + b * C;
    for (int64_t n = b * kRows; n < std::min(N, (b + 1) * kRows); ++n) {
      const T* xr = x + n * C;
      const T* dr = dout + n * C;
      double r = rstd[n], gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        gx += double(dr[c]) * w[c] * xr[c];
        dw_block[c] += double(dr[c]) * xr[c] * r;
      }
      double k = r * r * r * gx / C;
      for (int64_t c = 0; c < C; ++c) dx[n * C + c] += T(r * dr[c] * w[c] - k * xr[c]);
    }
  }
#pragma omp parallel for
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (int64_t b = 0; b < blocks; ++b) sum += partial[size_t(b * C + c)];
    dw[c] = accumulate ? T(dw[c] + sum) : T(sum);
  }
}

// ---- RoPE on the q and k parts of qkv (B,T,3,H,D) ---------------------------------------
// sign = +1 rotates forward; -1 applies the inverse (the backward of a rotation).
template <class T>
void rope_apply(T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double theta, double sign) {
  const int64_t half = D / 2;
  std::vector<double> cos_t(Tn * half), sin_t(Tn * half);
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double angle = double(t) * std::pow(theta, -2.0 * double(i) / double(D));
      cos_t[t * half + i] = std::cos(angle);
      sin_t[t * half + i] = sign * std::sin(angle);
    }
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t part = 0; part < 2; ++part)  // q, k
        for (int64_t h = 0; h < H; ++h) {
          T* v = qkv + (((b * Tn + t) * 3 + part) * H + h) * D;
          for (int64_t i = 0; i < half; ++i) {
            double c = cos_t[t * half + i], s = sin_t[t * half + i];
            double x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = T(x0 * c - x1 * s);
            v[2 * i + 1] = T(x0 * s + x1 * c);
          }
        }
}

// ---- naive attention: S = Q K^T / sqrt(D), P = softmax(S) (causal: j <= i), O = P V ------
// qkv (B,T,3,H,D), out (B,T,H,D), probs (B,H,T,T). One (b,h) pair per task.
template <class T>
void attention_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, bool causal) {
  const double scale = 1.0 / std::sqrt(double(D));
  const int64_t row = 3 * H * D;  // stride between positions in qkv
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const T* q = qkv + b * Tn * row + 0 * H * D + h * D;
      const T* k = qkv + b * Tn * row + 1 * H * D + h * D;
      const T* v = qkv + b * Tn * row + 2 * H * D + h * D;
      T* P = probs + (b * H + h) * Tn * Tn;
      std::vector<double> s(Tn), acc(D);
      for (int64_t i = 0; i < Tn; ++i) {
        const int64_t jmax = causal ? i + 1 : Tn;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < jmax; ++j) {
          double acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += double(q[i * row + d]) * k[j * row + d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < jmax; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < Tn; ++j) P[i * Tn + j] = j < jmax ? T(s[j] / sum) : T(0);
        T* o = out + (b * Tn + i) * H * D + h * D;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < jmax; ++j) {
          double p = P[i * Tn + j];
          for (int64_t d = 0; d < D; ++d) acc[d] += p * v[j * row + d];
        }
        for (int64_t d = 0; d < D; ++d) o[d] = T(acc[d]);
      }
    }
}

// dP = dO V^T; dS = P (dP - rowsum(dP P)); dQ = dS K s; dK = dS^T Q s; dV = P^T dO.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* probs, const T* qkv, int64_t B, int64_t Tn, int64_t H,
                        int64_t D, bool causal) {
  const double scale = 1.0 / std::sqrt(double(D));
  const int64_t row = 3 * H * D;
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const T* q = qkv + b * Tn * row + 0 * H * D + h * D;
      const T* k = qkv + b * Tn * row + 1 * H * D + h * D;
      const T* v = qkv + b * Tn * row + 2 * H * D + h * D;
      T* dq = dqkv + b * Tn * row + 0 * H * D + h * D;
      T* dk = dqkv + b * Tn * row + 1 * H * D + h * D;
      T* dv = dqkv + b * Tn * row + 2 * H * D + h * D;
      const T* P = probs + (b * H + h) * Tn * Tn;
      std::vector<double> dK(Tn * D, 0.0), dV(Tn * D, 0.0), ds(Tn), dQ(D);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* dO = dout + (b * Tn + i) * H * D + h * D;
        const int64_t jmax = causal ? i + 1 : Tn;
        double dot = 0;
        for (int64_t j = 0; j < jmax; ++j) {
          double dp = 0;
#pragma omp simd reduction(+ : dp)
          for (int64_t d = 0; d < D; ++d) dp += double(dO[d]) * v[j * row + d];
          ds[j] = dp;
          dot += dp * P[i * Tn + j];
        }
        std::fill(dQ.begin(), dQ.end(), 0.0);
        for (int64_t j = 0; j < jmax; ++j) {
          double p = P[i * Tn + j];
          double g = p * (ds[j] - dot) * scale;
          for (int64_t d = 0; d < D; ++d) {
            dQ[d] += g * k[j * row + d];
            dK[j * D + d] += g * q[i * row + d];
            dV[j * D + d] += p * dO[d];
          }
        }
        for (int64_t d = 0; d < D; ++d) dq[i * row + d] = T(dQ[d]);
      }
      for (int64_t j = 0; j < Tn; ++j)
        for (int64_t d = 0; d < D; ++d) {
          dk[j * row + d] = T(dK[j * D + d]);
          dv[j * row + d] = T(dV[j * D + d]);
        }
    }
}

// ---- SwiGLU: out = silu(a) * b with h = [a | b] -------------------------------------------
// The product in one place: the backward's recomputed copy must be the forward's bitwise.
inline double swiglu_value(double a, double b) { return a / (1.0 + std::exp(-a)) * b; }

template <class T>
void swiglu_forward(T* out, const T* h, int64_t N, int64_t F) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) out[n * F + f] = T(swiglu_value(h[n * 2 * F + f], h[n * 2 * F + F + f]));
}

// out (may be null) = swiglu_forward's out.
template <class T>
void swiglu_backward(T* dh, T* out, const T* dout, const T* h, int64_t N, int64_t F) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      double a = h[n * 2 * F + f], b = h[n * 2 * F + F + f], g = dout[n * F + f];
      double sig = 1.0 / (1.0 + std::exp(-a));
      dh[n * 2 * F + f] = T(g * b * sig * (1.0 + a * (1.0 - sig)));
      dh[n * 2 * F + F + f] = T(g * a * sig);
      if (out) out[n * F + f] = T(swiglu_value(a, b));
    }
}

// ---- cross-entropy -------------------------------------------------------------------------
template <class T>
double logsumexp_row(const T* x, int64_t V) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(x[i]) - mx);
  return mx + std::log(sum);
}

template <class T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    LLMHPC_CHECK(targets[n] >= 0 && targets[n] < V, "target id out of range");
    losses[n] = T(logsumexp_row(logits + n * V, V) - logits[n * V + targets[n]]);
  }
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, double scale, int64_t N, int64_t V) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const double lse = logsumexp_row(logits + n * V, V);
    const int64_t t = targets[n];
    for (int64_t i = 0; i < V; ++i) {  // reads logits[n, i] before writing dlogits[n, i]: aliasing is fine
      double p = std::exp(double(logits[n * V + i]) - lse);
      dlogits[n * V + i] = T((p - (i == t ? 1.0 : 0.0)) * scale);
    }
  }
}

// ---- vocabulary-parallel cross-entropy (Ops::cross_entropy_stats, _combine, _backward_lse) ---
// logits (N,V) hold the columns [vocab_begin, vocab_begin + V) of the vocabulary, the first
// `valid` of them real. stats (N,3): max, sum of exp(x - max) over the real columns, and the
// target's logit if the target is one of them (else 0).
template <class T>
void cross_entropy_stats(T* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t vocab_begin,
                         int64_t valid) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < valid; ++i) mx = std::max(mx, double(x[i]));
    double sum = 0;  // 0 when every real logit is -inf (or there are none)
    if (mx != -std::numeric_limits<double>::infinity())
      for (int64_t i = 0; i < valid; ++i) sum += std::exp(double(x[i]) - mx);
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    stats[n * 3 + 0] = T(mx);
    stats[n * 3 + 1] = T(sum);
    stats[n * 3 + 2] = t >= 0 && t < valid ? x[t] : T(0);
  }
}

// stats (R,N,3) -> lse (N) = M + log(sum_r s_r exp(m_r - M)), losses (N) = lse - sum_r target
// logit_r; a rank without real columns (m_r = -inf) adds nothing.
template <class T>
void cross_entropy_combine(T* losses, T* lse, const T* stats, int64_t N, int64_t R) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < R; ++r) mx = std::max(mx, double(stats[(r * N + n) * 3]));
    double sum = 0, target = 0;
    for (int64_t r = 0; r < R; ++r) {
      const T* s = stats + (r * N + n) * 3;
      if (double(s[0]) != -std::numeric_limits<double>::infinity()) sum += double(s[1]) * std::exp(double(s[0]) - mx);
      target += double(s[2]);
    }
    const double l = mx + std::log(sum);
    lse[n] = T(l);
    losses[n] = T(l - target);
  }
}

template <class T>
void cross_entropy_backward_lse(T* dlogits, const T* logits, const int32_t* targets, const T* lse, double scale,
                                int64_t N, int64_t V, int64_t vocab_begin, int64_t valid) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const double l = double(lse[n]);
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    for (int64_t i = 0; i < V; ++i) {  // reads logits[n, i] before writing dlogits[n, i]: aliasing is fine
      if (i >= valid) {
        dlogits[n * V + i] = T(0);
        continue;
      }
      const double p = std::exp(double(logits[n * V + i]) - l);
      dlogits[n * V + i] = T((p - (i == t ? 1.0 : 0.0)) * scale);
    }
  }
}

// ---- AdamW, in the order torch.optim.AdamW (single-tensor) does it -----------------------
// The gradient is first multiplied by grad_scale (clipping's factor; 1: none), in T.
template <class T>
void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps, double wd,
                double grad_scale, int64_t step) {
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, double(step)));
  const T decay = T(1.0 - lr * wd), step_size = T(lr / bc1), b1 = T(1.0 - beta1), b2 = T(beta2),
          one_minus_b2 = T(1.0 - beta2), c2 = T(bc2_sqrt), e = T(eps), gs = T(grad_scale);
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    p[i] *= decay;
    m[i] += b1 * (gi - m[i]);  // lerp(m, g, 1 - beta1)
    v[i] = v[i] * b2 + one_minus_b2 * gi * gi;
    T denom = std::sqrt(v[i]) / c2 + e;
    p[i] -= step_size * (m[i] / denom);
  }
}

// ---- the sum of squares: gradient clipping's norm ---------------------------------------
// Fixed chunks of the spans' elements, taken in turn, each summed in double in parallel, then
// the chunks' sums added in order: the same sum whatever the number of threads.
template <class T>
double sum_of_squares(const T* x, const std::vector<Span>& spans) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<std::pair<const T*, int64_t>> chunks;
  for (const Span& s : spans)
    for (int64_t i = 0; i < s.size; i += kChunk) chunks.push_back({x + s.at + i, std::min(kChunk, s.size - i)});
  std::vector<double> sums(chunks.size());
#pragma omp parallel for
  for (size_t c = 0; c < chunks.size(); ++c) {
    double sum = 0;
    for (int64_t i = 0; i < chunks[c].second; ++i) sum += double(chunks[c].first[i]) * double(chunks[c].first[i]);
    sums[c] = sum;
  }
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

// ---- random values -----------------------------------------------------------------------
// Ops::random_normal into n elements of dtype t (random_fill.cpp: compiled without fused
// multiply-adds, so the values are the CUDA kernel's bitwise).
void random_normal(void* dst, DType t, int64_t n, uint64_t seed, uint64_t stream, double std, double bound);

}  // namespace llmhpc::cpu

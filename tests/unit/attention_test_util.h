// Attention test helpers shared by the CPU flash tests (tests/unit/test_flash_cpu.cpp) and
// the GPU ones (tests/cuda/test_flash_attn.cpp): what a run computes, error measures, and
// naive attention in a low precision, the yardstick of flash-attention's "at most twice the
// same-precision naive error" rule. Shapes are any struct with B, T, H, D; qkv is packed
// (B,T,3,H,D) and out/dout (B,T,H,D), all as doubles.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/core/dtype.h"

namespace llmhpc::test {

// What one precision computes: the forward's out and L, and the backward's dqkv.
struct AttentionResult {
  std::vector<double> out, lse, dqkv;
};

// max |a - b|; an element that is not finite (never written, or overflowed) fails any bound.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The part of dqkv (B,T,3,H,D) that is dq (part 0), dk (1) or dv (2).
template <class Shape>
std::vector<double> part(const std::vector<double>& dqkv, const Shape& s, int which) {
  std::vector<double> out;
  for (int64_t bt = 0; bt < s.B * s.T; ++bt)
    for (int64_t hd = 0; hd < s.H * s.D; ++hd) out.push_back(dqkv[(bt * 3 + which) * s.H * s.D + hd]);
  return out;
}

// Naive attention in a low precision: fp32 arithmetic; with `bf16`, every stored
// intermediate (S, P, O, dP, dS and the gradients) rounded to bf16, as the CUDA backend's
// naive path stores them.
template <class Shape>
AttentionResult naive_low_precision(const std::vector<double>& qkv, const std::vector<double>& dout, const Shape& s,
                                    bool causal, bool bf16) {
  auto st = [&](float x) { return bf16 ? round_to_bf16(x) : x; };  // a stored intermediate
  const int64_t T = s.T, D = s.D, row = 3 * s.H * D, orow = s.H * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  std::vector<double> out(dout.size()), dqkv(qkv.size(), 0.0);
  std::vector<float> S(T * T), P(T * T), dP(T * T), dS(T * T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      auto q = [&](int64_t t, int64_t d) { return float(qkv[(b * T + t) * row + h * D + d]); };
      auto k = [&](int64_t t, int64_t d) { return float(qkv[(b * T + t) * row + s.H * D + h * D + d]); };
      auto v = [&](int64_t t, int64_t d) { return float(qkv[(b * T + t) * row + 2 * s.H * D + h * D + d]); };
      auto dO = [&](int64_t t, int64_t d) { return float(dout[(b * T + t) * orow + h * D + d]); };
      auto visible = [&](int64_t i, int64_t j) { return !causal || j <= i; };
      for (int64_t i = 0; i < T; ++i) {
        float mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          float acc = 0.f;
          for (int64_t d = 0; d < D; ++d) acc += q(i, d) * k(j, d);
          S[i * T + j] = st(acc * scale);
          if (visible(i, j)) mx = std::max(mx, S[i * T + j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < T; ++j) sum += visible(i, j) ? std::exp(S[i * T + j] - mx) : 0.f;
        for (int64_t j = 0; j < T; ++j) P[i * T + j] = visible(i, j) ? st(std::exp(S[i * T + j] - mx) / sum) : 0.f;
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < T; ++j) acc += P[i * T + j] * v(j, d);
          out[(b * T + i) * orow + h * D + d] = st(acc);
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          float acc = 0.f;
          for (int64_t d = 0; d < D; ++d) acc += dO(i, d) * v(j, d);
          dP[i * T + j] = st(acc);
        }
        float dot = 0.f;
        for (int64_t j = 0; j < T; ++j) dot += dP[i * T + j] * P[i * T + j];
        for (int64_t j = 0; j < T; ++j) dS[i * T + j] = st(P[i * T + j] * (dP[i * T + j] - dot));
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          float dq = 0.f, dk = 0.f, dv = 0.f;
          for (int64_t j = 0; j < T; ++j) {
            dq += dS[t * T + j] * k(j, d);
            dk += dS[j * T + t] * q(j, d);
            dv += P[j * T + t] * dO(j, d);
          }
          dqkv[(b * T + t) * row + h * D + d] = st(dq * scale);
          dqkv[(b * T + t) * row + s.H * D + h * D + d] = st(dk * scale);
          dqkv[(b * T + t) * row + 2 * s.H * D + h * D + d] = st(dv);
        }
    }
  return {out, {}, dqkv};
}

}  // namespace llmhpc::test

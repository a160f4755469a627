// FlashAttention-2 on the CPU: the readable reference of the tiled algorithm that the CUDA
// kernels (kernels/cuda/flash_attn/) implement. Same contract as naive attention in
// cpu_kernels.h (qkv (B,T,3,H,D) packed, out (B,T,H,D), scale 1/sqrt(D), causal: key j <= query
// i), but what forward saves is the logsumexp L (B,H,T) of every query row instead of the
// (B,H,T,T) probabilities, and nothing of size T x T is ever allocated: the largest
// temporaries are one tile of scores (tile_q x tile_k) and per-(b,h) accumulators of T x D.
//
// Templated on the element type like cpu_kernels.h: fp32 (what users run) and fp64 (the
// reference). Arithmetic is in double, as everywhere on the CPU backend; only the stored
// results (out, L, dqkv) are rounded to T. Tile sizes are arguments so the tests can use
// tiles that do and do not divide the sequence length.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace llmhpc::cpu {

constexpr int64_t kFlashTileQ = 32;  // queries per tile
constexpr int64_t kFlashTileK = 32;  // keys per tile

namespace flash_detail {

// Views of one (b, h) pair in the packed layouts. Row t of q/k/v is at `t * qkv_row`.
struct HeadView {
  int64_t qkv_row;  // 3*H*D: elements between consecutive positions of qkv
  int64_t out_row;  // H*D: elements between consecutive positions of out
  int64_t q, k, v;  // offsets of q, k, v of position 0 of this (b, h) in qkv
  int64_t o;        // offset of position 0 of this (b, h) in out
  int64_t lse;      // offset of this (b, h)'s row of L (B,H,T)
};

inline HeadView head_view(int64_t b, int64_t h, int64_t Tn, int64_t H, int64_t D) {
  const int64_t row = 3 * H * D;
  return {row,
          H * D,
          b * Tn * row + h * D,
          b * Tn * row + H * D + h * D,
          b * Tn * row + 2 * H * D + h * D,
          b * Tn * H * D + h * D,
          (b * H + h) * Tn};
}

// Key tiles [0, key_tile_end) can see some query of [q0, q1); later ones are fully masked.
inline int64_t visible_key_end(int64_t q1, int64_t Tn, bool causal) { return causal ? std::min(q1, Tn) : Tn; }

// First query a key tile starting at k0 is visible to (earlier query tiles are skipped).
inline int64_t first_visible_query(int64_t k0, bool causal) { return causal ? k0 : 0; }

}  // namespace flash_detail

// Forward. For each (b, h) and each tile of queries [q0, q1):
//   m_i = -inf, l_i = 0, acc_i = 0                                  (running max, sum, output)
//   for each tile of keys [k0, k1) that the tile can see (causal: k0 < q1):
//     s_ij = q_i . k_j * scale          (-inf where j > i under causal)
//     m_new = max(m_i, max_j s_ij);  c = exp(m_i - m_new)
//     p_ij = exp(s_ij - m_new);  l_i = c l_i + sum_j p_ij;  acc_i = c acc_i + sum_j p_ij v_j
//     m_i = m_new
//   out_i = acc_i / l_i,  L_i = m_i + log(l_i)
// out (B,T,H,D), lse (B,H,T), qkv (B,T,3,H,D).
template <class T>
void flash_attention_forward(T* out, T* lse, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, bool causal,
                             int64_t tile_q = kFlashTileQ, int64_t tile_k = kFlashTileK) {
  const double scale = 1.0 / std::sqrt(double(D));
  const double neg_inf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const flash_detail::HeadView hv = flash_detail::head_view(b, h, Tn, H, D);
      std::vector<double> s(tile_q * tile_k), m(tile_q), l(tile_q), acc(tile_q * D);
      for (int64_t q0 = 0; q0 < Tn; q0 += tile_q) {
        const int64_t q1 = std::min(Tn, q0 + tile_q), nq = q1 - q0;
        std::fill(m.begin(), m.end(), neg_inf);
        std::fill(l.begin(), l.end(), 0.0);
        std::fill(acc.begin(), acc.end(), 0.0);
        const int64_t key_end = flash_detail::visible_key_end(q1, Tn, causal);
        for (int64_t k0 = 0; k0 < key_end; k0 += tile_k) {
          const int64_t k1 = std::min(Tn, k0 + tile_k), nk = k1 - k0;
          // Scores of the tile, masked.
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t j = 0; j < nk; ++j) {
              if (causal && k0 + j > q0 + i) {
                s[i * tile_k + j] = neg_inf;
                continue;
              }
              const T* qi = qkv + hv.q + (q0 + i) * hv.qkv_row;
              const T* kj = qkv + hv.k + (k0 + j) * hv.qkv_row;
              double dot = 0;
              for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
              s[i * tile_k + j] = dot * scale;
            }
          // Online softmax: rescale what was accumulated so far to the new running max.
          for (int64_t i = 0; i < nq; ++i) {
            double tile_max = neg_inf;
            for (int64_t j = 0; j < nk; ++j) tile_max = std::max(tile_max, s[i * tile_k + j]);
            const double m_new = std::max(m[i], tile_max);
            if (m_new == neg_inf) continue;                    // every key so far is masked for this row
            const double correction = std::exp(m[i] - m_new);  // 0 when m[i] was -inf
            double* acc_i = &acc[i * D];
            l[i] *= correction;
            for (int64_t d = 0; d < D; ++d) acc_i[d] *= correction;
            for (int64_t j = 0; j < nk; ++j) {
              const double p = std::exp(s[i * tile_k + j] - m_new);  // 0 for masked keys
              if (p == 0.0) continue;
              l[i] += p;
              const T* vj = qkv + hv.v + (k0 + j) * hv.qkv_row;
              for (int64_t d = 0; d < D; ++d) acc_i[d] += p * double(vj[d]);
            }
            m[i] = m_new;
          }
        }
        for (int64_t i = 0; i < nq; ++i) {
          T* o = out + hv.o + (q0 + i) * hv.out_row;
          for (int64_t d = 0; d < D; ++d) o[d] = T(acc[i * D + d] / l[i]);
          lse[hv.lse + q0 + i] = T(m[i] + std::log(l[i]));
        }
      }
    }
}

// Backward, from dout (B,T,H,D), the forward's out and lse, and qkv; writes dqkv (B,T,3,H,D).
//   D_i = dO_i . O_i                                   (rowsum(dO * O), once per row)
//   for each tile of keys [k0, k1):                    (dK, dV of the tile stay local)
//     for each tile of queries [q0, q1) that can see it (causal: q1 > k0):
//       p_ij  = exp(q_i . k_j * scale - L_i)           (P recomputed from L; 0 if masked)
//       dV_j += sum_i p_ij dO_i
//       dp_ij = dO_i . v_j
//       ds_ij = p_ij (dp_ij - D_i)
//       dK_j += scale * sum_i ds_ij q_i
//       dQ_i += scale * sum_j ds_ij k_j                (dQ accumulates over key tiles: T x D)
// The identity sum_j p_ij dp_ij = dO_i . O_i is what lets D_i replace the row sums over a
// whole row of P that naive attention needs.
template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, int64_t B, int64_t Tn,
                              int64_t H, int64_t D, bool causal, int64_t tile_q = kFlashTileQ,
                              int64_t tile_k = kFlashTileK) {
  const double scale = 1.0 / std::sqrt(double(D));
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const flash_detail::HeadView hv = flash_detail::head_view(b, h, Tn, H, D);
      std::vector<double> delta(Tn), dq(Tn * D, 0.0), dk(tile_k * D), dv(tile_k * D), p(tile_q * tile_k),
          ds(tile_q * tile_k);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* doi = dout + hv.o + i * hv.out_row;
        const T* oi = out + hv.o + i * hv.out_row;
        double sum = 0;
        for (int64_t d = 0; d < D; ++d) sum += double(doi[d]) * double(oi[d]);
        delta[i] = sum;
      }
      for (int64_t k0 = 0; k0 < Tn; k0 += tile_k) {
        const int64_t k1 = std::min(Tn, k0 + tile_k), nk = k1 - k0;
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        const int64_t first_q = flash_detail::first_visible_query(k0, causal) / tile_q * tile_q;
        for (int64_t q0 = first_q; q0 < Tn; q0 += tile_q) {
          const int64_t q1 = std::min(Tn, q0 + tile_q), nq = q1 - q0;
          // P and dS of the tile.
          for (int64_t i = 0; i < nq; ++i) {
            const T* qi = qkv + hv.q + (q0 + i) * hv.qkv_row;
            const T* doi = dout + hv.o + (q0 + i) * hv.out_row;
            for (int64_t j = 0; j < nk; ++j) {
              double& pij = p[i * tile_k + j];
              double& dsij = ds[i * tile_k + j];
              if (causal && k0 + j > q0 + i) {
                pij = dsij = 0.0;
                continue;
              }
              const T* kj = qkv + hv.k + (k0 + j) * hv.qkv_row;
              const T* vj = qkv + hv.v + (k0 + j) * hv.qkv_row;
              double s = 0, dp = 0;
              for (int64_t d = 0; d < D; ++d) {
                s += double(qi[d]) * double(kj[d]);
                dp += double(doi[d]) * double(vj[d]);
              }
              pij = std::exp(s * scale - double(lse[hv.lse + q0 + i]));
              dsij = pij * (dp - delta[q0 + i]);
            }
          }
          // Their products with the tile's rows.
          for (int64_t i = 0; i < nq; ++i) {
            const T* qi = qkv + hv.q + (q0 + i) * hv.qkv_row;
            const T* doi = dout + hv.o + (q0 + i) * hv.out_row;
            double* dqi = &dq[(q0 + i) * D];
            for (int64_t j = 0; j < nk; ++j) {
              const double pij = p[i * tile_k + j], dsij = ds[i * tile_k + j];
              if (pij == 0.0 && dsij == 0.0) continue;
              const T* kj = qkv + hv.k + (k0 + j) * hv.qkv_row;
              for (int64_t d = 0; d < D; ++d) {
                dv[j * D + d] += pij * double(doi[d]);
                dk[j * D + d] += dsij * double(qi[d]);
                dqi[d] += dsij * double(kj[d]);
              }
            }
          }
        }
        for (int64_t j = 0; j < nk; ++j) {
          T* dkj = dqkv + hv.k + (k0 + j) * hv.qkv_row;
          T* dvj = dqkv + hv.v + (k0 + j) * hv.qkv_row;
          for (int64_t d = 0; d < D; ++d) {
            dkj[d] = T(dk[j * D + d] * scale);
            dvj[d] = T(dv[j * D + d]);
          }
        }
      }
      for (int64_t i = 0; i < Tn; ++i) {
        T* dqi = dqkv + hv.q + i * hv.qkv_row;
        for (int64_t d = 0; d < D; ++d) dqi[d] = T(dq[i * D + d] * scale);
      }
    }
}

}  // namespace llmhpc::cpu

// Every CPU op: forward against a plain reference written here from the definition, and
// backward against central finite differences, in fp64 on tiny shapes. Plus fp32 against
// fp64 on the same inputs. Backward checks use L = <R, out> with a random R, so the
// analytic gradient is backward(dout = R).
#include <gtest/gtest.h>
#include <omp.h>

#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

constexpr double kFdTol = 1e-7;  // fp64 central differences, eps 1e-6

class CpuOps : public ::testing::Test {
 protected:
  Backend be = cpu_backend();
  Device& dev = *be.device;
  Ops& ops = *be.ops;
  std::mt19937_64 rng{1234};
  HostTensor make(Shape s, DType t = DType::F64) { return HostTensor(dev, t, s); }
  HostTensor randn(Shape s, DType t = DType::F64, double std = 1.0) {
    HostTensor x(dev, t, s);
    x.fill_normal(rng, std);
    return x;
  }
  HostTensor tokens(Shape s, int64_t vocab) {
    HostTensor x(dev, DType::I32, s);
    for (int64_t i = 0; i < x.size(); ++i) x.set(i, double(rng() % uint64_t(vocab)));
    return x;
  }
};

TEST_F(CpuOps, EmbeddingForwardGathersRowsAndBackwardScatterAdds) {
  const int64_t V = 7, C = 5, B = 2, T = 4;
  HostTensor wte = randn({V, C}), out = make({B, T, C}), tok = tokens({B, T}, V);
  tok.set(0, 3);
  tok.set(5, 3);  // a token used twice must accumulate
  ops.embedding_forward(out, tok, wte);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out.get(n * C + c), wte.get(int64_t(tok.get(n)) * C + c));
  HostTensor R = randn({B, T, C}), dwte = randn({V, C});  // stale values: overwritten
  ops.embedding_backward(dwte, R, tok, false);
  auto fd = finite_difference(wte, [&] {
    ops.embedding_forward(out, tok, wte);
    return dot(out, R);
  });
  EXPECT_LT(rel_error(dwte.values(), fd), kFdTol);
  ops.embedding_backward(dwte, R, tok, true);  // accumulate: twice the gradient
  for (int64_t i = 0; i < V * C; ++i) EXPECT_NEAR(dwte.get(i), 2 * fd[i], 1e-6);
}

// A table split by rows across ranks (vocab_begin): each part looks up the tokens in its rows
// and gives zeros for the others, so the parts' outputs add up to the whole table's, exactly;
// each part's gradient is its slice of the whole table's, overwritten or accumulated.
TEST_F(CpuOps, EmbeddingSplitByVocabBeginAddsUpToTheWholeTable) {
  for (DType dt : {DType::F64, DType::F32}) {
    const int64_t V = 10, C = 6, N = 16;
    const std::vector<int64_t> begins = {0, 4, 8, 10};  // parts of 4, 4 and 2 rows
    HostTensor wte = randn({V, C}, dt), tok = tokens({N}, V), R = randn({N, C}, dt);
    for (int64_t n : {0, 1, 2, 3, 4}) tok.set(n, double(std::vector<int64_t>{0, V - 1, 4, 3, 3}[size_t(n)]));
    HostTensor whole = make({N, C}, dt), dwhole = make({V, C}, dt), dwhole_acc = randn({V, C}, dt);
    const std::vector<double> acc_before = dwhole_acc.values();
    ops.embedding_forward(whole, tok, wte);
    ops.embedding_backward(dwhole, R, tok, false);
    ops.embedding_backward(dwhole_acc, R, tok, true);
    std::vector<double> sum(size_t(N * C), 0.0);
    for (size_t p = 0; p + 1 < begins.size(); ++p) {
      const int64_t begin = begins[p], rows = begins[p + 1] - begin;
      const std::string what = std::string(dtype_name(dt)) + " part " + std::to_string(p);
      HostTensor part = make({rows, C}, dt), out = randn({N, C}, dt);  // out's stale values are overwritten
      for (int64_t i = 0; i < rows * C; ++i) part.set(i, wte.get(begin * C + i));
      ops.embedding_forward(out, tok, part, begin);
      int64_t hits = 0;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t t = int64_t(tok.get(n));
        const bool mine = t >= begin && t < begin + rows;
        hits += mine;
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(out.get(n * C + c), mine ? wte.get(t * C + c) : 0.0) << what << " row " << n << " col " << c;
      }
      EXPECT_GT(hits, 0) << what << ": no token in this part, nothing tested";
      EXPECT_LT(hits, N) << what << ": every token in this part, nothing tested";
      for (int64_t i = 0; i < N * C; ++i) sum[size_t(i)] += out.get(i);

      HostTensor dpart = randn({rows, C}, dt), dpart_acc = make({rows, C}, dt);  // dpart's stale values: overwritten
      for (int64_t i = 0; i < rows * C; ++i) dpart_acc.set(i, acc_before[size_t(begin * C + i)]);
      ops.embedding_backward(dpart, R, tok, false, begin);
      ops.embedding_backward(dpart_acc, R, tok, true, begin);
      for (int64_t i = 0; i < rows * C; ++i) {
        ASSERT_EQ(dpart.get(i), dwhole.get(begin * C + i)) << what << " element " << i;
        ASSERT_EQ(dpart_acc.get(i), dwhole_acc.get(begin * C + i)) << what << " accumulated, element " << i;
      }
    }
    EXPECT_EQ(sum, whole.values()) << dtype_name(dt);
  }
}

TEST_F(CpuOps, RmsNormMatchesDefinitionAndFiniteDifferences) {
  const int64_t N = 3, C = 6;
  HostTensor x = randn({N, C}), w = randn({C}), out = make({N, C}), rstd = make({N});
  ops.rmsnorm_forward(out, rstd, x, w);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x.get(n * C + c) * x.get(n * C + c) / C;
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(out.get(n * C + c), x.get(n * C + c) / std::sqrt(ms + 1e-5) * w.get(c), 1e-12);
  }
  HostTensor R = randn({N, C}), dx = make({N, C}), dw = randn({C});  // dw's stale values are overwritten
  ops.rmsnorm_backward(dx, dw, R, x, w, rstd, false, Tensor());
  auto loss = [&] {
    ops.rmsnorm_forward(out, rstd, x, w);
    return dot(out, R);
  };
  EXPECT_LT(rel_error(dx.values(), finite_difference(x, loss)), kFdTol);
  EXPECT_LT(rel_error(dw.values(), finite_difference(w, loss)), kFdTol);
}

TEST_F(CpuOps, RmsNormBackwardAlwaysAccumulatesDxAndDwOnRequest) {
  const int64_t N = 2, C = 4;
  HostTensor x = randn({N, C}), w = randn({C}), out = make({N, C}), rstd = make({N}), R = randn({N, C});
  ops.rmsnorm_forward(out, rstd, x, w);
  HostTensor dx1 = make({N, C}), dw1 = make({C}), dx2 = randn({N, C}), dw2 = randn({C});
  const std::vector<double> before = dx2.values(), dw_before = dw2.values();
  ops.rmsnorm_backward(dx1, dw1, R, x, w, rstd, false, Tensor());
  ops.rmsnorm_backward(dx2, dw2, R, x, w, rstd, true, Tensor());
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(dx2.get(i), before[i] + dx1.get(i), 1e-12);
  for (int64_t i = 0; i < C; ++i) EXPECT_NEAR(dw2.get(i), dw_before[i] + dw1.get(i), 1e-12);
  // dx_copy: the new dx in the copy's dtype, as convert writes it.
  HostTensor copy = make({N, C}, DType::BF16), converted = make({N, C}, DType::BF16);
  ops.rmsnorm_backward(dx2, dw2, R, x, w, rstd, true, copy);
  ops.convert(converted, dx2);
  EXPECT_EQ(copy.values(), converted.values());
  EXPECT_NE(copy.values(), std::vector<double>(size_t(N * C), 0.0)) << "the copy was written";
}

// The norm gain's gradient sums over rows; its bits must not depend on how many threads share
// them (ranks training sharded and unsharded compare their weights bitwise).
TEST_F(CpuOps, RmsNormBackwardGivesTheSameBitsWithAnyThreadCount) {
  const int64_t N = 1000, C = 48;  // many row blocks
  HostTensor x = randn({N, C}, DType::F32), w = randn({C}, DType::F32), R = randn({N, C}, DType::F32);
  HostTensor out = make({N, C}, DType::F32), rstd = make({N}, DType::F32);
  ops.rmsnorm_forward(out, rstd, x, w);
  std::vector<std::vector<double>> dws, dxs;
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    HostTensor dx = make({N, C}, DType::F32), dw = make({C}, DType::F32);
    ops.rmsnorm_backward(dx, dw, R, x, w, rstd, false, Tensor());
    dws.push_back(dw.values());
    dxs.push_back(dx.values());
  }
  omp_set_num_threads(threads_before);
  for (size_t i = 1; i < dws.size(); ++i) {
    EXPECT_EQ(dws[i], dws[0]) << "dw differs between 1 thread and run " << i;
    EXPECT_EQ(dxs[i], dxs[0]) << "dx differs between 1 thread and run " << i;
  }
}

// Gradient clipping's norm: the squares of the spans' elements only (empty spans and what no
// span covers left out), in fp32 and fp64, and the same bits with any thread count (ranks
// holding the same gradients must clip by the same factor).
TEST_F(CpuOps, SumOfSquaresAddsTheSpansAloneWithTheSameBitsOnAnyThreadCount) {
  const int64_t n = 200003;  // more than one of the op's chunks
  for (DType dt : {DType::F32, DType::F64}) {
    HostTensor x = randn({n}, dt), out = make({1}, DType::F64);
    const std::vector<Span> spans = {{5, 70000}, {70005, 0}, {100000, 100003}};
    long double expected = 0;
    for (const Span& s : spans)
      for (int64_t i = s.at; i < s.at + s.size; ++i) expected += (long double)x.get(i) * x.get(i);
    std::vector<double> sums;
    const int threads_before = omp_get_max_threads();
    for (int threads : {1, 2, 3, 8}) {
      omp_set_num_threads(threads);
      ops.sum_of_squares(out, x, spans);
      sums.push_back(out.get(0));
    }
    omp_set_num_threads(threads_before);
    EXPECT_NEAR(sums[0], double(expected), 1e-12 * double(expected)) << dtype_name(dt);
    for (size_t i = 1; i < sums.size(); ++i) EXPECT_EQ(sums[i], sums[0]) << dtype_name(dt) << ", run " << i;
    ops.sum_of_squares(out, x, {});
    EXPECT_EQ(out.get(0), 0.0) << "no spans, no squares";
  }
}

TEST_F(CpuOps, ResidualRmsNormIsAddThenNorm) {
  const int64_t N = 3, C = 4;
  HostTensor x = randn({N, C}), d = randn({N, C}), w = randn({C});
  HostTensor x_out = make({N, C}), out = make({N, C}), rstd = make({N});
  ops.residual_rmsnorm_forward(x_out, out, rstd, x, d, w);
  HostTensor sum = make({N, C}), ref = make({N, C}), rstd_ref = make({N});
  for (int64_t i = 0; i < N * C; ++i) sum.set(i, x.get(i) + d.get(i));
  ops.rmsnorm_forward(ref, rstd_ref, sum, w);
  EXPECT_EQ(x_out.values(), sum.values());
  EXPECT_EQ(out.values(), ref.values());
}

TEST_F(CpuOps, LinearIsXTimesWTransposedAndGradientsMatch) {
  const int64_t N = 3, In = 4, Out = 5;
  HostTensor x = randn({N, In}), w = randn({Out, In}), y = make({N, Out});
  ops.linear_forward(y, x, w);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < In; ++i) s += x.get(n * In + i) * w.get(o * In + i);
      EXPECT_NEAR(y.get(n * Out + o), s, 1e-12);
    }
  HostTensor R = randn({N, Out}), dx = make({N, In}), dw = randn({Out, In});  // stale dw: overwritten
  ops.linear_backward(dx, dw, R, x, w, false);
  auto loss = [&] {
    ops.linear_forward(y, x, w);
    return dot(y, R);
  };
  EXPECT_LT(rel_error(dx.values(), finite_difference(x, loss)), kFdTol);
  EXPECT_LT(rel_error(dw.values(), finite_difference(w, loss)), kFdTol);
  // With accumulate, a second backward (here without dx) doubles dw.
  const std::vector<double> once = dw.values();
  ops.linear_backward(Tensor(), dw, R, x, w, true);
  for (int64_t i = 0; i < Out * In; ++i) EXPECT_NEAR(dw.get(i), 2 * once[i], 1e-12);
  // Without dw (and x), only dx is written.
  const std::vector<double> dx_once = dx.values();
  for (int64_t i = 0; i < N * In; ++i) dx.set(i, 7.0);
  ops.linear_backward(dx, Tensor(), R, Tensor(), w, false);
  EXPECT_EQ(dx.values(), dx_once);
  for (int64_t i = 0; i < Out * In; ++i) EXPECT_NEAR(dw.get(i), 2 * once[i], 1e-12);
}

TEST_F(CpuOps, RopeRotatesInterleavedPairsOfQAndKOnly) {
  const int64_t B = 2, T = 5, H = 2, D = 4;
  const double theta = 10000.0;
  HostTensor qkv = randn({B, T, 3 * H * D});
  const std::vector<double> orig = qkv.values();
  ops.rope_forward(qkv, H, theta);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            const int64_t at = (((b * T + t) * 3 + part) * H + h) * D + 2 * i;
            const double x0 = orig[at], x1 = orig[at + 1];
            if (part == 2) {  // v is not rotated
              EXPECT_EQ(qkv.get(at), x0);
              continue;
            }
            // (x0 + i x1) * e^{i t theta^(-2i/D)}
            const double a = t * std::pow(theta, -2.0 * i / D);
            EXPECT_NEAR(qkv.get(at), x0 * std::cos(a) - x1 * std::sin(a), 1e-12);
            EXPECT_NEAR(qkv.get(at + 1), x0 * std::sin(a) + x1 * std::cos(a), 1e-12);
          }
  // Backward of a rotation: FD on L = <R, rope(x)>.
  HostTensor x = randn({B, T, 3 * H * D}), R = randn({B, T, 3 * H * D}), y = make({B, T, 3 * H * D});
  HostTensor g = make({B, T, 3 * H * D});
  g.copy_from(R);
  ops.rope_backward(g, H, theta);
  auto fd = finite_difference(x, [&] {
    y.copy_from(x);
    ops.rope_forward(y, H, theta);
    return dot(y, R);
  });
  EXPECT_LT(rel_error(g.values(), fd), kFdTol);
}

// Attention from the definition: softmax(q k^T / sqrt(D) + mask) v, one (b, h) at a time.
std::vector<double> reference_attention(const HostTensor& qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                        bool causal) {
  std::vector<double> out(B * T * H * D, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return qkv.get((((b * T + t) * 3 + part) * H + h) * D + d);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += s[j] / z * at(b, j, 2, h, d);
          out[((b * T + i) * H + h) * D + d] = o;
        }
      }
  return out;
}

class CpuAttention : public CpuOps, public ::testing::WithParamInterface<bool> {};

TEST_P(CpuAttention, NaiveMatchesDefinitionAndFiniteDifferences) {
  const bool causal = GetParam();
  const int64_t B = 2, T = 5, H = 2, D = 4;
  const AttentionDims dims{B, T, H, D, causal, AttentionKind::Naive};
  const SavedSpec spec = ops.attention_saved(dims, DType::F64);
  HostTensor qkv = randn({B, T, 3 * H * D}), out = make({B, T, H * D}), saved = make(spec.shape);
  ops.attention_forward(out, saved, qkv, dims);
  EXPECT_LT(rel_error(out.values(), reference_attention(qkv, B, T, H, D, causal)), 1e-12);
  HostTensor R = randn({B, T, H * D}), dqkv = make({B, T, 3 * H * D});
  ops.attention_backward(dqkv, R, out, saved, qkv, dims);
  auto fd = finite_difference(qkv, [&] {
    ops.attention_forward(out, saved, qkv, dims);
    return dot(out, R);
  });
  EXPECT_LT(rel_error(dqkv.values(), fd), kFdTol);
}

INSTANTIATE_TEST_SUITE_P(CausalAndNot, CpuAttention, ::testing::Bool());

TEST_F(CpuOps, SwigluMatchesDefinitionAndFiniteDifferences) {
  const int64_t N = 3, F = 4;
  HostTensor h = randn({N, 2 * F}), out = make({N, F});
  ops.swiglu_forward(out, h);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double a = h.get(n * 2 * F + f), b = h.get(n * 2 * F + F + f);
      EXPECT_NEAR(out.get(n * F + f), a / (1 + std::exp(-a)) * b, 1e-12);
    }
  HostTensor R = randn({N, F}), dh = make({N, 2 * F}), again = make({N, F});
  ops.swiglu_backward(dh, again, R, h);
  EXPECT_EQ(again.values(), out.values());  // the forward's product, bitwise
  auto fd = finite_difference(h, [&] {
    ops.swiglu_forward(out, h);
    return dot(out, R);
  });
  EXPECT_LT(rel_error(dh.values(), fd), kFdTol);
  const std::vector<double> with_out = dh.values();
  ops.swiglu_backward(dh, Tensor(), R, h);
  EXPECT_EQ(dh.values(), with_out);
}

TEST_F(CpuOps, CrossEntropyMatchesDefinitionAndGradient) {
  const int64_t N = 4, V = 6;
  HostTensor logits = randn({N, V}, DType::F64, 3.0), tgt = tokens({N}, V), losses = make({N});
  ops.cross_entropy_forward(losses, logits, tgt);
  for (int64_t n = 0; n < N; ++n) {
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(logits.get(n * V + v));
    EXPECT_NEAR(losses.get(n), std::log(z) - logits.get(n * V + int64_t(tgt.get(n))), 1e-12);
  }
  // d(mean loss)/dlogits, written in place over the logits as the model does.
  HostTensor work = make({N, V});
  work.copy_from(logits);
  ops.cross_entropy_backward(work, work, tgt, 1.0 / N);
  auto fd = finite_difference(logits, [&] {
    ops.cross_entropy_forward(losses, logits, tgt);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += losses.get(n) / N;
    return s;
  });
  EXPECT_LT(rel_error(work.values(), fd), kFdTol);
}

// The vocabulary-parallel cross-entropy: (N,V) logits split into R parts of ceil(V/R) columns,
// the last one padded with garbage that must not count. Per-part statistics, stacked as an
// all-gather would, combine into the whole rows' losses; each part's gradient from the combined
// logsumexp is its columns of the whole gradient, and 0 on the padding.
TEST_F(CpuOps, CrossEntropySplitAcrossVocabPartsMatchesTheWholeRows) {
  for (DType dt : {DType::F64, DType::F32})
    for (int64_t R : {1, 3, 4}) {
      const int64_t N = 9, V = 37, Vl = (V + R - 1) / R;  // R 3: 13, 13 and 11 real columns; R 4: 10, 10, 10, 7
      const double tolerance = dt == DType::F64 ? 1e-12 : 1e-5;
      const std::string what = std::string(dtype_name(dt)) + " R=" + std::to_string(R);
      HostTensor logits = randn({N, V}, dt, 3.0), tgt = tokens({N}, V), losses = make({N}, dt);
      for (int64_t n = 0; n < 6; ++n) tgt.set(n, double(std::vector<int64_t>{0, 12, 13, 25, 26, V - 1}[size_t(n)]));
      ops.cross_entropy_forward(losses, logits, tgt);
      HostTensor dwhole = make({N, V}, dt);
      dwhole.copy_from(logits);
      ops.cross_entropy_backward(dwhole, dwhole, tgt, 1.0 / N);

      HostTensor stats = make({R, N, 3}, dt), part_losses = make({N}, dt), lse = make({N}, dt);
      std::vector<HostTensor> parts;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t begin = r * Vl, valid = std::min(Vl, V - begin);
        parts.push_back(make({N, Vl}, dt));
        HostTensor& part = parts.back();
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < Vl; ++i)
            part.set(n * Vl + i, i < valid ? logits.get(n * V + begin + i) : i % 2 ? 1e30 : std::nan(""));
        const Tensor st = stats.t().slice(r * N * 3, {N, 3});
        ops.cross_entropy_stats(st, part, tgt, begin, valid);
        for (int64_t n = 0; n < N; ++n) {
          double mx = -INFINITY, sum = 0;
          for (int64_t i = 0; i < valid; ++i) mx = std::max(mx, part.get(n * Vl + i));
          for (int64_t i = 0; i < valid; ++i) sum += std::exp(part.get(n * Vl + i) - mx);
          const int64_t t = int64_t(tgt.get(n)) - begin;
          const double got_max = load_as_double(st.data, size_t(n * 3), dt),
                       got_sum = load_as_double(st.data, size_t(n * 3 + 1), dt),
                       got_target = load_as_double(st.data, size_t(n * 3 + 2), dt);
          EXPECT_EQ(got_max, mx) << what << " part " << r << " row " << n;
          EXPECT_NEAR(got_sum, sum, tolerance * sum) << what << " part " << r << " row " << n;
          EXPECT_EQ(got_target, t >= 0 && t < valid ? part.get(n * Vl + t) : 0.0)
              << what << " part " << r << " row " << n;
        }
      }
      ops.cross_entropy_combine(part_losses, lse, stats);
      EXPECT_LT(rel_error(part_losses.values(), losses.values()), tolerance) << what;
      for (int64_t n = 0; n < N; ++n)  // lse - the target's logit is the loss
        EXPECT_NEAR(lse.get(n) - logits.get(n * V + int64_t(tgt.get(n))), losses.get(n), tolerance * 10) << what;

      for (int64_t r = 0; r < R; ++r) {  // in place over each part, as the model would
        const int64_t begin = r * Vl, valid = std::min(Vl, V - begin);
        HostTensor& part = parts[size_t(r)];
        ops.cross_entropy_backward_lse(part, part, tgt, lse, 1.0 / N, begin, valid);
        std::vector<double> got, want;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < Vl; ++i) {
            if (i >= valid) {
              EXPECT_EQ(part.get(n * Vl + i), 0.0) << what << " part " << r << ": padding column " << i;
              continue;
            }
            got.push_back(part.get(n * Vl + i));
            want.push_back(dwhole.get(n * V + begin + i));
          }
        EXPECT_LT(rel_error(got, want), tolerance) << what << " part " << r;
      }
    }
}

// bf16 logits are stored, not computed: their statistics are the fp32 copy's, exactly, and the
// in-place gradient is the fp32 one rounded once.
TEST_F(CpuOps, CrossEntropyVocabPartsOfBf16LogitsAreComputedInFp32) {
  const int64_t N = 5, Vl = 8, begin = 8, valid = 6;
  HostTensor logits = randn({N, Vl}, DType::BF16, 3.0), logits32 = make({N, Vl}, DType::F32), tgt = tokens({N}, 16);
  tgt.set(0, double(begin));
  tgt.set(1, double(begin + valid - 1));
  logits32.copy_from(logits);
  HostTensor stats = make({N, 3}, DType::F32), stats32 = make({N, 3}, DType::F32);
  ops.cross_entropy_stats(stats, logits, tgt, begin, valid);
  ops.cross_entropy_stats(stats32, logits32, tgt, begin, valid);
  EXPECT_EQ(stats.values(), stats32.values());
  HostTensor losses = make({N}, DType::F32), lse = make({N}, DType::F32);
  ops.cross_entropy_combine(losses, lse, stats32);
  ops.cross_entropy_backward_lse(logits, logits, tgt, lse, 0.5, begin, valid);
  ops.cross_entropy_backward_lse(logits32, logits32, tgt, lse, 0.5, begin, valid);
  for (int64_t i = 0; i < N * Vl; ++i) ASSERT_EQ(logits.get(i), double(round_to_bf16(float(logits32.get(i))))) << i;
  EXPECT_NE(logits.values(), logits32.values()) << "no gradient was rounded: not stored as bf16";
}

TEST_F(CpuOps, Fp32AgreesWithFp64OnTheSameInputs) {
  // The linear + attention + swiglu chain in both precisions from identical inputs.
  const int64_t B = 2, T = 8, H = 2, D = 8, C = H * D;
  const AttentionDims dims{B, T, H, D, true, AttentionKind::Naive};
  HostTensor q64 = randn({B, T, 3 * C}), q32 = make({B, T, 3 * C}, DType::F32);
  q32.copy_from(q64);
  for (int64_t i = 0; i < q64.size(); ++i) q64.set(i, q32.get(i));  // identical (fp32-representable) inputs
  HostTensor o64 = make({B, T, C}), o32 = make({B, T, C}, DType::F32);
  HostTensor s64 = make(ops.attention_saved(dims, DType::F64).shape),
             s32 = make(ops.attention_saved(dims, DType::F32).shape, DType::F32);
  ops.rope_forward(q64, H, 10000.0);
  ops.rope_forward(q32, H, 10000.0);
  ops.attention_forward(o64, s64, q64, dims);
  ops.attention_forward(o32, s32, q32, dims);
  EXPECT_LT(rel_error(o32.values(), o64.values()), 1e-6);
}

TEST_F(CpuOps, ConvertRoundsToBf16AndBack) {
  HostTensor x = randn({64}, DType::F32);
  Buffer bf(dev.allocator(), DType::BF16, {64}, "bf16");
  HostTensor back = make({64}, DType::F32);
  ops.convert(bf, x);
  ops.convert(back, bf);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(back.get(i), round_to_bf16(float(x.get(i))));
    EXPECT_LE(std::fabs(back.get(i) - x.get(i)), std::fabs(x.get(i)) * std::ldexp(1.0, -8));
  }
}

// bf16 is storage: an op on bf16 tensors is the fp32 op on the same values, each bf16 output
// rounded once; fp32 tensors beside them (a weight gradient, the residual stream) are exactly
// what the fp32 op gives, accumulation included.
TEST_F(CpuOps, Bf16TensorsAreComputedInFp32AndRoundedWhenStored) {
  const int64_t N = 5, in = 8, out_f = 3;
  HostTensor x = randn({N, in}, DType::BF16), w = randn({out_f, in}, DType::BF16), dy = randn({N, out_f}, DType::BF16);
  HostTensor x32 = make({N, in}, DType::F32), w32 = make({out_f, in}, DType::F32), dy32 = make({N, out_f}, DType::F32);
  x32.copy_from(x);
  w32.copy_from(w);
  dy32.copy_from(dy);
  auto expect_rounded = [](const HostTensor& got, const HostTensor& fp32, const char* what) {
    for (int64_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got.get(i), double(round_to_bf16(float(fp32.get(i))))) << what << " element " << i;
  };

  HostTensor y = make({N, out_f}, DType::BF16), y32 = make({N, out_f}, DType::F32);
  ops.linear_forward(y, x, w);
  ops.linear_forward(y32, x32, w32);
  expect_rounded(y, y32, "linear_forward y");
  EXPECT_NE(y.values(), y32.values()) << "no output was rounded: not stored as bf16";

  HostTensor dx = make({N, in}, DType::BF16), dx32 = make({N, in}, DType::F32), dw = randn({out_f, in}, DType::F32),
             dw32 = make({out_f, in}, DType::F32);
  dw32.copy_from(dw);
  ops.linear_backward(dx, dw, dy, x, w, /*accumulate=*/true);
  ops.linear_backward(dx32, dw32, dy32, x32, w32, true);
  expect_rounded(dx, dx32, "linear_backward dx");
  EXPECT_EQ(dw.values(), dw32.values()) << "the fp32 weight gradient, accumulated";

  // The norm's backward: the residual gradient (fp32) accumulates from a bf16 dout.
  HostTensor r = randn({N, in}, DType::F32), nw = randn({in}, DType::F32), rstd = make({N}, DType::F32),
             normed = make({N, in}, DType::BF16), normed32 = make({N, in}, DType::F32);
  ops.rmsnorm_forward(normed, rstd, r, nw);
  ops.rmsnorm_forward(normed32, rstd, r, nw);
  expect_rounded(normed, normed32, "rmsnorm_forward out");
  HostTensor dr = randn({N, in}, DType::F32), dr32 = make({N, in}, DType::F32), dnw = make({in}, DType::F32),
             dnw32 = make({in}, DType::F32);
  dr32.copy_from(dr);
  ops.rmsnorm_backward(dr, dnw, x, r, nw, rstd, false, Tensor());
  ops.rmsnorm_backward(dr32, dnw32, x32, r, nw, rstd, false, Tensor());
  EXPECT_EQ(dr.values(), dr32.values());
  EXPECT_EQ(dnw.values(), dnw32.values());
}

TEST_F(CpuOps, MixedFp32AndFp64AreRefusedWithAClearError) {
  HostTensor x = make({2, 4}, DType::F32), w = make({3, 4}, DType::F32), y = make({2, 3}, DType::F64);
  EXPECT_THROW(ops.linear_forward(y, x, w), UsageError);
}

}  // namespace
}  // namespace llmhpc::test

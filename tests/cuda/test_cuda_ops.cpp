// Every CUDA op, forward and backward, against the CPU backend computing in fp64 on the
// same (fresh random) inputs. fp32 results must agree to ~1e-5 of the largest reference
// value; bf16 results within bounds built from bf16's unit roundoff (cuda_test_util.h).
// Outputs the op overwrites start as NaN on the GPU, so a skipped element fails.
#include <limits>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#include "tests/cuda/cuda_test_util.h"

namespace llmhpc::test {
namespace {

constexpr double kFp32Tol = 1e-5;
constexpr DType F32 = DType::F32, F64 = DType::F64, BF16 = DType::BF16;

double tol(DType out, double bf16_tol) { return out == BF16 ? bf16_tol : kFp32Tol; }

using CudaOps = CudaVsCpu;

TEST_F(CudaOps, EmbeddingForwardCopiesRows) {
  for (DType dt : {F32, BF16}) {
    const int64_t V = 37, N = 50, C = 24;
    Twin wte = random({V, C}, dt), tok = tokens({N}, V), out = poisoned({N, C}, dt);
    cpu().embedding_forward(out.cpu, tok.cpu, wte.cpu);
    gpu().embedding_forward(out.gpu, tok.gpu, wte.gpu);
    EXPECT_EQ(error(out), 0.0) << dtype_name(dt) << ", " << seed_note();
  }
}

TEST_F(CudaOps, EmbeddingBackwardSumsRepeatedTokensDeterministically) {
  for (DType dt : {F32, BF16}) {
    const int64_t V = 7, N = 300, C = 40;  // few ids, so every id repeats many times
    Twin dwte = random({V, C}, F32), dout = random({N, C}, dt), tok = tokens({N}, V);
    Twin again = twin({V, C}, F32, gpu_values(dwte));
    for (bool accumulate : {false, true}) {
      cpu().embedding_backward(dwte.cpu, dout.cpu, tok.cpu, accumulate);
      gpu().embedding_backward(dwte.gpu, dout.gpu, tok.gpu, accumulate);
      gpu().embedding_backward(again.gpu, dout.gpu, tok.gpu, accumulate);
      EXPECT_LE(error(dwte), kFp32Tol) << dtype_name(dt) << " accumulate " << accumulate << ", " << seed_note();
      EXPECT_EQ(gpu_values(dwte), gpu_values(again)) << "two runs differ: the scatter-add is not deterministic";
    }
  }
}

// A table split by rows across ranks (vocab_begin), with tokens of every part: each part's
// lookup is the CPU's (zeros for the other parts' tokens) and the parts' lookups add up to the
// whole table's; each part's gradient is the CPU's and, bitwise, its slice of the whole
// table's gradient (the sorted scatter-add skips the other parts' tokens, same order of rows).
TEST_F(CudaOps, EmbeddingPartsOfATableSplitByVocabBegin) {
  for (DType dt : {F32, BF16}) {
    const int64_t V = 37, N = 300, C = 40;
    const std::vector<int64_t> begins = {0, 13, 26, 37};
    const std::vector<double> table = random_values(V * C, dt);
    Twin whole = twin({V, C}, dt, table), tok = tokens({N}, V), dout = random({N, C}, dt);
    Twin whole_out = poisoned({N, C}, dt), whole_grad = poisoned({V, C}, F32);
    gpu().embedding_forward(whole_out.gpu, tok.gpu, whole.gpu);
    gpu().embedding_backward(whole_grad.gpu, dout.gpu, tok.gpu, false);
    const std::vector<double> whole_grad_values = gpu_values(whole_grad);
    std::vector<double> sum(size_t(N * C), 0.0);
    for (size_t p = 0; p + 1 < begins.size(); ++p) {
      const int64_t begin = begins[p], rows = begins[p + 1] - begin;
      const std::string what = std::string(dtype_name(dt)) + " part " + std::to_string(p) + ", " + seed_note();
      Twin part =
          twin({rows, C}, dt, std::vector<double>(table.begin() + begin * C, table.begin() + (begin + rows) * C));
      Twin out = poisoned({N, C}, dt);
      cpu().embedding_forward(out.cpu, tok.cpu, part.cpu, begin);
      gpu().embedding_forward(out.gpu, tok.gpu, part.gpu, begin);
      EXPECT_EQ(error(out), 0.0) << what;
      const std::vector<double> got = gpu_values(out);
      for (size_t i = 0; i < got.size(); ++i) sum[i] += got[i];

      Twin dpart = random({rows, C}, F32);  // stale values: overwritten, then accumulated into
      Twin again = twin({rows, C}, F32, gpu_values(dpart));
      for (bool accumulate : {false, true}) {
        cpu().embedding_backward(dpart.cpu, dout.cpu, tok.cpu, accumulate, begin);
        gpu().embedding_backward(dpart.gpu, dout.gpu, tok.gpu, accumulate, begin);
        gpu().embedding_backward(again.gpu, dout.gpu, tok.gpu, accumulate, begin);
        EXPECT_LE(error(dpart), kFp32Tol) << what << " accumulate " << accumulate;
        EXPECT_EQ(gpu_values(dpart), gpu_values(again)) << what << ": two runs differ";
        if (!accumulate)
          EXPECT_EQ(gpu_values(dpart), std::vector<double>(whole_grad_values.begin() + begin * C,
                                                           whole_grad_values.begin() + (begin + rows) * C))
              << what << ": not the whole table's gradient";
      }
    }
    EXPECT_EQ(sum, gpu_values(whole_out)) << dtype_name(dt) << ", " << seed_note();
  }
}

TEST_F(CudaOps, RmsNormForward) {
  for (DType dt : {F32, BF16})
    for (int64_t C : {96, 1000}) {
      const int64_t N = 37;
      Twin x = random({N, C}, F32), w = random({C}, F32), out = poisoned({N, C}, dt), rstd = poisoned({N}, F32);
      cpu().rmsnorm_forward(out.cpu, rstd.cpu, x.cpu, w.cpu);
      gpu().rmsnorm_forward(out.gpu, rstd.gpu, x.gpu, w.gpu);
      EXPECT_LE(error(out), tol(dt, bf16_bound(1))) << dtype_name(dt) << " C=" << C << ", " << seed_note();
      EXPECT_LE(error(rstd), kFp32Tol) << dtype_name(dt) << " C=" << C << ", " << seed_note();
    }
}

TEST_F(CudaOps, ResidualRmsNormForward) {
  for (DType dt : {F32, BF16}) {
    const int64_t N = 29, C = 200;
    Twin x = random({N, C}, F32), delta = random({N, C}, dt), w = random({C}, F32);
    Twin x_out = poisoned({N, C}, F32), out = poisoned({N, C}, dt), rstd = poisoned({N}, F32);
    cpu().residual_rmsnorm_forward(x_out.cpu, out.cpu, rstd.cpu, x.cpu, delta.cpu, w.cpu);
    gpu().residual_rmsnorm_forward(x_out.gpu, out.gpu, rstd.gpu, x.gpu, delta.gpu, w.gpu);
    EXPECT_LE(error(x_out), kFp32Tol) << dtype_name(dt) << ", " << seed_note();
    EXPECT_LE(error(out), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
    EXPECT_LE(error(rstd), kFp32Tol) << dtype_name(dt) << ", " << seed_note();
  }
}

// dx and dw accumulate into random initial values. C = 12500 needs more than 48 KiB of
// shared memory for the dw accumulator (the opt-in path).
TEST_F(CudaOps, RmsNormBackwardAccumulates) {
  for (DType dt : {F32, BF16})
    for (auto [N, C] : std::initializer_list<std::pair<int64_t, int64_t>>{{64, 96}, {5, 12500}}) {
      Twin x = random({N, C}, F32), w = random({C}, F32), dout = random({N, C}, dt);
      Twin dx = random({N, C}, F32), dw = random({C}, F32);
      Twin out = poisoned({N, C}, dt), rstd = poisoned({N}, F32);
      cpu().rmsnorm_forward(out.cpu, rstd.cpu, x.cpu, w.cpu);
      gpu().rmsnorm_forward(out.gpu, rstd.gpu, x.gpu, w.gpu);
      for (bool accumulate : {false, true}) {
        cpu().rmsnorm_backward(dx.cpu, dw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu, accumulate, Tensor());
        gpu().rmsnorm_backward(dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu, accumulate, Tensor());
        // Inputs are exact in both dtypes and the arithmetic is fp32: fp32 accuracy either way.
        EXPECT_LE(error(dx), kFp32Tol) << dtype_name(dt) << " C=" << C << ", " << seed_note();
        EXPECT_LE(error(dw), kFp32Tol) << dtype_name(dt) << " C=" << C << " accumulate " << accumulate;
      }
    }
}

// With dx_copy the kernel also stores the new dx in bf16: bitwise what convert gives from the
// dx it wrote (the model's next products read it instead of a converted copy); dx and dw are
// bitwise those of the call without it. C = 1001: the element-wise path, 1600: packs of 4.
TEST_F(CudaOps, RmsNormBackwardCopyIsTheConvertedGradient) {
  for (int64_t C : {1001, 1600}) {
    const int64_t N = 37;
    Twin x = random({N, C}, F32), w = random({C}, F32), dout = random({N, C}, BF16), dx0 = random({N, C}, F32);
    Twin out = poisoned({N, C}, BF16), rstd = poisoned({N}, F32);
    gpu().rmsnorm_forward(out.gpu, rstd.gpu, x.gpu, w.gpu);
    Twin dx = random({N, C}, F32), dx_alone = random({N, C}, F32), dw = random({C}, F32), dw_alone = random({C}, F32);
    Twin copy = poisoned({N, C}, BF16), converted = poisoned({N, C}, BF16);
    gpu().convert(dx.gpu, dx0.gpu);
    gpu().convert(dx_alone.gpu, dx0.gpu);
    gpu().rmsnorm_backward(dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu, false, copy.gpu);
    gpu().rmsnorm_backward(dx_alone.gpu, dw_alone.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu, false, Tensor());
    gpu().convert(converted.gpu, dx.gpu);
    EXPECT_EQ(gpu_values(dx), gpu_values(dx_alone)) << "C=" << C;
    EXPECT_EQ(gpu_values(dw), gpu_values(dw_alone)) << "C=" << C;
    EXPECT_EQ(gpu_values(copy), gpu_values(converted)) << "C=" << C << ", " << seed_note();
  }
}

// bf16 operands accumulate in fp32 (error ~K * 2^-24, negligible); a bf16 output is then
// rounded once.
TEST_F(CudaOps, LinearForward) {
  const int64_t N = 48, in = 72, out_f = 40;
  for (auto [op_dt, out_dt] : std::initializer_list<std::pair<DType, DType>>{{F32, F32}, {BF16, BF16}, {BF16, F32}}) {
    Twin x = random({N, in}, op_dt), w = random({out_f, in}, op_dt), y = poisoned({N, out_f}, out_dt);
    cpu().linear_forward(y.cpu, x.cpu, w.cpu);
    gpu().linear_forward(y.gpu, x.gpu, w.gpu);
    EXPECT_LE(error(y), tol(out_dt, bf16_bound(1)))
        << dtype_name(op_dt) << "->" << dtype_name(out_dt) << ", " << seed_note();
  }
}

// --gemm-sm-margin: cuBLAS plans for fewer SMs; the products stay as exact, and a margin of
// every SM is refused with the device's count.
TEST_F(CudaOps, LinearForwardWithAnSmMargin) {
  BackendOptions o;
  o.kind = DeviceKind::Cuda;
  o.gemm_sm_margin = 16;
  Backend narrow = make_backend(o);
  const int64_t N = 512, in = 384, out_f = 640;  // enough tiles to fill more than the SMs left
  for (DType dt : {F32, BF16}) {
    Twin x = random({N, in}, dt), w = random({out_f, in}, dt), y = poisoned({N, out_f}, dt);
    cpu().linear_forward(y.cpu, x.cpu, w.cpu);
    narrow.ops->linear_forward(y.gpu, x.gpu, w.gpu);
    EXPECT_LE(error(y), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
  }
  o.gemm_sm_margin = 100000;
  EXPECT_THROW(make_backend(o), UsageError);
}

// Products run through plans made once per shape, layout, dtype and pointer alignment
// (kernels/cuda/gemm.h): operands that start one element past an aligned address (2 bytes
// for bf16, 4 for fp32) get a plan of their own and stay exact, and repeats reuse the plan and
// give bitwise the same result.
TEST_F(CudaOps, ProductsOfAnyOperandAlignmentAreExactAndReuseTheirPlans) {
  const int64_t N = 33, in = 72, out_f = 40;
  cuda::Gemm gemm(static_cast<CudaDevice&>(gpu_dev()).stream(), gpu_dev().allocator(), false);
  for (DType dt : {F32, BF16})
    for (int64_t offset : {0, 1}) {
      Twin xs = random({N * in + 1}, dt), ws = random({out_f * in + 1}, dt), ys = poisoned({N * out_f + 1}, dt);
      const Tensor x = xs.gpu.slice(offset, {N, in}), w = ws.gpu.slice(offset, {out_f, in}),
                   y = ys.gpu.slice(offset, {N, out_f});
      cpu().linear_forward(ys.cpu.slice(offset, {N, out_f}), xs.cpu.slice(offset, {N, in}),
                           ws.cpu.slice(offset, {out_f, in}));
      const size_t plans = gemm.plans();
      gemm.run(false, true, N, out_f, in, 1.f, {x.data, dt, in}, {w.data, dt, in}, 0.f, {y.data, dt, out_f});
      EXPECT_EQ(gemm.plans(), plans + 1) << "a new product makes a plan";
      const std::vector<double> first = read_tensor(gpu_dev(), y);
      const std::vector<double> want = read_tensor(*cpu_.device, ys.cpu.slice(offset, {N, out_f}));
      EXPECT_LE(max_rel_error(first, want), tol(dt, bf16_bound(1)))
          << dtype_name(dt) << " offset " << offset << ", " << seed_note();
      gemm.run(false, true, N, out_f, in, 1.f, {x.data, dt, in}, {w.data, dt, in}, 0.f, {y.data, dt, out_f});
      EXPECT_EQ(gemm.plans(), plans + 1) << "a repeated product reuses its plan";
      EXPECT_EQ(read_tensor(gpu_dev(), y), first) << "the same plan twice gives different results";
    }
}

// --gemm-autotune: a product's first overwriting call times the candidates and keeps the fastest;
// the result is still the product, the choice is kept (bitwise repeats), an accumulating call
// with the tuned plan adds once, and a call while a graph is recorded never times.
TEST_F(CudaOps, AutotunedProductsAreExactKeepTheirChoiceAndNeverTimeWhileRecording) {
  const int64_t N = 256, in = 512, out_f = 384;  // large enough for cuBLASLt to offer several algorithms
  CudaDevice& dev = static_cast<CudaDevice&>(gpu_dev());
  cuda::Gemm gemm(dev.stream(), gpu_dev().allocator(), false, 0, /*autotune=*/true);
  auto product = [&](const Twin& x, const Twin& w, Twin& y, int64_t n_out, DType dt, float beta) {
    gemm.run(false, true, N, n_out, in, 1.f, {x.gpu.data, dt, in}, {w.gpu.data, dt, in}, beta,
             {y.gpu.data, F32, n_out});
  };
  for (DType dt : {F32, BF16}) {
    Twin xs = random({N, in}, dt), ws = random({out_f, in}, dt), ys = poisoned({N, out_f}, F32);
    cpu().linear_forward(ys.cpu, xs.cpu, ws.cpu);
    const std::vector<double> want = read_tensor(*cpu_.device, ys.cpu);
    const size_t tuned = gemm.tuned_plans();
    product(xs, ws, ys, out_f, dt, 0.f);
    EXPECT_EQ(gemm.tuned_plans(), tuned + 1) << "the first overwriting call tunes its plan, " << dtype_name(dt);
    const std::vector<double> first = read_tensor(gpu_dev(), ys.gpu);
    EXPECT_LE(max_rel_error(first, want), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
    product(xs, ws, ys, out_f, dt, 0.f);
    EXPECT_EQ(read_tensor(gpu_dev(), ys.gpu), first) << "the tuned choice is kept, " << dtype_name(dt);
    product(xs, ws, ys, out_f, dt, 1.f);
    std::vector<double> twice = read_tensor(gpu_dev(), ys.gpu);
    for (double& v : twice) v /= 2;  // exact in fp32
    EXPECT_LE(max_rel_error(twice, want), tol(dt, bf16_bound(1))) << "accumulated once, " << dtype_name(dt);
  }
  // Recorded into a graph: a new product launches the heuristic's choice and stays untuned.
  Twin xs = random({N, in}, F32), ws = random({2 * out_f, in}, F32), ys = poisoned({N, 2 * out_f}, F32);
  const size_t tuned = gemm.tuned_plans();
  std::unique_ptr<DeviceGraph> graph = dev.capture([&] { product(xs, ws, ys, 2 * out_f, F32, 0.f); });
  EXPECT_EQ(gemm.tuned_plans(), tuned) << "nothing is timed while a graph is recorded";
  graph->launch();
  cpu().linear_forward(ys.cpu, xs.cpu, ws.cpu);
  EXPECT_LE(error(ys), kFp32Tol) << seed_note();
}

TEST_F(CudaOps, LinearBackwardOverwritesDxAndOverwritesOrAccumulatesDw) {
  const int64_t N = 48, in = 72, out_f = 40;
  for (DType dt : {F32, BF16}) {
    Twin x = random({N, in}, dt), w = random({out_f, in}, dt), dy = random({N, out_f}, dt);
    Twin dx = poisoned({N, in}, dt), dw = random({out_f, in}, F32);
    cpu().linear_backward(dx.cpu, dw.cpu, dy.cpu, x.cpu, w.cpu, false);
    gpu().linear_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, false);
    EXPECT_LE(error(dx), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
    EXPECT_LE(error(dw), kFp32Tol) << dtype_name(dt) << ", " << seed_note();  // fp32 result from exact inputs
    // Without dx and with accumulate, only dw moves: it doubles.
    cpu().linear_backward(Tensor(), dw.cpu, dy.cpu, x.cpu, w.cpu, true);
    gpu().linear_backward(Tensor(), dw.gpu, dy.gpu, x.gpu, w.gpu, true);
    EXPECT_LE(error(dw), kFp32Tol) << dtype_name(dt) << ", " << seed_note();
    // Without dw (and x), only dx is written.
    Twin dx2 = poisoned({N, in}, dt);
    cpu().linear_backward(dx2.cpu, Tensor(), dy.cpu, Tensor(), w.cpu, false);
    gpu().linear_backward(dx2.gpu, Tensor(), dy.gpu, Tensor(), w.gpu, false);
    EXPECT_LE(error(dx2), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
    EXPECT_LE(error(dw), kFp32Tol) << dtype_name(dt) << ", " << seed_note();
  }
}

// T = 1100 checks the angle at large positions (t * theta^(-2i/D) needs more than fp32).
TEST_F(CudaOps, RopeForwardAndBackward) {
  struct Case {
    int64_t B, T, H, D;
  };
  for (DType dt : {F32, BF16})
    for (Case c : {Case{2, 40, 3, 8}, Case{1, 1100, 1, 4}}) {
      Twin qkv = random({c.B, c.T, 3 * c.H * c.D}, dt), dqkv = random({c.B, c.T, 3 * c.H * c.D}, dt);
      cpu().rope_forward(qkv.cpu, c.H, 10000.0);
      gpu().rope_forward(qkv.gpu, c.H, 10000.0);
      cpu().rope_backward(dqkv.cpu, c.H, 10000.0);
      gpu().rope_backward(dqkv.gpu, c.H, 10000.0);
      EXPECT_LE(error(qkv), tol(dt, bf16_bound(1))) << dtype_name(dt) << " T=" << c.T << ", " << seed_note();
      EXPECT_LE(error(dqkv), tol(dt, bf16_bound(1))) << dtype_name(dt) << " T=" << c.T << ", " << seed_note();
    }
}

// bf16 bounds for attention: scores s ~ N(0, 1) here (|s| < ~4) are rounded to bf16, which
// moves each probability by up to 2 * 4 units relative to itself, and P is rounded again
// (1 unit): probabilities within 9 units plus 1 for slack. The output averages T rounded
// values (sqrt(T) units) and is rounded once more. The backward adds the roundings of dP,
// dS and the result.
TEST_F(CudaOps, NaiveAttentionForwardAndBackward) {
  const int64_t B = 2, T = 33, H = 3, D = 16;
  for (DType dt : {F32, BF16})
    for (bool causal : {true, false}) {
      const AttentionDims dims{B, T, H, D, causal, AttentionKind::Naive};
      const SavedSpec spec = gpu().attention_saved(dims, dt);
      ASSERT_EQ(spec.shape, (Shape{B, H, T, T}));
      ASSERT_EQ(spec.dtype, dt);
      Twin qkv = random({B, T, 3 * H * D}, dt), dout = random({B, T, H * D}, dt);
      Twin out = poisoned({B, T, H * D}, dt), probs = poisoned(spec.shape, dt), dqkv = poisoned({B, T, 3 * H * D}, dt);
      cpu().attention_forward(out.cpu, probs.cpu, qkv.cpu, dims);
      gpu().attention_forward(out.gpu, probs.gpu, qkv.gpu, dims);
      cpu().attention_backward(dqkv.cpu, dout.cpu, out.cpu, probs.cpu, qkv.cpu, dims);
      gpu().attention_backward(dqkv.gpu, dout.gpu, out.gpu, probs.gpu, qkv.gpu, dims);
      const std::string what = std::string(dtype_name(dt)) + (causal ? " causal, " : " full, ") + seed_note();
      EXPECT_LE(error(probs), tol(dt, bf16_bound(10))) << what;
      EXPECT_LE(error(out), tol(dt, bf16_bound(11, T))) << what;
      EXPECT_LE(error(dqkv), tol(dt, bf16_bound(14, T))) << what;
    }
}

// F = 36 takes the 4-wide vector path, F = 37 the scalar one. One bf16 rounding each. The
// backward's copy of the forward's product is bitwise the forward's.
TEST_F(CudaOps, SwiGluForwardAndBackward) {
  for (DType dt : {F32, BF16})
    for (int64_t F : {36, 37}) {
      const int64_t N = 20;
      Twin h = random({N, 2 * F}, dt, 2.0), out = poisoned({N, F}, dt), again = poisoned({N, F}, dt);
      Twin dout = random({N, F}, dt), dh = poisoned({N, 2 * F}, dt), dh_only = poisoned({N, 2 * F}, dt);
      cpu().swiglu_forward(out.cpu, h.cpu);
      gpu().swiglu_forward(out.gpu, h.gpu);
      cpu().swiglu_backward(dh.cpu, again.cpu, dout.cpu, h.cpu);
      gpu().swiglu_backward(dh.gpu, again.gpu, dout.gpu, h.gpu);
      gpu().swiglu_backward(dh_only.gpu, Tensor(), dout.gpu, h.gpu);
      const std::string what = std::string(dtype_name(dt)) + " F=" + std::to_string(F) + ", " + seed_note();
      EXPECT_LE(error(out), tol(dt, bf16_bound(1))) << what;
      EXPECT_LE(error(dh), tol(dt, bf16_bound(1))) << what;
      EXPECT_EQ(gpu_values(again), gpu_values(out)) << what;
      EXPECT_EQ(gpu_values(dh_only), gpu_values(dh)) << what;
    }
}

// Losses are fp32 from exact inputs in either dtype; the gradient, written over the
// logits as the model does, is rounded once in bf16.
TEST_F(CudaOps, CrossEntropyForwardAndInPlaceBackward) {
  for (DType dt : {F32, BF16})
    for (int64_t V : {50, 1000}) {
      const int64_t N = 24;
      Twin logits = random({N, V}, dt, 3.0), targets = tokens({N}, V), losses = poisoned({N}, F32);
      cpu().cross_entropy_forward(losses.cpu, logits.cpu, targets.cpu);
      gpu().cross_entropy_forward(losses.gpu, logits.gpu, targets.gpu);
      EXPECT_LE(error(losses), kFp32Tol) << dtype_name(dt) << " V=" << V << ", " << seed_note();
      cpu().cross_entropy_backward(logits.cpu, logits.cpu, targets.cpu, 1.0 / N);
      gpu().cross_entropy_backward(logits.gpu, logits.gpu, targets.gpu, 1.0 / N);
      EXPECT_LE(error(logits), tol(dt, bf16_bound(1))) << dtype_name(dt) << " V=" << V << ", " << seed_note();
    }
}

// The vocabulary-parallel cross-entropy: (N,V) logits split into R parts of Vl columns (a
// multiple of `pad`: 8 takes the 16-byte path, 1 mostly the scalar one), the last part's
// padding filled with garbage (1e30, NaN) that must not count. Each part's statistics, stacked,
// combine into the whole rows' losses (the CPU's cross_entropy_forward on the whole matrix);
// each part's gradient, into fp32 and in place, is the CPU's and 0 on the padding.
TEST_F(CudaOps, CrossEntropySplitAcrossVocabParts) {
  struct Case {
    int64_t V, R, pad;
  };
  for (DType dt : {F32, BF16})
    for (Case c : {Case{37, 3, 1}, Case{50, 1, 1}, Case{64, 1, 8}, Case{1000, 3, 8}, Case{6000, 4, 8}}) {
      const int64_t N = 24, V = c.V, R = c.R, Vl = ((V + R - 1) / R + c.pad - 1) / c.pad * c.pad;
      const std::string what = std::string(dtype_name(dt)) + " V=" + std::to_string(V) + " R=" + std::to_string(R) +
                               " Vl=" + std::to_string(Vl) + ", " + seed_note();
      const std::vector<double> values = random_values(N * V, dt, 3.0);
      std::vector<double> target_ids(static_cast<size_t>(N));
      std::uniform_int_distribution<int64_t> pick(0, V - 1);
      for (double& t : target_ids) t = double(pick(rng_));
      for (int64_t r = 0; r < R; ++r) {  // the first and last columns of every part
        target_ids[size_t(2 * r)] = double(r * Vl);
        target_ids[size_t(2 * r + 1)] = double(std::min(V, (r + 1) * Vl) - 1);
      }
      Twin whole = twin({N, V}, dt, values), targets = twin({N}, DType::I32, target_ids);
      Twin whole_losses = poisoned({N}, F32);
      cpu().cross_entropy_forward(whole_losses.cpu, whole.cpu, targets.cpu);

      Twin stats = poisoned({R, N, 3}, F32);
      std::vector<Twin> parts;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t begin = r * Vl, valid = std::min(Vl, V - begin);
        std::vector<double> v(size_t(N * Vl));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < Vl; ++i)
            v[size_t(n * Vl + i)] = i < valid ? values[size_t(n * V + begin + i)] : i % 2 ? 1e30 : NAN;
        parts.push_back(twin({N, Vl}, dt, v));
        cpu().cross_entropy_stats(stats.cpu.slice(r * N * 3, {N, 3}), parts.back().cpu, targets.cpu, begin, valid);
        gpu().cross_entropy_stats(stats.gpu.slice(r * N * 3, {N, 3}), parts.back().gpu, targets.gpu, begin, valid);
      }
      const std::vector<double> got = gpu_values(stats), want = cpu_values(stats);
      for (int k = 0; k < 3; ++k) {  // max, sum of exp, target logit: each column on its own scale
        std::vector<double> got_k, want_k;
        for (int64_t i = k; i < R * N * 3; i += 3) got_k.push_back(got[size_t(i)]), want_k.push_back(want[size_t(i)]);
        EXPECT_LE(max_rel_error(got_k, want_k), kFp32Tol) << what << " stats column " << k;
      }

      Twin losses = poisoned({N}, F32), lse = poisoned({N}, F32);
      cpu().cross_entropy_combine(losses.cpu, lse.cpu, stats.cpu);
      gpu().cross_entropy_combine(losses.gpu, lse.gpu, stats.gpu);
      EXPECT_LE(error(losses), kFp32Tol) << what;
      EXPECT_LE(error(lse), kFp32Tol) << what;
      EXPECT_LE(max_rel_error(gpu_values(losses), cpu_values(whole_losses)), kFp32Tol)
          << what << ": not the whole rows'";

      for (int64_t r = 0; r < R; ++r) {
        const int64_t begin = r * Vl, valid = std::min(Vl, V - begin);
        Twin& part = parts[size_t(r)];
        Twin into = poisoned({N, Vl}, F32);  // out of place, into fp32
        cpu().cross_entropy_backward_lse(into.cpu, part.cpu, targets.cpu, lse.cpu, 1.0 / N, begin, valid);
        gpu().cross_entropy_backward_lse(into.gpu, part.gpu, targets.gpu, lse.gpu, 1.0 / N, begin, valid);
        EXPECT_LE(error(into), kFp32Tol) << what << " part " << r << " into fp32";
        cpu().cross_entropy_backward_lse(part.cpu, part.cpu, targets.cpu, lse.cpu, 1.0 / N, begin, valid);
        gpu().cross_entropy_backward_lse(part.gpu, part.gpu, targets.gpu, lse.gpu, 1.0 / N, begin, valid);
        EXPECT_LE(error(part), tol(dt, bf16_bound(1))) << what << " part " << r << " in place";
        const std::vector<double> g = gpu_values(part), g32 = gpu_values(into);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = valid; i < Vl; ++i) {
            ASSERT_EQ(g[size_t(n * Vl + i)], 0.0) << what << " part " << r << ": padding column " << i;
            ASSERT_EQ(g32[size_t(n * Vl + i)], 0.0) << what << " part " << r << ": padding column " << i;
          }
      }
    }
}

// The kernel does the CPU reference's fp32 operations in the same order without FMA
// contraction, so the results are bitwise equal, on the vector path (aligned, offset 0)
// and on the scalar one (offset 1: 4 bytes off 16-byte alignment), tail included.
TEST_F(CudaOps, AdamWMatchesCpuFp32Bitwise) {
  const int64_t n = 1003;
  AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (int64_t offset : {0, 1}) {
    Twin p = random({n + 1}, F32, 1.0, F32), m = twin({n + 1}, F32, std::vector<double>(n + 1, 0.0), F32);
    Twin v = twin({n + 1}, F32, std::vector<double>(n + 1, 0.0), F32), lowp = poisoned({n + 1}, BF16, BF16);
    auto part = [&](const Tensor& t) { return t.slice(offset, {n}); };
    const std::vector<double> p_before = gpu_values(p);
    for (int64_t step = 1; step <= 3; ++step) {
      Twin g = random({n + 1}, F32, 1.0, F32);
      h.grad_scale = step == 2 ? 0.37 : 1.0;  // a clipped step between unclipped ones
      cpu().adamw_step(part(p.cpu), part(g.cpu), part(m.cpu), part(v.cpu), part(lowp.cpu), h, step);
      gpu().adamw_step(part(p.gpu), part(g.gpu), part(m.gpu), part(v.gpu), part(lowp.gpu), h, step);
    }
    const std::string what = "offset " + std::to_string(offset) + ", " + seed_note();
    EXPECT_EQ(gpu_values(p), cpu_values(p)) << what;
    EXPECT_EQ(gpu_values(m), cpu_values(m)) << what;
    EXPECT_EQ(gpu_values(v), cpu_values(v)) << what;
    std::vector<double> lg = gpu_values(lowp), lc = cpu_values(lowp);
    EXPECT_EQ(std::vector<double>(lg.begin() + offset, lg.begin() + offset + n),
              std::vector<double>(lc.begin() + offset, lc.begin() + offset + n))
        << what;
    EXPECT_NE(gpu_values(p), p_before) << "the step changed nothing";
  }
}

// Gradient clipping's norm: within double rounding of the CPU's sum, over spans in more than one
// launch (64 a launch), empty ones and a misaligned start, fp32 and fp64; the same bits on every
// call (ranks holding the same gradients must clip alike).
TEST_F(CudaOps, SumOfSquaresMatchesCpuAndRepeatsBitwise) {
  const int64_t n = 3 * 1000 * 1000 + 7;
  std::vector<Span> spans;
  for (int64_t at = 3; at + 20000 < n; at += 40001) spans.push_back({at, spans.size() % 5 == 0 ? 0 : 20000 + at % 7});
  spans.push_back({n - 1000000, 1000000});
  ASSERT_GT(spans.size(), 64u);
  for (DType dt : {F32, F64}) {
    Twin x = random({n}, dt, 1.0, dt), out = poisoned({1}, F64);
    cpu().sum_of_squares(out.cpu, x.cpu, spans);
    std::vector<double> sums;
    for (int call = 0; call < 3; ++call) {
      gpu().sum_of_squares(out.gpu, x.gpu, spans);
      sums.push_back(gpu_values(out)[0]);
    }
    EXPECT_NEAR(sums[0], cpu_values(out)[0], 1e-12 * cpu_values(out)[0]) << dtype_name(dt) << ", " << seed_note();
    EXPECT_EQ(sums[1], sums[0]) << dtype_name(dt);
    EXPECT_EQ(sums[2], sums[0]) << dtype_name(dt);
    gpu().sum_of_squares(out.gpu, x.gpu, {});
    EXPECT_EQ(gpu_values(out)[0], 0.0) << "no spans, no squares";
  }
}

// A sharded optimizer's slices in one call: more than one launch takes (16), some empty, some
// ending in a partial pack, the state packed; on the vector path (starts multiples of 4) and the
// scalar one (a start that is not). Bitwise the CPU reference; what no slice covers untouched.
TEST_F(CudaOps, AdamWSlicesMatchCpuBitwiseAndTouchNothingElse) {
  const AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (int64_t misalign : {0, 2}) {
    std::vector<AdamWSlice> slices;
    int64_t at = 0, state = 0;
    for (int k = 0; k < 21; ++k) {
      const int64_t size = k % 5 == 3 ? 0 : 37 * k + k % 4;  // sizes 1, 38, 77, 0, ... none a multiple of 4
      at = (at + 7) / 4 * 4 + (k == 9 ? misalign : 0);       // a gap before each slice
      slices.push_back({at, state, size});
      at += size;
      state += size;
    }
    const int64_t n = at + 5;
    Twin p = random({n}, F32, 1.0, F32), lowp = poisoned({n}, BF16, BF16);
    Twin m = twin({state}, F32, std::vector<double>(state, 0.0), F32),
         v = twin({state}, F32, std::vector<double>(state, 0.0), F32);
    const std::vector<double> p_before = gpu_values(p);
    for (int64_t step = 1; step <= 2; ++step) {
      Twin g = random({n}, F32, 1.0, F32);
      cpu().adamw_step(p.cpu, g.cpu, m.cpu, v.cpu, lowp.cpu, slices, h, step);
      gpu().adamw_step(p.gpu, g.gpu, m.gpu, v.gpu, lowp.gpu, slices, h, step);
    }
    const std::string what = "misalign " + std::to_string(misalign) + ", " + seed_note();
    const std::vector<double> pg = gpu_values(p), lg = gpu_values(lowp);
    EXPECT_EQ(pg, cpu_values(p)) << what;
    EXPECT_EQ(gpu_values(m), cpu_values(m)) << what;
    EXPECT_EQ(gpu_values(v), cpu_values(v)) << what;
    std::vector<bool> covered(size_t(n), false);
    for (const AdamWSlice& s : slices)
      for (int64_t i = s.at; i < s.at + s.size; ++i) covered[size_t(i)] = true;
    for (int64_t i = 0; i < n; ++i) {
      if (covered[size_t(i)]) {
        ASSERT_NE(pg[i], p_before[i]) << "element " << i << " of a slice not updated, " << what;
        ASSERT_EQ(lg[i], double(round_to_bf16(float(pg[i])))) << "element " << i << ", " << what;
      } else {
        ASSERT_EQ(pg[i], p_before[i]) << "element " << i << " outside the slices changed, " << what;
        ASSERT_TRUE(std::isnan(lg[i])) << "element " << i << " of the copy outside the slices written, " << what;
      }
    }
  }
}

TEST_F(CudaOps, ConvertRoundsToNearestEvenAndScale) {
  const int64_t n = 1001;  // odd: the vector path's tail
  Twin x = random({n + 1}, F32, 10.0), lo = poisoned({n + 1}, BF16), back = poisoned({n + 1}, F32);
  for (int64_t offset : {0, 1}) {
    gpu().convert(lo.gpu.slice(offset, {n}), x.gpu.slice(offset, {n}));
    gpu().convert(back.gpu.slice(offset, {n}), lo.gpu.slice(offset, {n}));
    const std::vector<double> xs = gpu_values(x), ls = gpu_values(lo), bs = gpu_values(back);
    for (int64_t i = offset; i < offset + n; ++i) {
      ASSERT_EQ(ls[i], double(round_to_bf16(float(xs[i])))) << "element " << i << ", offset " << offset;
      ASSERT_EQ(bs[i], ls[i]) << "element " << i;
    }
  }
  for (DType dt : {F32, BF16}) {
    Twin y = random({n}, dt);
    cpu().scale(y.cpu, 0.37);
    gpu().scale(y.gpu, 0.37);
    EXPECT_LE(error(y), tol(dt, bf16_bound(1))) << dtype_name(dt) << ", " << seed_note();
  }
}

// Initialisation and random inputs (Ops::random_normal): bitwise the CPU backend's values in
// fp32 and bf16, truncated and not, into a slice that starts inside its buffer (a parameter
// of the flat buffer), the element before it untouched.
TEST_F(CudaOps, RandomNormalIsTheCpusBitwise) {
  const int64_t n = int64_t(1) << 20;
  for (DType dt : {F32, BF16})
    for (double bound : {3.0, std::numeric_limits<double>::infinity()}) {
      Twin x = poisoned({n + 1}, dt, dt);
      cpu().random_normal(x.cpu.slice(1, {n}), 7, 5, 0.02, bound);
      gpu().random_normal(x.gpu.slice(1, {n}), 7, 5, 0.02, bound);
      const std::vector<double> g = gpu_values(x), c = cpu_values(x);
      const std::string what = std::string(dtype_name(dt)) + ", bound " + std::to_string(bound);
      const double slack = dt == BF16 ? 1.0 / 128 : 1e-6;  // a value at the bound, rounded up
      EXPECT_TRUE(std::isnan(g[0])) << what << ": wrote before its slice";
      int64_t beyond = 0;
      for (int64_t i = 1; i <= n; ++i) {
        ASSERT_EQ(g[i], c[i]) << "element " << i - 1 << ", " << what;
        beyond += std::fabs(g[i]) > 3 * 0.02 * (1 + slack);
      }
      if (bound == 3.0) EXPECT_EQ(beyond, 0) << what;
      else EXPECT_GT(beyond, 1000) << what << ": a normal exceeds 3 sigma 0.27% of the time";
    }
}

TEST_F(CudaOps, UnsupportedDtypeIsAUsageError) {
  Twin x = random({4, 8}, F32), w = random({8}, F32), rstd = poisoned({4}, F32);
  Buffer fp64(gpu_dev().allocator(), DType::F64, {4, 8}, "test.fp64");
  EXPECT_THROW(gpu().rmsnorm_forward(fp64, rstd.gpu, x.gpu, w.gpu), UsageError);
}

}  // namespace
}  // namespace llmhpc::test

// Kernel timings on the GPU, for the performance notes (docs/results/cuda-notes.md):
//   kernel_bench [BENCH ...]        (no argument: all of them; --help lists them)
// Each prints one line per measurement: the median of timed repetitions after warm-up,
// with CUDA events, on non-zero data. Ceilings first (device copy, GEMM rates), then the
// fused AdamW against its bytes-over-bandwidth bound, then every op of one 2.7B layer
// (bf16, batch 4, context 512) as the model calls it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/gemm.h"
#include "src/model/config.h"

namespace llmhpc {
namespace {

void write_tensor(Device& dev, const Tensor& t, const std::vector<double>& v) {
  std::vector<char> raw(t.bytes());
  from_doubles(v.data(), size_t(t.numel()), t.dtype, raw.data());
  dev.copy_to_device(t.data, raw.data(), raw.size());
}

Backend make_gpu_backend() {
  BackendOptions o;
  o.kind = DeviceKind::Cuda;
  return make_backend(o);
}

// Median time of `fn` in ms over `reps` runs after `warmup` runs.
double median_ms(Device& dev, const std::function<void()>& fn, int reps = 10, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  auto timer = dev.make_timer(2);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    timer->mark(0);
    fn();
    timer->mark(1);
    t.push_back(timer->elapsed_ms(0, 1));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Fills a device tensor with uniform values in [-1, 1) (token-like ids for int32): a 32 MiB
// random block from the host, then doubled on the device until the tensor is full.
void fill_random(Device& dev, const Tensor& t, uint64_t seed, double scale = 1.0, int64_t modulo = 10000) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  const int64_t first = std::min<int64_t>(t.numel(), (int64_t(32) << 20) / int64_t(dtype_size(t.dtype)));
  std::vector<double> v(first);
  for (double& x : v) x = t.dtype == DType::I32 ? double(rng() % uint64_t(modulo)) : u(rng);
  write_tensor(dev, t.slice(0, {first}), v);
  const size_t total = t.bytes();
  for (size_t done = first * dtype_size(t.dtype); done < total;) {
    const size_t n = std::min(done, total - done);
    dev.copy_on_device(static_cast<char*>(t.data) + done, t.data, n);
    done += n;
  }
}

struct Gpu {
  Backend b = make_gpu_backend();
  Device& dev = *b.device;
  Ops& ops = *b.ops;
  Tensor make(DType t, Shape s, const char* tag, std::deque<Buffer>& keep, uint64_t seed = 1) {
    keep.emplace_back(dev.allocator(), t, s, tag);
    fill_random(dev, keep.back(), seed);
    return keep.back();
  }
};

void ceilings() {
  Gpu g;
  std::deque<Buffer> keep;
  {
    const int64_t n = int64_t(1) << 30;  // 2 GiB of bf16 each way
    Tensor a = g.make(DType::BF16, {n}, "a", keep), c = g.make(DType::BF16, {n}, "c", keep);
    const double ms = median_ms(g.dev, [&] { g.dev.copy_on_device(c.data, a.data, a.bytes()); });
    std::printf("BENCH copy: %.3f ms for 2 x %.2f GB -> %.0f GB/s (read + write)\n", ms, a.bytes() / 1e9,
                2 * a.bytes() / ms / 1e6);
  }
  keep.clear();
  for (int64_t n : {4096, 8192}) {
    Tensor x = g.make(DType::BF16, {n, n}, "x", keep), w = g.make(DType::BF16, {n, n}, "w", keep, 2);
    Tensor y = g.make(DType::BF16, {n, n}, "y", keep);
    const double ms = median_ms(g.dev, [&] { g.ops.linear_forward(y, x, w); });
    std::printf("BENCH gemm bf16 %ld^3: %.3f ms -> %.0f TFLOP/s\n", long(n), ms, 2.0 * n * n * n / ms / 1e9);
    keep.clear();
  }
  {
    const int64_t n = 4096;
    Tensor x = g.make(DType::F32, {n, n}, "x", keep), w = g.make(DType::F32, {n, n}, "w", keep, 2);
    Tensor y = g.make(DType::F32, {n, n}, "y", keep);
    const double ms = median_ms(
        g.dev, [&] { g.ops.linear_forward(y, x, w); }, 5);
    std::printf("BENCH gemm fp32 (SGEMM) %ld^3: %.3f ms -> %.1f TFLOP/s\n", long(n), ms, 2.0 * n * n * n / ms / 1e9);
  }
}

// AdamW over a model's flat parameters, with the bf16 copy: 4 fp32 reads (p, g, m, v),
// 3 fp32 writes and one bf16 write = 30 bytes per parameter.
void adamw() {
  Gpu g;
  for (const char* size : {"xl", "2.7B"}) {
    std::deque<Buffer> keep;
    const int64_t n = preset_config(size).num_params();
    Tensor p = g.make(DType::F32, {n}, "p", keep, 1), gr = g.make(DType::F32, {n}, "g", keep, 2);
    Tensor m = g.make(DType::F32, {n}, "m", keep, 3), v = g.make(DType::F32, {n}, "v", keep, 4);
    g.dev.fill_zero(v.data, v.bytes());
    g.ops.adamw_step(p, gr, m, v, Tensor(), AdamWHyper{}, 1);  // v = (1 - beta2) g^2: valid, non-zero state
    Tensor lowp = g.make(DType::BF16, {n}, "lowp", keep);
    int64_t step = 1;
    for (bool with_lowp : {false, true}) {
      const double ms =
          median_ms(g.dev, [&] { g.ops.adamw_step(p, gr, m, v, with_lowp ? lowp : Tensor(), AdamWHyper{}, ++step); });
      const double bytes = (with_lowp ? 30.0 : 28.0) * double(n);
      std::printf("BENCH adamw %s (%.2fB params%s): %.3f ms, %.0f GB/s\n", size, n / 1e9,
                  with_lowp ? ", + bf16 copy" : "", ms, bytes / ms / 1e6);
    }
    // The same update in launches of 2^k elements each (a sharded optimizer's launches).
    for (int k : {23, 25, 27}) {
      const int64_t chunk = int64_t(1) << k;
      const double ms = median_ms(g.dev, [&] {
        ++step;
        for (int64_t at = 0; at < n; at += chunk)
          g.ops.adamw_step(p, gr, m, v, lowp, {{at, at, std::min(chunk, n - at)}}, AdamWHyper{}, step);
      });
      std::printf("BENCH adamw %s (+ bf16 copy) in launches of 2^%d: %.3f ms, %.0f GB/s\n", size, k, ms,
                  30.0 * double(n) / ms / 1e6);
    }
  }
}

// What the Ops contract's "gradients accumulate" costs per step at 2.7B: the model zeroes
// every gradient (a 4-byte write per parameter), then each weight gradient GEMM reads and
// writes fp32 (beta = 1). Compared: the same GEMM writing bf16 with beta = 0.
void grad_accumulation() {
  Gpu g;
  std::deque<Buffer> keep;
  {
    const int64_t n = preset_config("2.7B").num_params();
    keep.emplace_back(g.dev.allocator(), DType::F32, Shape{n}, "grads");
    const Tensor grads = keep.back();
    const double ms = median_ms(g.dev, [&] { g.dev.fill_zero(grads.data, grads.bytes()); });
    std::printf("BENCH zero_grad 2.7B (%.2fB fp32): %.3f ms, %.0f GB/s\n", n / 1e9, ms, grads.bytes() / ms / 1e6);
  }
  keep.clear();
  const int64_t N = 2048, C = 2560, F2 = 20480;  // tokens, d_model, 2 d_ff: the w1|w3 weight gradient
  Tensor dy = g.make(DType::BF16, {N, F2}, "dy", keep), x = g.make(DType::BF16, {N, C}, "x", keep);
  Tensor w = g.make(DType::BF16, {F2, C}, "w", keep), dw = g.make(DType::F32, {F2, C}, "dw", keep);
  Tensor dy_t = g.make(DType::BF16, {F2, N}, "dy_t", keep), x_t = g.make(DType::BF16, {C, N}, "x_t", keep);
  Tensor dw_lo = g.make(DType::BF16, {F2, C}, "dw_lo", keep);
  const double flops = 2.0 * N * C * F2;
  const double acc = median_ms(g.dev, [&] { g.ops.linear_backward(Tensor(), dw, dy, x, w, true); });
  const double lo = median_ms(g.dev, [&] { g.ops.linear_forward(dw_lo, dy_t, x_t); });
  // The same product as linear_backward's dW, overwriting fp32 (beta = 0): what a "first
  // backward overwrites" contract would run instead of zero_grad + beta = 1.
  cuda::Gemm gemm(static_cast<cudaStream_t>(g.dev.native_stream()), g.dev.allocator(), false);
  const double set = median_ms(g.dev, [&] {
    gemm.run(true, false, F2, C, N, 1.f, {dy.data, DType::BF16, F2}, {x.data, DType::BF16, C}, 0.f,
             {dw.data, DType::F32, C});
  });
  std::printf("BENCH dW w1|w3 (20480x2560, K=2048): fp32 += %.3f ms (%.0f TFLOP/s); fp32 = %.3f ms (%.0f TFLOP/s); "
              "bf16 = %.3f ms (%.0f TFLOP/s)\n",
              acc, flops / acc / 1e9, set, flops / set / 1e9, lo, flops / lo / 1e9);
}

// Every op of one 2.7B layer as the model calls it under bf16, batch 4, context 512
// (attention naive), plus the per-step ops outside the layers (LM head, loss, embedding).
void layer_2p7b_bf16() {
  Gpu g;
  std::deque<Buffer> keep;
  const int64_t B = 4, T = 512, C = 2560, F = 10240, H = 32, D = 80, V = 10000, N = B * T;
  const DType bf = DType::BF16, f32 = DType::F32;
  Tensor resid = g.make(f32, {B, T, C}, "resid", keep), resid2 = g.make(f32, {B, T, C}, "resid2", keep);
  Tensor normed = g.make(bf, {B, T, C}, "normed", keep), rstd = g.make(f32, {N}, "rstd", keep);
  Tensor gain = g.make(f32, {C}, "gain", keep), dgain = g.make(f32, {C}, "dgain", keep);
  Tensor w_qkv = g.make(bf, {3 * C, C}, "w_qkv", keep), dw_qkv = g.make(f32, {3 * C, C}, "dw_qkv", keep);
  Tensor w_o = g.make(bf, {C, C}, "w_o", keep), dw_o = g.make(f32, {C, C}, "dw_o", keep);
  Tensor w13 = g.make(bf, {2 * F, C}, "w13", keep), dw13 = g.make(f32, {2 * F, C}, "dw13", keep);
  Tensor w2 = g.make(bf, {C, F}, "w2", keep), dw2 = g.make(f32, {C, F}, "dw2", keep);
  Tensor qkv = g.make(bf, {B, T, 3 * C}, "qkv", keep), dqkv = g.make(bf, {B, T, 3 * C}, "dqkv", keep);
  Tensor attn = g.make(bf, {B, T, C}, "attn", keep), dattn = g.make(bf, {B, T, C}, "dattn", keep);
  Tensor branch = g.make(bf, {B, T, C}, "branch", keep), dbranch = g.make(bf, {B, T, C}, "dbranch", keep);
  Tensor h13 = g.make(bf, {B, T, 2 * F}, "h13", keep), dh13 = g.make(bf, {B, T, 2 * F}, "dh13", keep);
  Tensor gated = g.make(bf, {B, T, F}, "gated", keep), dgated = g.make(bf, {B, T, F}, "dgated", keep);
  Tensor dnorm = g.make(bf, {B, T, C}, "dnorm", keep), dresid = g.make(f32, {B, T, C}, "dresid", keep);
  const AttentionDims dims{B, T, H, D, true, AttentionKind::Naive};
  Tensor probs = g.make(bf, {B, H, T, T}, "probs", keep);
  Tensor wte = g.make(f32, {V, C}, "wte", keep), dwte = g.make(f32, {V, C}, "dwte", keep);
  Tensor head = g.make(bf, {V, C}, "head", keep), dhead = g.make(f32, {V, C}, "dhead", keep);
  Tensor logits = g.make(bf, {B, T, V}, "logits", keep), losses = g.make(f32, {N}, "losses", keep);
  keep.emplace_back(g.dev.allocator(), DType::I32, Shape{B, T}, "tokens");
  Tensor tokens = keep.back();
  fill_random(g.dev, tokens, 9, 1.0, V);

  double fwd = 0, bwd = 0;
  auto row = [&](const char* name, double& sum, double flops, double bytes, const std::function<void()>& fn) {
    const double ms = median_ms(g.dev, fn);
    sum += ms;
    std::printf("BENCH op %-28s %8.3f ms", name, ms);
    if (flops > 0) std::printf("  %6.0f TFLOP/s", flops / ms / 1e9);
    if (bytes > 0) std::printf("  %6.0f GB/s", bytes / ms / 1e6);
    std::printf("\n");
  };
  const double nc = double(N) * C, nf = double(N) * F;
  row("fwd linear qkv", fwd, 2.0 * N * C * 3 * C, 0, [&] { g.ops.linear_forward(qkv, normed, w_qkv); });
  row("fwd rope", fwd, 0, 2 * 2.0 * 2 * nc, [&] { g.ops.rope_forward(qkv, H, 10000.0); });
  row("fwd attention (naive)", fwd, 4.0 * B * H * T * T * D, 0,
      [&] { g.ops.attention_forward(attn, probs, qkv, dims); });
  row("fwd linear o", fwd, 2.0 * N * C * C, 0, [&] { g.ops.linear_forward(branch, attn, w_o); });
  row("fwd residual+rmsnorm", fwd, 0, nc * (4 + 2 + 4 + 2),
      [&] { g.ops.residual_rmsnorm_forward(resid2, normed, rstd, resid, branch, gain); });
  row("fwd linear w1|w3", fwd, 2.0 * N * C * 2 * F, 0, [&] { g.ops.linear_forward(h13, normed, w13); });
  row("fwd swiglu", fwd, 0, nf * (4 + 2), [&] { g.ops.swiglu_forward(gated, h13); });
  row("fwd linear w2", fwd, 2.0 * N * F * C, 0, [&] { g.ops.linear_forward(branch, gated, w2); });
  row("fwd residual+rmsnorm (2)", fwd, 0, nc * (4 + 2 + 4 + 2),
      [&] { g.ops.residual_rmsnorm_forward(resid2, normed, rstd, resid, branch, gain); });
  row("bwd convert dresid->bf16", bwd, 0, nc * 6, [&] { g.ops.convert(dbranch, dresid); });
  row("bwd linear w2 dx", bwd, 2.0 * N * F * C, 0,
      [&] { g.ops.linear_backward(dgated, Tensor(), dbranch, Tensor(), w2, false); });
  row("bwd swiglu (+ recompute)", bwd, 0, nf * (2 + 4 + 4 + 2),
      [&] { g.ops.swiglu_backward(dh13, gated, dgated, h13); });
  row("bwd linear w2 dw", bwd, 2.0 * N * F * C, 0,
      [&] { g.ops.linear_backward(Tensor(), dw2, dbranch, gated, w2, false); });
  row("bwd linear w1|w3", bwd, 4.0 * N * C * 2 * F, 0,
      [&] { g.ops.linear_backward(dnorm, dw13, dh13, normed, w13, false); });
  row("bwd rmsnorm", bwd, 0, nc * (4 + 2 + 4 + 4),
      [&] { g.ops.rmsnorm_backward(dresid, dgain, dnorm, resid, gain, rstd, false, Tensor()); });
  row("bwd convert dresid->bf16 (2)", bwd, 0, nc * 6, [&] { g.ops.convert(dbranch, dresid); });
  row("bwd linear o", bwd, 4.0 * N * C * C, 0, [&] { g.ops.linear_backward(dattn, dw_o, dbranch, attn, w_o, false); });
  row("bwd attention (naive)", bwd, 8.0 * B * H * T * T * D, 0,
      [&] { g.ops.attention_backward(dqkv, dattn, attn, probs, qkv, dims); });
  row("bwd rope", bwd, 0, 2 * 2.0 * 2 * nc, [&] { g.ops.rope_backward(dqkv, H, 10000.0); });
  row("bwd linear qkv", bwd, 4.0 * N * C * 3 * C, 0,
      [&] { g.ops.linear_backward(dnorm, dw_qkv, dqkv, normed, w_qkv, false); });
  row("bwd rmsnorm (2)", bwd, 0, nc * (4 + 2 + 4 + 4),
      [&] { g.ops.rmsnorm_backward(dresid, dgain, dnorm, resid, gain, rstd, false, Tensor()); });
  std::printf("BENCH layer total: forward %.3f ms, backward %.3f ms; x32 layers = %.1f ms\n", fwd, bwd,
              32 * (fwd + bwd));
  double once = 0;
  row("embedding fwd", once, 0, nc * 8, [&] { g.ops.embedding_forward(resid, tokens, wte); });
  row("lm head fwd", once, 2.0 * N * C * V, 0, [&] { g.ops.linear_forward(logits, normed, head); });
  row("cross-entropy fwd", once, 0, double(N) * V * 2, [&] { g.ops.cross_entropy_forward(losses, logits, tokens); });
  row("cross-entropy bwd", once, 0, double(N) * V * 4,
      [&] { g.ops.cross_entropy_backward(logits, logits, tokens, 1.0 / N); });
  row("lm head bwd", once, 4.0 * N * C * V, 0,
      [&] { g.ops.linear_backward(dnorm, dhead, logits, normed, head, false); });
  row("embedding bwd", once, 0, nc * 8, [&] { g.ops.embedding_backward(dwte, dresid, tokens, false); });
  std::printf("BENCH outside layers: %.3f ms\n", once);
}

struct Bench {
  const char* name;
  void (*run)();
  const char* what;
};
const Bench kBenches[] = {
    {"ceilings", ceilings, "device copy rate, bf16 and fp32 GEMM rates"},
    {"adamw", adamw, "fused AdamW at xl and 2.7B, whole and in a sharded optimizer's launches"},
    {"grad-accumulation", grad_accumulation, "zeroing gradients and accumulating weight-gradient GEMMs at 2.7B"},
    {"layer-2.7b", layer_2p7b_bf16, "every op of one 2.7B layer, bf16, batch 4, context 512"},
};

int usage(FILE* to) {
  std::fprintf(
      to, "usage: kernel_bench [BENCH ...]\nRuns the named kernel timings on the first GPU (all without a name):\n");
  for (const Bench& b : kBenches) std::fprintf(to, "  %-18s %s\n", b.name, b.what);
  return to == stdout ? 0 : 2;
}

}  // namespace
}  // namespace llmhpc

int main(int argc, char** argv) {
  using namespace llmhpc;
  std::vector<const Bench*> chosen;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(stdout);
    const Bench* found = nullptr;
    for (const Bench& b : kBenches)
      if (!std::strcmp(argv[i], b.name)) found = &b;
    if (!found) {
      std::fprintf(stderr, "kernel_bench: no bench named '%s'\n", argv[i]);
      return usage(stderr);
    }
    chosen.push_back(found);
  }
  if (chosen.empty())
    for (const Bench& b : kBenches) chosen.push_back(&b);
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "kernel_bench: no CUDA GPU visible; these timings need one\n");
    return 1;
  }
  try {
    for (const Bench* b : chosen) b->run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

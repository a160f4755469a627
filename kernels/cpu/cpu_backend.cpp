// CPU Device and Ops. The Ops only check shapes and dispatch on dtype (fp32 or fp64) to
// the templated kernels in cpu_kernels.h; bf16 tensors are widened to fp32 around them
// (Widened, below), so mixed precision runs here as it does on the GPU.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/flash_attention.h"
#include "src/core/nvtx.h"

namespace llmhpc {
namespace {

// "model name" of /proc/cpuinfo, or "unknown".
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
      return start == std::string::npos ? "unknown" : line.substr(start);
    }
  return "unknown";
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(size_t capacity) : host_(capacity), tracer_(host_) {}
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string name() const override {
    const int threads = omp_get_max_threads();
    return "cpu (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
  }
  int ordinal() const override { return -1; }
  size_t memory_capacity() const override { return host_.capacity(); }
  Attrs environment() const override {
    return {{"cpu_model", cpu_model()}, {"cpu_threads", int64_t(omp_get_max_threads())}};
  }
  TracingAllocator& allocator() override { return tracer_; }
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer(int n) override { return make_host_timer(n); }
  void copy_to_device(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_on_device(void* d, const void* s, size_t n) override { std::memmove(d, s, n); }
  void fill_zero(void* d, size_t n) override { std::memset(d, 0, n); }

 private:
  HostAllocator host_;
  TracingAllocator tracer_;
};

// Calls f(T{}) with T the element type of `t` (float or double).
template <class F>
void dispatch(const char* op, const Tensor& t, F&& f) {
  switch (t.dtype) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default:
      throw UsageError(std::string(op) + ": the CPU backend computes in fp32 or fp64 (bf16 stored), not " +
                       dtype_name(t.dtype));
  }
}

// bf16 is a storage format here as on the GPU: an op given bf16 tensors runs its fp32 kernel
// on fp32 copies of them (exact: every bf16 value is an fp32 value) and rounds what it wrote
// back to bf16, to nearest even as the GPU's stores do; both conversions are the backend's own
// convert op. Arithmetic and intermediates stay fp32, so a bf16 run differs from the GPU's
// only in summation order and where a GPU kernel rounds inside (flash's probabilities). Copies
// are plain host memory, freed when the op returns: the tracing allocator sees the op's bf16
// tensors, not this scratch.
class Widened {
 public:
  explicit Widened(Ops& ops) : ops_(ops) {}
  Tensor in(const Tensor& t) { return widen(t, /*read=*/true, /*write=*/false); }
  Tensor out(const Tensor& t) { return widen(t, false, true); }
  Tensor inout(const Tensor& t) { return widen(t, true, true); }
  // Rounds every written copy into its bf16 tensor; call after the op.
  void write_back() {
    for (const auto& [wide, narrow] : written_) ops_.convert(narrow, wide);
  }

 private:
  Tensor widen(const Tensor& t, bool read, bool write) {
    if (t.empty() || t.dtype != DType::BF16) return t;
    copies_.emplace_back(size_t(t.numel()));
    const Tensor wide(copies_.back().data(), DType::F32, t.shape);
    if (read) ops_.convert(wide, t);
    if (write) written_.emplace_back(wide, t);
    return wide;
  }
  Ops& ops_;
  std::vector<std::vector<float>> copies_;
  std::vector<std::pair<Tensor, Tensor>> written_;
};

bool any_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!t->empty() && t->dtype == DType::BF16) return true;
  return false;
}

void same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts)
    if (!first && !t->empty()) first = t;
  if (!first) return;
  const DType d = first->dtype;
  for (const Tensor* t : ts)
    if (!t->empty() && t->dtype != d)
      throw UsageError(std::string(op) + ": the CPU backend needs all floating-point tensors in one dtype");
}

void expect(bool ok, const char* op, const std::string& what) { LLMHPC_CHECK(ok, std::string(op) + ": " + what); }

class CpuOps final : public Ops {
 public:
  using Ops::embedding_backward;
  using Ops::embedding_forward;
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin) override {
    if (any_bf16({&out, &wte})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      embedding_forward(wide.out(out), tokens, wide.in(wte), vocab_begin);
      return wide.write_back();
    }
    const int64_t C = wte.dim(-1), N = tokens.numel();
    expect(out.numel() == N * C && tokens.dtype == DType::I32, "embedding_forward", "shapes");
    same_dtype("embedding_forward", {&out, &wte});
    dispatch("embedding_forward", out, [&](auto T) {
      using E = decltype(T);
      cpu::embedding_forward(out.ptr<E>(), tokens.ptr<int32_t>(), wte.ptr<E>(), N, wte.dim(0), C, vocab_begin);
    });
  }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate, int64_t vocab_begin) override {
    if (any_bf16({&dwte, &dout})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      embedding_backward(accumulate ? wide.inout(dwte) : wide.out(dwte), wide.in(dout), tokens, accumulate,
                         vocab_begin);
      return wide.write_back();
    }
    const int64_t C = dwte.dim(-1), N = tokens.numel();
    expect(dout.numel() == N * C, "embedding_backward", "shapes");
    same_dtype("embedding_backward", {&dwte, &dout});
    dispatch("embedding_backward", dout, [&](auto T) {
      using E = decltype(T);
      cpu::embedding_backward(dwte.ptr<E>(), dout.ptr<E>(), tokens.ptr<int32_t>(), N, dwte.dim(0), C, accumulate,
                              vocab_begin);
    });
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w) override {
    if (any_bf16({&out, &rstd, &x, &w})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      rmsnorm_forward(wide.out(out), wide.out(rstd), wide.in(x), wide.in(w));
      return wide.write_back();
    }
    const int64_t C = w.numel(), N = x.numel() / C;
    expect(out.numel() == x.numel() && rstd.numel() == N, "rmsnorm_forward", "shapes");
    same_dtype("rmsnorm_forward", {&out, &rstd, &x, &w});
    dispatch("rmsnorm_forward", x, [&](auto T) {
      using E = decltype(T);
      cpu::rmsnorm_forward(out.ptr<E>(), rstd.ptr<E>(), x.ptr<E>(), w.ptr<E>(), N, C);
    });
  }
  void residual_rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w) override {
    if (any_bf16({&x_out, &out, &rstd, &x, &delta, &w})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      residual_rmsnorm_forward(wide.out(x_out), wide.out(out), wide.out(rstd), wide.in(x), wide.in(delta), wide.in(w));
      return wide.write_back();
    }
    expect(x_out.numel() == x.numel() && delta.numel() == x.numel(), "residual_rmsnorm_forward", "shapes");
    same_dtype("residual_rmsnorm_forward", {&x_out, &x, &delta});
    dispatch("residual_rmsnorm_forward", x, [&](auto T) {
      using E = decltype(T);
      E* y = x_out.ptr<E>();
      const E *a = x.ptr<E>(), *b = delta.ptr<E>();
      const int64_t n = x.numel();
#pragma omp parallel for simd
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    });
    rmsnorm_forward(out, rstd, x_out, w);
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                        Tensor dx_copy) override {
    if (!dx_copy.empty()) {
      expect(dx_copy.numel() == dx.numel(), "rmsnorm_backward", "dx_copy's shape");
      rmsnorm_backward(dx, dw, dout, x, w, rstd, accumulate, Tensor());
      return convert(dx_copy, dx);
    }
    if (any_bf16({&dx, &dw, &dout, &x, &w, &rstd})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      rmsnorm_backward(wide.inout(dx), accumulate ? wide.inout(dw) : wide.out(dw), wide.in(dout), wide.in(x),
                       wide.in(w), wide.in(rstd), accumulate, Tensor());
      return wide.write_back();
    }
    const int64_t C = w.numel(), N = x.numel() / C;
    expect(dx.numel() == x.numel() && dout.numel() == x.numel() && dw.numel() == C, "rmsnorm_backward", "shapes");
    same_dtype("rmsnorm_backward", {&dx, &dw, &dout, &x, &w, &rstd});
    dispatch("rmsnorm_backward", x, [&](auto T) {
      using E = decltype(T);
      cpu::rmsnorm_backward(dx.ptr<E>(), dw.ptr<E>(), dout.ptr<E>(), x.ptr<E>(), w.ptr<E>(), rstd.ptr<E>(), N, C,
                            accumulate);
    });
  }
  void linear_forward(Tensor y, Tensor x, Tensor w) override {
    if (any_bf16({&y, &x, &w})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      linear_forward(wide.out(y), wide.in(x), wide.in(w));
      return wide.write_back();
    }
    const int64_t out_f = w.dim(0), in_f = w.dim(1), N = x.numel() / in_f;
    expect(x.numel() == N * in_f && y.numel() == N * out_f, "linear_forward", "shapes");
    same_dtype("linear_forward", {&y, &x, &w});
    dispatch("linear_forward", x, [&](auto T) {
      using E = decltype(T);
      cpu::gemm(false, true, N, out_f, in_f, E(1), x.ptr<E>(), in_f, w.ptr<E>(), in_f, E(0), y.ptr<E>(), out_f);
    });
  }
  void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) override {
    if (any_bf16({&dx, &dw, &dy, &x, &w})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      linear_backward(wide.out(dx), accumulate ? wide.inout(dw) : wide.out(dw), wide.in(dy), wide.in(x), wide.in(w),
                      accumulate);
      return wide.write_back();
    }
    const int64_t out_f = w.dim(0), in_f = w.dim(1), N = dy.numel() / out_f;
    expect(dy.numel() == N * out_f && (dx.empty() || dx.numel() == N * in_f) &&
               (dw.empty() || (dw.numel() == w.numel() && x.numel() == N * in_f)),
           "linear_backward", "shapes");
    same_dtype("linear_backward", {&dx, &dw, &dy, &x, &w});
    dispatch("linear_backward", dy, [&](auto T) {
      using E = decltype(T);
      if (!dx.empty())
        cpu::gemm(false, false, N, in_f, out_f, E(1), dy.ptr<E>(), out_f, w.ptr<E>(), in_f, E(0), dx.ptr<E>(), in_f);
      if (!dw.empty())
        cpu::gemm(true, false, out_f, in_f, N, E(1), dy.ptr<E>(), out_f, x.ptr<E>(), in_f, E(accumulate ? 1 : 0),
                  dw.ptr<E>(), in_f);
    });
  }
  void rope_forward(Tensor qkv, int64_t heads, double theta) override { rope(qkv, heads, theta, +1.0); }
  void rope_backward(Tensor dqkv, int64_t heads, double theta) override { rope(dqkv, heads, theta, -1.0); }

  // Naive saves the probabilities (B,H,T,T) in the compute dtype; flash the logsumexp (B,H,T)
  // in fp32 under bf16 (as the CUDA backend), else in the compute dtype (fp64 in reference runs).
  SavedSpec attention_saved(const AttentionDims& d, DType compute) const override {
    if (d.kind == AttentionKind::Flash)
      return {Shape{d.batch, d.heads, d.seq}, compute == DType::BF16 ? DType::F32 : compute};
    return {Shape{d.batch, d.heads, d.seq, d.seq}, compute};
  }
  void attention_forward(Tensor out, Tensor saved, Tensor qkv, const AttentionDims& d) override {
    if (any_bf16({&out, &saved, &qkv})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      attention_forward(wide.out(out), wide.out(saved), wide.in(qkv), d);
      return wide.write_back();
    }
    check_attention("attention_forward", out, saved, qkv, d);
    same_dtype("attention_forward", {&out, &saved, &qkv});
    dispatch("attention_forward", qkv, [&](auto T) {
      using E = decltype(T);
      NvtxRange r("attention");
      if (d.kind == AttentionKind::Flash)
        cpu::flash_attention_forward(out.ptr<E>(), saved.ptr<E>(), qkv.ptr<E>(), d.batch, d.seq, d.heads, d.head_dim,
                                     d.causal);
      else
        cpu::attention_forward(out.ptr<E>(), saved.ptr<E>(), qkv.ptr<E>(), d.batch, d.seq, d.heads, d.head_dim,
                               d.causal);
    });
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor saved, Tensor qkv,
                          const AttentionDims& d) override {
    if (any_bf16({&dqkv, &dout, &out, &saved, &qkv})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      attention_backward(wide.out(dqkv), wide.in(dout), wide.in(out), wide.in(saved), wide.in(qkv), d);
      return wide.write_back();
    }
    check_attention("attention_backward", dout, saved, qkv, d);
    same_dtype("attention_backward", {&dqkv, &dout, &saved, &qkv});
    if (d.kind == AttentionKind::Flash) {  // flash reads the forward's output: D = rowsum(dout * out)
      expect(out.numel() == dout.numel(), "attention_backward", "flash needs the forward's output");
      same_dtype("attention_backward", {&out, &qkv});
    }
    dispatch("attention_backward", qkv, [&](auto T) {
      using E = decltype(T);
      if (d.kind == AttentionKind::Flash)
        cpu::flash_attention_backward(dqkv.ptr<E>(), dout.ptr<E>(), out.ptr<E>(), saved.ptr<E>(), qkv.ptr<E>(), d.batch,
                                      d.seq, d.heads, d.head_dim, d.causal);
      else
        cpu::attention_backward(dqkv.ptr<E>(), dout.ptr<E>(), saved.ptr<E>(), qkv.ptr<E>(), d.batch, d.seq, d.heads,
                                d.head_dim, d.causal);
    });
  }
  void swiglu_forward(Tensor out, Tensor h) override {
    if (any_bf16({&out, &h})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      swiglu_forward(wide.out(out), wide.in(h));
      return wide.write_back();
    }
    const int64_t F = out.dim(-1), N = out.numel() / F;
    expect(h.numel() == 2 * N * F, "swiglu_forward", "shapes");
    same_dtype("swiglu_forward", {&out, &h});
    dispatch("swiglu_forward", h, [&](auto T) {
      using E = decltype(T);
      cpu::swiglu_forward(out.ptr<E>(), h.ptr<E>(), N, F);
    });
  }
  void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h) override {
    if (any_bf16({&dh, &out, &dout, &h})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      swiglu_backward(wide.out(dh), wide.out(out), wide.in(dout), wide.in(h));
      return wide.write_back();
    }
    const int64_t F = dout.dim(-1), N = dout.numel() / F;
    expect(h.numel() == 2 * N * F && dh.numel() == h.numel() && (out.empty() || out.numel() == N * F),
           "swiglu_backward", "shapes");
    same_dtype("swiglu_backward", {&dh, &out, &dout, &h});
    dispatch("swiglu_backward", h, [&](auto T) {
      using E = decltype(T);
      cpu::swiglu_backward(dh.ptr<E>(), out.empty() ? nullptr : out.ptr<E>(), dout.ptr<E>(), h.ptr<E>(), N, F);
    });
  }
  void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) override {
    if (any_bf16({&losses, &logits})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      cross_entropy_forward(wide.out(losses), wide.in(logits), targets);
      return wide.write_back();
    }
    const int64_t V = logits.dim(-1), N = logits.numel() / V;
    expect(losses.numel() == N && targets.numel() == N, "cross_entropy_forward", "shapes");
    same_dtype("cross_entropy_forward", {&losses, &logits});
    dispatch("cross_entropy_forward", logits, [&](auto T) {
      using E = decltype(T);
      cpu::cross_entropy_forward(losses.ptr<E>(), logits.ptr<E>(), targets.ptr<int32_t>(), N, V);
    });
  }
  void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale) override {
    if (any_bf16({&dlogits, &logits})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      cross_entropy_backward(wide.out(dlogits), wide.in(logits), targets, scale);
      return wide.write_back();
    }
    const int64_t V = logits.dim(-1), N = logits.numel() / V;
    expect(dlogits.numel() == logits.numel() && targets.numel() == N, "cross_entropy_backward", "shapes");
    same_dtype("cross_entropy_backward", {&dlogits, &logits});
    dispatch("cross_entropy_backward", logits, [&](auto T) {
      using E = decltype(T);
      cpu::cross_entropy_backward(dlogits.ptr<E>(), logits.ptr<E>(), targets.ptr<int32_t>(), scale, N, V);
    });
  }
  void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_begin,
                           int64_t vocab_valid) override {
    if (any_bf16({&logits})) {  // stored bf16: computed in fp32, fp32 statistics
      Widened wide(*this);
      return cross_entropy_stats(stats, wide.in(logits), targets, vocab_begin, vocab_valid);
    }
    const int64_t V = logits.dim(-1), N = logits.numel() / V;
    expect(stats.numel() == 3 * N && targets.numel() == N && targets.dtype == DType::I32 && vocab_valid >= 0 &&
               vocab_valid <= V,
           "cross_entropy_stats", "shapes");
    same_dtype("cross_entropy_stats", {&stats, &logits});
    dispatch("cross_entropy_stats", logits, [&](auto T) {
      using E = decltype(T);
      cpu::cross_entropy_stats(stats.ptr<E>(), logits.ptr<E>(), targets.ptr<int32_t>(), N, V, vocab_begin, vocab_valid);
    });
  }
  void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats) override {
    if (any_bf16({&losses, &lse, &stats})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      cross_entropy_combine(wide.out(losses), wide.out(lse), wide.in(stats));
      return wide.write_back();
    }
    const int64_t N = losses.numel(), R = N > 0 ? stats.numel() / (3 * N) : 0;
    expect(lse.numel() == N && (N == 0 || (R >= 1 && stats.numel() == 3 * N * R)), "cross_entropy_combine", "shapes");
    same_dtype("cross_entropy_combine", {&losses, &lse, &stats});
    dispatch("cross_entropy_combine", stats, [&](auto T) {
      using E = decltype(T);
      cpu::cross_entropy_combine(losses.ptr<E>(), lse.ptr<E>(), stats.ptr<E>(), N, R);
    });
  }
  void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale,
                                  int64_t vocab_begin, int64_t vocab_valid) override {
    if (any_bf16({&dlogits, &logits, &lse})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      cross_entropy_backward_lse(wide.out(dlogits), wide.in(logits), targets, wide.in(lse), scale, vocab_begin,
                                 vocab_valid);
      return wide.write_back();
    }
    const int64_t V = logits.dim(-1), N = logits.numel() / V;
    expect(dlogits.numel() == logits.numel() && targets.numel() == N && targets.dtype == DType::I32 &&
               lse.numel() == N && vocab_valid >= 0 && vocab_valid <= V,
           "cross_entropy_backward_lse", "shapes");
    same_dtype("cross_entropy_backward_lse", {&dlogits, &logits, &lse});
    dispatch("cross_entropy_backward_lse", logits, [&](auto T) {
      using E = decltype(T);
      cpu::cross_entropy_backward_lse(dlogits.ptr<E>(), logits.ptr<E>(), targets.ptr<int32_t>(), lse.ptr<E>(), scale, N,
                                      V, vocab_begin, vocab_valid);
    });
  }
  using Ops::adamw_step;
  void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_lowp, const std::vector<AdamWSlice>& slices,
                  const AdamWHyper& h, int64_t step) override {
    check_adamw_slices(p, g, m, v, p_lowp, slices);
    if (g.dtype == DType::BF16) {  // bf16 gradients (--grad-dtype bf16): each slice widened (exact)
      same_dtype("adamw_step", {&p, &m, &v});
      expect(p.dtype == DType::F32, "adamw_step", "bf16 gradients update fp32 parameters");
      for (const AdamWSlice& s : slices) {
        std::vector<float> wide(size_t(s.size));
        convert(Tensor(wide.data(), DType::F32, {s.size}), g.slice(s.at, {s.size}));
        cpu::adamw_step(p.ptr<float>() + s.at, wide.data(), m.ptr<float>() + s.state_at, v.ptr<float>() + s.state_at,
                        s.size, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.grad_scale, step);
      }
    } else {
      same_dtype("adamw_step", {&p, &g, &m, &v});
      dispatch("adamw_step", p, [&](auto T) {
        using E = decltype(T);
        for (const AdamWSlice& s : slices)
          cpu::adamw_step(p.ptr<E>() + s.at, g.ptr<E>() + s.at, m.ptr<E>() + s.state_at, v.ptr<E>() + s.state_at,
                          s.size, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.grad_scale, step);
      });
    }
    if (!p_lowp.empty())
      for (const AdamWSlice& s : slices) convert(p_lowp.slice(s.at, {s.size}), p.slice(s.at, {s.size}));
  }
  void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) override {
    check_sum_of_squares(out, x, spans);
    if (x.dtype == DType::BF16) {  // bf16 gradients: each span widened (exact), summed as fp32
      double sum = 0;
      for (const Span& s : spans) {
        std::vector<float> wide(size_t(s.size));
        convert(Tensor(wide.data(), DType::F32, {s.size}), x.slice(s.at, {s.size}));
        sum += cpu::sum_of_squares(wide.data(), {{0, s.size}});
      }
      *out.ptr<double>() = sum;
      return;
    }
    dispatch("sum_of_squares", x, [&](auto T) {
      using E = decltype(T);
      *out.ptr<double>() = cpu::sum_of_squares(x.ptr<E>(), spans);
    });
  }
  void convert(Tensor dst, Tensor src) override {
    expect(dst.numel() == src.numel(), "convert", "element counts differ");
    const int64_t n = src.numel();
    std::vector<double> tmp(n);  // simple and exact for every supported pair
    to_doubles(src.data, src.dtype, size_t(n), tmp.data());
    from_doubles(tmp.data(), size_t(n), dst.dtype, dst.data);
  }
  void scale(Tensor x, double factor) override {
    if (any_bf16({&x})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      scale(wide.inout(x), factor);
      return wide.write_back();
    }
    dispatch("scale", x, [&](auto T) {
      using E = decltype(T);
      E* p = x.ptr<E>();
      const int64_t n = x.numel();
#pragma omp parallel for simd
      for (int64_t i = 0; i < n; ++i) p[i] = E(p[i] * factor);
    });
  }
  void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound) override {
    expect(dst.dtype != DType::I32, "random_normal", "needs a floating-point tensor");
    cpu::random_normal(dst.data, dst.dtype, dst.numel(), seed, stream, std, bound);
  }
  void accumulation_experiment(Tensor out, double value, int64_t n) override {
    expect(out.numel() == 4 && out.dtype == DType::F32, "accumulation_experiment", "out must be 4 fp32");
    const float x32 = float(value), x16 = half_bits_to_float(float_to_half_bits(x32)), xb = round_to_bf16(x32);
    float* o = out.ptr<float>();
    float s32 = o[0], s16 = o[1], mixed = o[2], sb = o[3];
    for (int64_t i = 0; i < n; ++i) {
      s32 += x32;
      s16 = half_bits_to_float(float_to_half_bits(s16 + x16));
      mixed += x16;
      sb = round_to_bf16(sb + xb);
    }
    o[0] = s32, o[1] = s16, o[2] = mixed, o[3] = sb;
  }
  std::vector<std::pair<std::string, std::string>> attention_variant(const AttentionDims& d,
                                                                     DType compute) const override {
    return {{"attention_kernel", d.kind == AttentionKind::Flash ? "cpu flash" : "cpu naive"}};
  }

 private:
  void rope(Tensor qkv, int64_t heads, double theta, double sign) {
    if (any_bf16({&qkv})) {  // stored bf16: computed in fp32
      Widened wide(*this);
      rope(wide.inout(qkv), heads, theta, sign);
      return wide.write_back();
    }
    const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.numel() / (B * T * 3 * heads);
    expect(qkv.numel() == B * T * 3 * heads * D && D % 2 == 0, "rope", "qkv must be (B,T,3,H,D) with D even");
    dispatch("rope", qkv, [&](auto E0) {
      using E = decltype(E0);
      cpu::rope_apply(qkv.ptr<E>(), B, T, heads, D, theta, sign);
    });
  }
  static void check_attention(const char* op, const Tensor& out, const Tensor& saved, const Tensor& qkv,
                              const AttentionDims& d) {
    const int64_t n = d.batch * d.seq * d.heads * d.head_dim;
    expect(out.numel() == n && qkv.numel() == 3 * n, op, "shapes");
    if (d.kind == AttentionKind::Flash)  // the logsumexp L (B,H,T)
      expect(saved.numel() == d.batch * d.heads * d.seq, op, "flash saves the logsumexp (B,H,T)");
  }
};

}  // namespace

Backend make_cpu_backend(const BackendOptions& options) {
  Backend b;
  b.device = std::make_unique<CpuDevice>(options.memory_limit ? options.memory_limit : host_physical_memory());
  b.ops = std::make_unique<CpuOps>();
  return b;
}

}  // namespace llmhpc

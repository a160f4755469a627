// The CPU backend's Profiler (kernels/profiler.h): an Ops decorator that times every call
// with the steady clock and records it as an activity named after the op, in the phase that
// was open when it was called. CPU ops run when they are called, so a phase's device time is
// its host time. Outside a window a call costs one flag check more than the op itself.
#include <chrono>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/profiler.h"

namespace llmhpc {
namespace {

enum OpId : int {
  kEmbeddingForward,
  kEmbeddingBackward,
  kRmsnormForward,
  kResidualRmsnormForward,
  kRmsnormBackward,
  kLinearForward,
  kLinearBackward,
  kRopeForward,
  kRopeBackward,
  kAttentionForward,
  kAttentionBackward,
  kSwigluForward,
  kSwigluBackward,
  kCrossEntropyForward,
  kCrossEntropyBackward,
  kCrossEntropyStats,
  kCrossEntropyCombine,
  kCrossEntropyBackwardLse,
  kAdamwStep,
  kSumOfSquares,
  kConvert,
  kScale,
  kNumOps
};

// The activity names: the Ops methods' own.
// clang-format off
constexpr const char* kOpNames[kNumOps] = {
    "embedding_forward", "embedding_backward", "rmsnorm_forward", "residual_rmsnorm_forward", "rmsnorm_backward",
    "linear_forward", "linear_backward", "rope_forward", "rope_backward", "attention_forward", "attention_backward",
    "swiglu_forward", "swiglu_backward", "cross_entropy_forward", "cross_entropy_backward", "cross_entropy_stats",
    "cross_entropy_combine", "cross_entropy_backward_lse", "adamw_step", "sum_of_squares", "convert", "scale"};
// clang-format on

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class OpProfiler final : public Profiler {
 public:
  explicit OpProfiler(Ops& inner) : Profiler(DeviceSpans::SameAsHost), timed_(*this, inner) {
    for (int op = 0; op < kNumOps; ++op) name_ids_[op] = intern_name(kOpNames[op], ActivityKind::Op);
  }
  std::string method() const override { return "host ops"; }
  bool traces_activities() const override { return true; }
  Ops& ops() override { return timed_; }

 protected:
  void begin_window() override { calls_ = 0; }
  void end_window() override {}
  int64_t now_ns() override { return steady_ns(); }

 private:
  // One timed call: the phase open at its start, recorded at its end (also when the op throws).
  class Call {
   public:
    Call(OpProfiler& p, OpId op) : p_(p.active() ? &p : nullptr) {
      if (!p_) return;
      a_.kind = ActivityKind::Op;
      a_.name = p.name_ids_[op];
      a_.range = p.current_range();
      a_.correlation = p.calls_++;
      a_.start_ns = steady_ns();
    }
    ~Call() {
      if (!p_) return;
      a_.end_ns = steady_ns();
      p_->deliver(a_);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    OpProfiler* p_;
    Activity a_;
  };

  class TimedOps final : public Ops {
   public:
    TimedOps(OpProfiler& p, Ops& inner) : p_(p), in_(inner) {}
    using Ops::embedding_backward;
    using Ops::embedding_forward;
    void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin) override {
      Call c(p_, kEmbeddingForward);
      in_.embedding_forward(out, tokens, wte, vocab_begin);
    }
    void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate, int64_t vocab_begin) override {
      Call c(p_, kEmbeddingBackward);
      in_.embedding_backward(dwte, dout, tokens, accumulate, vocab_begin);
    }
    void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w) override {
      Call c(p_, kRmsnormForward);
      in_.rmsnorm_forward(out, rstd, x, w);
    }
    void residual_rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w) override {
      Call c(p_, kResidualRmsnormForward);
      in_.residual_rmsnorm_forward(x_out, out, rstd, x, delta, w);
    }
    void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                          Tensor dx_copy) override {
      Call c(p_, kRmsnormBackward);
      in_.rmsnorm_backward(dx, dw, dout, x, w, rstd, accumulate, dx_copy);
    }
    void linear_forward(Tensor y, Tensor x, Tensor w) override {
      Call c(p_, kLinearForward);
      in_.linear_forward(y, x, w);
    }
    void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) override {
      Call c(p_, kLinearBackward);
      in_.linear_backward(dx, dw, dy, x, w, accumulate);
    }
    void rope_forward(Tensor qkv, int64_t heads, double theta) override {
      Call c(p_, kRopeForward);
      in_.rope_forward(qkv, heads, theta);
    }
    void rope_backward(Tensor dqkv, int64_t heads, double theta) override {
      Call c(p_, kRopeBackward);
      in_.rope_backward(dqkv, heads, theta);
    }
    SavedSpec attention_saved(const AttentionDims& d, DType compute) const override {
      return in_.attention_saved(d, compute);
    }
    void attention_forward(Tensor out, Tensor saved, Tensor qkv, const AttentionDims& d) override {
      Call c(p_, kAttentionForward);
      in_.attention_forward(out, saved, qkv, d);
    }
    void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor saved, Tensor qkv,
                            const AttentionDims& d) override {
      Call c(p_, kAttentionBackward);
      in_.attention_backward(dqkv, dout, out, saved, qkv, d);
    }
    void swiglu_forward(Tensor out, Tensor h) override {
      Call c(p_, kSwigluForward);
      in_.swiglu_forward(out, h);
    }
    void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h) override {
      Call c(p_, kSwigluBackward);
      in_.swiglu_backward(dh, out, dout, h);
    }
    void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) override {
      Call c(p_, kCrossEntropyForward);
      in_.cross_entropy_forward(losses, logits, targets);
    }
    void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale) override {
      Call c(p_, kCrossEntropyBackward);
      in_.cross_entropy_backward(dlogits, logits, targets, scale);
    }
    void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_begin,
                             int64_t vocab_valid) override {
      Call c(p_, kCrossEntropyStats);
      in_.cross_entropy_stats(stats, logits, targets, vocab_begin, vocab_valid);
    }
    void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats) override {
      Call c(p_, kCrossEntropyCombine);
      in_.cross_entropy_combine(losses, lse, stats);
    }
    void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale,
                                    int64_t vocab_begin, int64_t vocab_valid) override {
      Call c(p_, kCrossEntropyBackwardLse);
      in_.cross_entropy_backward_lse(dlogits, logits, targets, lse, scale, vocab_begin, vocab_valid);
    }
    void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp,
                    const std::vector<AdamWSlice>& slices, const AdamWHyper& h, int64_t step) override {
      Call c(p_, kAdamwStep);
      in_.adamw_step(param, grad, m, v, param_lowp, slices, h, step);
    }
    void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) override {
      Call c(p_, kSumOfSquares);
      in_.sum_of_squares(out, x, spans);
    }
    void convert(Tensor dst, Tensor src) override {
      Call c(p_, kConvert);
      in_.convert(dst, src);
    }
    void scale(Tensor x, double factor) override {
      Call c(p_, kScale);
      in_.scale(x, factor);
    }
    std::vector<std::pair<std::string, std::string>> attention_variant(const AttentionDims& d,
                                                                       DType compute) const override {
      return in_.attention_variant(d, compute);
    }
    void accumulation_experiment(Tensor out, double value, int64_t n) override {  // not a model op: untimed
      in_.accumulation_experiment(out, value, n);
    }
    void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound) override {
      in_.random_normal(dst, seed, stream, std, bound);  // initialisation, not a step's op: untimed
    }

   private:
    OpProfiler& p_;
    Ops& in_;
  };

  int32_t name_ids_[kNumOps];
  int64_t calls_ = 0;
  TimedOps timed_;
};

}  // namespace

std::unique_ptr<Profiler> make_cpu_op_profiler(Ops& ops) { return std::make_unique<OpProfiler>(ops); }

}  // namespace llmhpc

// The backend contract: Device (memory, copies, timing) and Ops (every math op of the
// model, forward and backward side by side). The model is written once against these;
// each backend (kernels/cpu, kernels/cuda) implements them. Nothing here knows which
// backends exist: see kernels/backend.h for the one factory.
//
// Conventions for every op:
//  - Tensors are contiguous, row-major, on the backend's device. Shapes are in comments.
//  - Parameter gradients (dwte, dw) are OVERWRITTEN, or ACCUMULATED (+=) when the call's
//    `accumulate` is true (gradient accumulation over micro-batches). Each parameter's
//    gradient is written once per backward, so no pass that zeroes them is needed.
//  - rmsnorm_backward and residual_rmsnorm paths ACCUMULATE into the residual gradient dx.
//  - Every other output is OVERWRITTEN.
//  - Storage dtypes: parameters, their gradients and the residual stream are "param dtype"
//    (fp32; fp64 on the CPU backend for reference runs); under mixed precision the gradients
//    (dwte, dw, AdamW's and sum_of_squares' input) may be bf16 (GradientDType::BF16), each
//    computed in fp32 and rounded once where it is stored. Activations that feed or leave a
//    matrix product are "compute dtype" (fp32, or bf16 under mixed precision). Norm
//    statistics (rstd), losses and softmax statistics are fp32 (fp64 in fp64 runs).
//    Arithmetic is always at least fp32: bf16 is a storage format, as under autocast.
//  - A backend throws UsageError for a dtype combination it does not support.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/core/allocator.h"
#include "src/core/attrs.h"
#include "src/core/check.h"
#include "src/core/device_sensors.h"
#include "src/core/tensor.h"
#include "src/core/timer.h"

namespace llmhpc {

enum class DeviceKind { Cpu, Cuda };

// Device work recorded once and replayed with one launch (a CUDA graph): what a host-bound
// step gains is the launches' host cost. Made by Device::capture; holds the memory the
// recorded work used until it is destroyed.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void launch() = 0;  // on the compute stream, ordered like any other work
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (16 threads)", "NVIDIA H100 80GB HBM3"
  virtual int ordinal() const = 0;       // GPU index, -1 for the CPU
  virtual size_t memory_capacity() const = 0;
  // Device memory in use as the driver counts it (total - free: what bypasses the allocator
  // too, as NCCL's buffers, library workspaces and the caching allocator's free blocks, and
  // other processes on the GPU); -1 on the CPU, whose memory is the process's resident set.
  virtual int64_t memory_used() const { return -1; }
  // What a reader of results needs to know about this device (root attributes of the rank
  // files, docs/hdf5-schema.md): the GPU, its clocks and power limit, the CUDA versions; on
  // the CPU, its model and threads.
  virtual Attrs environment() const = 0;
  // The device's sensors now (NVML on a GPU: SM clock, power, temperature, clock event
  // reasons), for the sweep's monitor, which calls it from a thread of its own; false where
  // there is nothing to read (the CPU, a GPU without NVML).
  virtual bool read_sensors(DeviceReading&) const { return false; }

  // All allocations for tensors go through this tracing allocator.
  virtual TracingAllocator& allocator() = 0;

  virtual void synchronize() = 0;
  // Marks on the compute stream (src/core/timer.h).
  virtual std::unique_ptr<Timer> make_timer(int num_marks) = 0;

  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;

  // Records the device work `work` enqueues on the compute stream, without running it, as a
  // graph to replay. The work must not wait for the device; it may allocate (the blocks it
  // used are the graph's until it is destroyed). CUDA only: the CPU throws UsageError.
  virtual std::unique_ptr<DeviceGraph> capture(const std::function<void()>&) {
    throw UsageError("{cuda_graph} needs {device} cuda: the " + name() + " runs each op as it is called");
  }

  // The stream compute is ordered on (cudaStream_t), or nullptr on the CPU. Lets the
  // communication layer order its work against compute without including CUDA here.
  virtual void* native_stream() { return nullptr; }
};

enum class AttentionKind { Naive, Flash };

struct AttentionDims {
  int64_t batch = 1, seq = 1, heads = 1, head_dim = 1;
  bool causal = true;
  AttentionKind kind = AttentionKind::Naive;
};

// What attention saves from forward for backward: naive keeps the probabilities
// (B, H, T, T); flash keeps the logsumexp per query row (B, H, T).
struct SavedSpec {
  Shape shape;
  DType dtype;
};

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  // The factor each gradient is multiplied by first, in its dtype (gradient clipping's, as
  // torch's clip_grad_norm_ scales the gradients in place before the step); 1: none.
  double grad_scale = 1.0;
};

// `size` elements of a flat tensor from `at`.
struct Span {
  int64_t at = 0, size = 0;
};

// `size` elements of one AdamW step: at `at` of the parameters, gradients and bf16 copy, and
// at `state_at` of m and v (a sharded optimizer keeps the state of its ranges packed).
struct AdamWSlice {
  int64_t at = 0, state_at = 0, size = 0;
};

// Both backends' check of adamw_step's arguments: grad (and the copy, if any) as long as
// param, every slice inside param and the state.
inline void check_adamw_slices(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp,
                               const std::vector<AdamWSlice>& slices) {
  const int64_t n = param.numel();
  LLMHPC_CHECK(grad.numel() == n && m.numel() == v.numel() && (param_lowp.empty() || param_lowp.numel() == n),
               "adamw_step: shapes");
  for (const AdamWSlice& s : slices)
    LLMHPC_CHECK(s.size >= 0 && s.at >= 0 && s.at + s.size <= n && s.state_at >= 0 && s.state_at + s.size <= m.numel(),
                 "adamw_step: a slice outside the tensors");
}

// Both backends' check of sum_of_squares' arguments: one fp64 element out, every span inside x.
inline void check_sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) {
  LLMHPC_CHECK(out.numel() == 1 && out.dtype == DType::F64, "sum_of_squares: out must be one fp64 element");
  for (const Span& s : spans)
    LLMHPC_CHECK(s.at >= 0 && s.size >= 0 && s.at + s.size <= x.numel(), "sum_of_squares: a span outside x");
}

class Ops {
 public:
  virtual ~Ops() = default;

  // out (B,T,C) = wte[tokens - vocab_begin]; tokens (B,T) int32 ids of the whole vocabulary,
  // wte (Vl,C) its rows [vocab_begin, vocab_begin + Vl) (all of it, or one rank's part of a
  // vocabulary split across ranks). A token outside that range gets a row of zeros, so the sum
  // over the parts of a split table is the whole table's lookup.
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin) = 0;
  // dwte (Vl,C) = (or +=) scatter-add of dout (B,T,C) at tokens - vocab_begin; tokens outside
  // [vocab_begin, vocab_begin + Vl) add nothing; rows of absent tokens get 0.
  virtual void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate, int64_t vocab_begin) = 0;
  // The whole table: vocab_begin 0.
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte) { embedding_forward(out, tokens, wte, 0); }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, bool accumulate) {
    embedding_backward(dwte, dout, tokens, accumulate, 0);
  }

  // out (N,C) = x / rms(x) * w, rms over C with eps 1e-5; rstd (N) saved. x (N,C), w (C).
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w) = 0;
  // x_out (N,C) = x + delta; then out, rstd = rmsnorm(x_out, w). The fused residual step.
  virtual void residual_rmsnorm_forward(Tensor x_out, Tensor out, Tensor rstd, Tensor x, Tensor delta, Tensor w) = 0;
  // dx (N,C) += d/dx (always accumulated: the residual gradient), dw (C) = (or +=) d/dw,
  // from dout (N,C) and the saved x, rstd. If dx_copy is not empty (CUDA: bf16) it receives the
  // new dx in its dtype, bitwise convert(dx_copy, dx): the gradient the next products read,
  // without a pass of its own.
  virtual void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                                Tensor dx_copy) = 0;

  // y (N,out) = x (N,in) W^T with W (out,in). No bias.
  virtual void linear_forward(Tensor y, Tensor x, Tensor w) = 0;
  // dx (N,in) = dy W (skipped if dx is empty); dw (out,in) = (or +=) dy^T x (skipped if dw
  // is empty; x may then be empty too).
  virtual void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate) = 0;

  // RoPE in place on the q and k parts of qkv (B,T,3,H,D), interleaved pairs
  // (x[2i], x[2i+1]) at position t rotated by t * theta^(-2i/D). v is untouched.
  virtual void rope_forward(Tensor qkv, int64_t heads, double theta) = 0;
  // The inverse rotation, in place on the dq and dk parts of dqkv (B,T,3,H,D).
  virtual void rope_backward(Tensor dqkv, int64_t heads, double theta) = 0;

  // Multi-head attention with scale 1/sqrt(D): out (B,T,H*D) from qkv (B,T,3,H,D).
  virtual SavedSpec attention_saved(const AttentionDims& d, DType compute) const = 0;
  virtual void attention_forward(Tensor out, Tensor saved, Tensor qkv, const AttentionDims& d) = 0;
  // dqkv (B,T,3,H,D) from dout (B,T,H*D) and what forward saved.
  virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor out, Tensor saved, Tensor qkv,
                                  const AttentionDims& d) = 0;

  // SwiGLU gate: out (N,F) = silu(h[:, :F]) * h[:, F:], h (N,2F) = [W1 x, W3 x].
  virtual void swiglu_forward(Tensor out, Tensor h) = 0;
  // dh (N,2F) from dout (N,F) and h. If `out` is not empty it also receives swiglu_forward's
  // out, bitwise: the model's backward needs that product again, and recomputing it here
  // reads h once instead of twice.
  virtual void swiglu_backward(Tensor dh, Tensor out, Tensor dout, Tensor h) = 0;

  // losses (N) = logsumexp(logits[n]) - logits[n, targets[n]]; logits (N,V), targets (N) int32.
  virtual void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) = 0;
  // dlogits (N,V) = (softmax(logits) - onehot(targets)) * scale. dlogits may alias logits.
  virtual void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, double scale) = 0;

  // Cross-entropy over a vocabulary split across R ranks (Megatron-LM's vocab-parallel
  // cross-entropy): each rank holds logits (N,Vl) for the columns [vocab_begin, vocab_begin + Vl)
  // of the vocabulary, of which only the first vocab_valid are real (the rest is padding, never
  // read into a result). The losses come from per-row statistics that R ranks all-gather:
  //   stats -> all-gather (R,N,3) -> combine -> losses, lse;  backward_lse -> dlogits.
  // With R = 1, vocab_begin 0 and vocab_valid V these are cross_entropy_forward/backward up to
  // rounding.
  //
  // stats (N,3) from logits (N,Vl) in the compute dtype and targets (N) int32 ids of the whole
  // vocabulary: [n,0] = the max of logits[n, :vocab_valid], [n,1] = the sum of
  // exp(logits[n, i] - [n,0]) over i < vocab_valid, [n,2] = logits[n, targets[n] - vocab_begin]
  // if vocab_begin <= targets[n] < vocab_begin + vocab_valid, else 0. stats fp32 (fp64 when the
  // logits are).
  virtual void cross_entropy_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_begin,
                                   int64_t vocab_valid) = 0;
  // losses (N), lse (N) from stats (R,N,3), the R ranks' stats stacked: M = max_r stats[r,n,0],
  // S = sum_r stats[r,n,1] * exp(stats[r,n,0] - M), lse[n] = M + log S (the logsumexp of the
  // whole row), losses[n] = lse[n] - sum_r stats[r,n,2]. R = stats.numel() / (3 N). losses in
  // the param dtype, lse in the stats' dtype.
  virtual void cross_entropy_combine(Tensor losses, Tensor lse, Tensor stats) = 0;
  // dlogits (N,Vl) = (exp(logits - lse[n]) - [vocab_begin + i == targets[n]]) * scale for the
  // columns i < vocab_valid, and 0 for the padding columns; lse (N) from cross_entropy_combine.
  // dlogits may alias logits.
  virtual void cross_entropy_backward_lse(Tensor dlogits, Tensor logits, Tensor targets, Tensor lse, double scale,
                                          int64_t vocab_begin, int64_t vocab_valid) = 0;

  // One AdamW step (torch.optim.AdamW semantics) over disjoint slices of flat tensors:
  // param, m, v updated in place from grad * h.grad_scale; `step` counts from 1. If param_lowp is not
  // empty it receives the updated parameters in its dtype (the bf16 copy for matmuls).
  // Several slices take one launch where one kernel can do them (a sharded optimizer's
  // slices of every bucket), each element's arithmetic the same as alone.
  virtual void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp,
                          const std::vector<AdamWSlice>& slices, const AdamWHyper& h, int64_t step) = 0;
  // The whole of tensors of equal length: one slice.
  void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_lowp, const AdamWHyper& h, int64_t step) {
    adamw_step(param, grad, m, v, param_lowp, {{0, 0, param.numel()}}, h, step);
  }

  // out (1 element, fp64) = the sum of x[i]^2 over the spans of x (fp32, fp64 or bf16), added in
  // double in an order fixed by the spans alone (not by threads or timing), so ranks holding the
  // same values get bitwise the same sum: gradient clipping's norm.
  virtual void sum_of_squares(Tensor out, Tensor x, const std::vector<Span>& spans) = 0;

  // dst = src converted elementwise (same number of elements, any supported dtypes).
  virtual void convert(Tensor dst, Tensor src) = 0;
  // x *= factor, in place.
  virtual void scale(Tensor x, double factor) = 0;
  // dst[i] = std * random_normal(seed, stream, i, bound) (src/core/random.h: a standard normal
  // value truncated to +-bound), rounded to dst's dtype: bitwise the same on every backend, so
  // a model initialised on a GPU (in milliseconds) holds the CPU reference's weights.
  virtual void random_normal(Tensor dst, uint64_t seed, uint64_t stream, double std, double bound) = 0;

  // The accumulation experiment of mixed precision: `n` more sequential additions of `value` to
  // the sums out (4) fp32 holds (zeros: the experiment from its start), each rounded to the sum's
  // type as PyTorch's `s += x` (the addition in fp32, then rounded): [0] fp32 values into an fp32
  // sum, [1] fp16 values into an fp16 sum, [2] fp16 values into an fp32 sum, [3] bf16 values into
  // a bf16 sum. Sums that continue are bitwise those of one call (they hold their type's values),
  // so a long experiment runs in parts that say how far it is.
  virtual void accumulation_experiment(Tensor out, double value, int64_t n) = 0;

  // What attention_forward/backward run for these sizes, as (name, value) pairs recorded with
  // results: the kernel family and its tiling/variant choices. Empty values are omitted.
  virtual std::vector<std::pair<std::string, std::string>> attention_variant(const AttentionDims& d,
                                                                             DType compute) const = 0;
};

}  // namespace llmhpc

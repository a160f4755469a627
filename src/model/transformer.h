// TransformerLM: token embedding -> N pre-norm blocks -> RMSNorm -> LM head, written once
// against Ops. The model owns its flat parameters and gradients,
// the bf16 copy of the weights under mixed precision, the batch, and the activations that
// backward needs: those only from a forward to the end of its backward (see forward()). It
// never talks to other ranks: a ParallelHooks hears when a range of gradients is final,
// which is where data-parallel strategies hook in.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/allocator.h"
#include "src/model/config.h"
#include "src/model/parallel_hooks.h"
#include "src/model/params.h"
#include "src/model/tensor_parallel.h"

namespace llmhpc {

enum class Precision { FP32, BF16, FP64 };
Precision parse_precision(const std::string& text);  // fp32 | bf16 | fp64
const char* precision_name(Precision p);
DType param_dtype(Precision p);    // master weights, gradients (GradientDType::Master), residual stream
DType compute_dtype(Precision p);  // matrix-product operands and outputs

AttentionKind parse_attention(const std::string& text);  // naive | flash
const char* attention_name(AttentionKind k);

// How the model trades time for memory. Both plans recompute the SwiGLU product in backward
// (in the pass over h13 its backward makes anyway). Fast keeps each layer's two norm outputs
// for backward's weight gradients, as PyTorch's autograd does; LowMemory recomputes them (one
// more pass over the residual stream per norm) and, under bf16, casts each layer's weights
// when forward or backward reaches it instead of keeping a bf16 copy of all weights. Results
// are bitwise the same.
enum class MemoryPlan { Fast, LowMemory };

// Where backward writes the parameter gradients. Whole: one flat buffer of every gradient,
// kept until the next backward (data parallelism, gradient checks and AdamW after backward
// read it). PerRange: one buffer the size of the largest range backward reports (a layer, the
// head with the final norm, or the embedding), reused: a range's gradients live only until
// the ParallelHooks has consumed them (the optimizer applied as backward finishes each
// range: run_step), 4 bytes per parameter less. No padded buffers, no accumulation.
enum class GradientStorage { Whole, PerRange };

// What backward writes the parameter gradients in. Master: the master weights' dtype (fp32;
// fp64 in reference runs), as PyTorch's autocast leaves them in .grad. BF16 (--precision bf16
// only): the weight-gradient products and norm/embedding backwards round into bf16, as llm.c
// keeps them: half the gradients' memory, reductions of half the bytes, and half the gradient
// bytes that clipping and AdamW read; micro-batches add up in bf16 (one rounding each). AdamW
// widens them as it reads.
enum class GradientDType { Master, BF16 };

// Where the parameters, their gradients and the bf16 copy live. Local: in the model's flat
// buffers. Sharded (ZeRO-3): nowhere in the model; a ParallelHooks (set_parallel_hooks) that
// holds them sharded among the ranks gives each unit's parameters as forward and backward reach
// it (unit_parameters) and the place where backward writes its gradients (unit_gradients).
enum class ParameterStorage { Local, Sharded };
GradientDType parse_gradient_dtype(const std::string& text);  // same | bf16
// The dtype the gradients are stored in, or a UsageError for bf16 gradients without bf16 precision.
DType gradient_dtype(Precision p, GradientDType g);

class TransformerLM {
 public:
  // What the model is and how it runs: its shape, precision, attention and memory plan, and how
  // its gradients are kept. Owned here, filled by the modes from the command line.
  struct Config {
    ModelConfig shape;
    Precision precision = Precision::FP32;
    AttentionKind attention = AttentionKind::Naive;
    MemoryPlan memory = MemoryPlan::Fast;
    // The length of the flat buffers (parameters, gradients, bf16 copy), at least the parameter
    // count (0: exactly that). ZeRO-1 asks for a few more, so that every reduce-scatter divides
    // evenly among the ranks; the padding comes after every parameter, so no view moves, and it
    // is zero and stays zero (no gradient is ever written there, and AdamW keeps a zero weight
    // with a zero gradient at zero).
    int64_t flat_elements = 0;
    GradientStorage gradients = GradientStorage::Whole;
    GradientDType grad_dtype = GradientDType::Master;
    ParameterStorage storage = ParameterStorage::Local;
    // This rank's share of a tensor-parallel model (src/model/tensor_parallel.h): the layout's
    // parts, and the collectives inside each layer. One rank: the whole model.
    TensorParallel tensor_parallel = {};
  };
  TransformerLM(const Config& config, Device& device, Ops& ops);
  ~TransformerLM();

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }  // this rank's parameters
  const TensorParallel& tensor_parallel() const { return tp_; }
  Precision precision() const { return precision_; }
  DType grad_dtype() const { return grad_dtype_; }  // the gradients' storage (GradientDType)
  Device& device() { return device_; }

  ParameterStorage storage() const { return storage_; }
  // Sharded storage: where forward and backward get each unit's parameters and gradients;
  // must live as long as the model runs steps.
  void set_parallel_hooks(ParallelHooks* hooks) { hooks_ = hooks; }

  // The flat buffers, param dtype, padding included: layout().total() parameters, then zeros.
  // Empty under ParameterStorage::Sharded.
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }  // empty under GradientStorage::PerRange
  GradientStorage gradient_storage() const {
    return grads_.empty() && storage_ == ParameterStorage::Local ? GradientStorage::PerRange : GradientStorage::Whole;
  }
  // The gradients of flat elements [begin, end) as backward last wrote them: a view of
  // grads(), or under PerRange of the buffer holding the range backward reported last.
  Tensor gradients(int64_t begin, int64_t end) const;
  // The bf16 copy of all weights, which the optimizer keeps current; empty unless bf16 with
  // MemoryPlan::Fast, and while master weights arrive (from parameters_arriving() until the
  // next forward asks for its first range: every range is cast again then). A source that
  // shares the copy itself (ParallelHooks::shares_compute_copy) writes into it.
  Tensor params_lowp() const { return params_lowp_; }
  // The parameters forward and backward read as they are, in the parameter dtype (the token
  // embedding and the norm gains), in layout order; every other one (the matrices) is read
  // through the compute-dtype view: under bf16, the bf16 copy.
  std::vector<FlatRange> full_precision_ranges() const;
  Tensor param(const std::string& name) const { return view(params_, name); }
  Tensor grad(const std::string& name) const;  // under PerRange: of the range backward reports next

  // Initialisation: truncated normal std sqrt(2/(in+out)) at +-3 sigma for linear
  // weights, std 1 at +-3 for the embedding, 1 for norm gains. Local storage.
  void init_parameters(uint64_t seed);
  // The same initial values of parameter `index` of the layout, written to `dst` (its shape,
  // the parameter dtype): what holders of sharded parameters initialise them with. A tensor-
  // parallel part holds the values of its place in the whole tensor, drawn whole: the same
  // model at any tensor-parallel size, its vocabulary padding zero.
  static void init_parameter(Ops& ops, Device& device, const ParameterLayout& layout, size_t index, Tensor dst,
                             uint64_t seed);
  // Call after the parameters were changed from outside (checkpoint load, broadcast), when
  // none are still arriving.
  void parameters_changed();
  // The parameters were changed from outside and arrive range by range through `source` (a
  // sharded optimizer's all-gathers, ParallelHooks::finish_parameters): the next forward
  // asks `source` for each range right before it first reads it (parameters_needed), and
  // refreshes the bf16 copy of that range then (unless the source brings the copy itself),
  // so the rest keeps arriving behind the compute. `source` must live until that forward or
  // wait_parameters().
  void parameters_arriving(ParallelHooks& source);
  // Every parameter in place, master weights included, and the bf16 copy fresh, for work
  // enqueued after it (nothing to do unless parameters are arriving). Whatever reads the
  // parameters other than forward calls it first: a checkpoint, the weights on the host, the
  // end of training. Collective while a source that shares the bf16 copy is arriving (its
  // masters_needed), so every rank calls it at the same points.
  void wait_parameters();

  // Host arrays of B*T token ids; targets may be null (forward without loss). The batch's
  // buffers (tokens, targets, the per-token losses) stay allocated until a batch of another
  // shape comes; a new shape also frees activations a forward-only pass kept.
  void set_batch(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);
  // set_batch in parts: the buffers of a batch of this shape, then tokens [first, first + count)
  // of it (tokens and targets alike; every part before the next forward). A caller that draws a
  // batch part by part holds no host copy of it: a batch too large for the device is the
  // allocator's out-of-memory, not a host run out of memory first.
  void reserve_batch(int64_t batch, int64_t seq);
  void set_batch_part(int64_t first, int64_t count, const int32_t* tokens, const int32_t* targets);
  // Takes the activations (what forward keeps for backward, its temporaries, the logits) from
  // the allocator as it reaches them, layer by layer (the caching allocator on a GPU gives back
  // last step's blocks without cudaMalloc, while the kernels already enqueued run), and keeps
  // them for backward, which frees them as it ends: between train steps, as in PyTorch, no
  // activation is live. A forward that no backward follows (a forward-only phase, a loss
  // evaluation) keeps them, and the next forward reuses them: the simplest rule, and a
  // forward-only loop allocates once. Reads each parameter range only after asking for it while
  // parameters arrive.
  void forward();
  // Frees the activations a forward-only pass kept, so that the next forward takes them again,
  // as a PyTorch forward whose outputs went out of scope does (mode memory's forward timeline).
  void release_activations();
  // A replay of a recorded forward ran (GraphedStep, src/model/train_step.h): what forward()
  // notes on the host, since a replay runs none of its host code.
  void forward_replayed() { has_loss_ = has_targets_; }
  // Of the last forward (the per-token losses are the batch's, so this works after backward
  // too); waits for the device.
  double mean_loss();
  // What each kind of tensor is stored as (the precision mode's table): (tensor, dtype) pairs,
  // the dtypes forward and backward allocate their buffers with.
  std::vector<std::pair<std::string, DType>> storage_dtypes() const;
  // Gradients of the last forward's loss: written into grads(), or added to them with
  // `accumulate` (micro-batches). No zeroing pass is needed before it. One backward per
  // forward: it overwrites the logits with their gradient. Allocates its scratch as it begins
  // and frees the scratch and the activations once its last kernel is enqueued (stream-ordered
  // on the compute stream; nothing on another stream reads them).
  void backward(ParallelHooks* listener = nullptr, bool accumulate = false);
  // Backward computes the gradients of `weight` x the mean loss (default 1): 1/k for each of a
  // step's k micro-batches (gradient accumulation), so that their gradients added up are the
  // mean over the whole batch's tokens.
  void set_loss_weight(double weight) { loss_weight_ = weight; }

 private:
  struct Activations;
  Tensor view(const Tensor& flat, const std::string& name) const;
  Tensor weight(const std::string& name) const;  // compute-dtype view for matrix products
  Tensor gain(const std::string& name) const;    // a parameter read as it is (embedding, norm gains)
  // The initial values of the whole tensor of parameter `index` (p), into `dst` of p.whole.
  static void init_whole(Ops& ops, Device& device, const ParamInfo& p, size_t index, Tensor dst, uint64_t seed);
  // Before reading unit `u` in a pass whose next unit is `next` (-1: none): sharded storage
  // asks the hooks where it is; parameters arriving are asked for (need_parameters).
  void need_unit(int u, int next);
  // Before backward writes the gradients of unit `u` (sharded storage: asks `listener` where).
  void open_unit_gradients(int u, ParallelHooks* listener);
  // Sharded storage: parameter `p` in its unit's lane as `views` hold it, as `shape`.
  Tensor unit_view(const std::vector<UnitView>& views, const ParamInfo& p, Shape shape) const;
  // Views of `rows` rows starting at parameter `first`: fused q/k/v (3d rows) or w1/w3.
  Tensor weight_rows(const std::string& first, int64_t rows) const;
  Tensor grad_rows(const std::string& first, int64_t rows) const;
  // The compute-dtype view of `shape` at flat offset `offset`: the bf16 copy, a cast window
  // (LowMemory), or the parameters themselves (fp32/fp64).
  Tensor compute_view(int64_t offset, Shape shape) const;
  // A buffer holding flat elements [begin, end): bf16 casts of parameters (LowMemory under
  // bf16), or the gradients of one range (GradientStorage::PerRange).
  struct Window {
    Buffer buffer;
    int64_t begin = 0, end = 0;
    void forget() { begin = end = 0; }               // the parameters changed since the cast
    Tensor view(int64_t offset, Shape shape) const;  // fatal unless inside [begin, end)
  };
  void cast_into(Window& window, std::pair<int64_t, int64_t> range);
  Tensor grad_view(int64_t offset, Shape shape) const;
  // Under PerRange, backward writes the gradients of [begin, end) next.
  void open_gradients(int64_t begin, int64_t end);
  // While parameters arrive: asks for [begin, end) and refreshes its bf16 copy.
  void need_parameters(int64_t begin, int64_t end);
  bool casts_per_layer() const {
    return memory_ == MemoryPlan::LowMemory && precision_ == Precision::BF16 && storage_ == ParameterStorage::Local;
  }
  void take_lowp();  // allocates the bf16 copy, its padding zero (the rest: the next converts)
  // Under bf16 without --low-memory, the copy is let go while parameters arrive.
  bool lowp_released() const {
    return storage_ == ParameterStorage::Local && precision_ == Precision::BF16 && !casts_per_layer() &&
           params_lowp_.empty();
  }
  // Forward takes the activations of batch_ x seq_ as it reaches them, unless a forward-only
  // pass kept them: the set with the temporaries the layers share, layer l's saved tensors, the
  // final norm's and the logits.
  Activations& take_activations();
  // Tensor parallelism inside a layer. Rows of the residual stream this rank holds (all the
  // batch's tokens, or its share under sequence parallelism).
  int64_t stream_rows() const { return tp_.sequence_parallel ? batch_ * seq_ / tp_.size : batch_ * seq_; }
  // Rows [first, first + count) of a (tokens, ...) tensor of the micro-batch's tokens.
  Tensor token_rows(Tensor t, int64_t first, int64_t count) const;
  // The whole (tokens, C) input of a column-parallel product from this rank's `rows`: gathered
  // from every rank under sequence parallelism (into the activations' shared buffer), else
  // `rows` itself.
  Tensor gathered(Tensor rows);
  // Runs product(x, first, count) over every token's row of the gathered input, x holding the
  // rows [first, first + count) of it: once over the whole, or, where forward's products are
  // split (overlap_chunks), first over this rank's own rows while the others' are gathered.
  // Leaves the whole in the shared buffer, as gathered() does.
  void over_gathered(Tensor rows, const std::function<void(Tensor x, int64_t first, int64_t count)>& product);
  // y = gathered(rows) W^T, over_gathered.
  void column_parallel_forward(Tensor y, Tensor rows, Tensor w);
  // y = x W^T of a row-parallel product, reduced over the group: reduced(y), or with the
  // product split (overlap_chunks) each chunk's reduction begun before the next chunk's product.
  Tensor row_parallel_forward(Tensor y, Tensor x, Tensor w);
  // The partial sums every rank's row-parallel product (or column-parallel input gradient)
  // wrote to `partial` (tokens, C) added up: in place, or under sequence parallelism this
  // rank's rows of the sum (a view of `partial`). Begun, so that work issued before finish()
  // runs beside it; reduced() finishes it at once.
  struct Reduction {
    std::unique_ptr<TensorParallelGroup::Pending> pending;
    Tensor sum;
    Tensor finish() {
      if (pending) pending->finish();
      return sum;
    }
  };
  Reduction begin_reduce(Tensor partial);
  Tensor reduced(Tensor partial) { return begin_reduce(partial).finish(); }
  // Backward of a column-parallel product y = gathered(rows) W^T: the input gradient (under
  // sequence parallelism while the input's rows are gathered again), its reduction over the
  // group begun, the weight gradient computed under it; returns the reduced input gradient.
  Tensor column_parallel_backward(Tensor dx, Tensor dw, Tensor dy, Tensor rows, Tensor w, bool accumulate);
  // Backward of a row-parallel product y = x W^T, dy this rank's rows of its output gradient:
  // dx and dw (either may be empty) from the whole gradient, gathered under sequence
  // parallelism (over_gathered), which it returns.
  Tensor row_parallel_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate);
  // Under sequence parallelism the gradients of the norm gains `names` are partial sums over
  // each rank's tokens: added up over the group (each rank's backward wrote its own tokens'
  // share only, rank 0's on top of what earlier micro-batches added up: norm_accumulate).
  void sum_norm_gradients(std::initializer_list<std::string> names);
  bool norm_accumulate(bool accumulate) const { return accumulate && !(tp_.sequence_parallel && tp_.rank != 0); }
  void take_layer_activations(int64_t l);
  void take_head_activations();

  ModelConfig config_;
  TensorParallel tp_;
  ParameterLayout layout_;
  Precision precision_;
  DType grad_dtype_;  // of grads_ and grad_window_
  AttentionKind attention_;
  Device& device_;
  Ops& ops_;
  MemoryPlan memory_;
  Buffer params_, grads_, params_lowp_;
  Window layer_window_, head_window_;  // LowMemory under bf16: one layer, the LM head
  Window grad_window_;                 // GradientStorage::PerRange: allocated by the first backward,
  int64_t grad_window_elements_ = 0;   // so a model that only runs forward never holds it
  Buffer tokens_, targets_, losses_;   // the batch: live from set_batch to the next shape
  double loss_weight_ = 1.0;           // set_loss_weight
  ParameterStorage storage_;
  ParallelHooks* hooks_ = nullptr;  // set_parallel_hooks
  // Sharded storage: where each unit's parameters and gradients are, as the hooks last said
  // in this pass (empty: not asked for in it).
  std::vector<UnitView> unit_params_, unit_grads_;
  ParallelHooks* arriving_ = nullptr;  // where parameters still arrive from (parameters_arriving)
  // A source that shared the bf16 copy (shares_compute_copy): the masters of ranges other
  // ranks own stay stale until wait_parameters() has it bring them.
  ParallelHooks* masters_from_ = nullptr;
  bool has_targets_ = false;
  bool has_loss_ = false;      // losses_ holds the last forward's, of this batch's targets
  bool logits_fresh_ = false;  // a forward ran since the last backward
  int64_t batch_ = 0, seq_ = 0;
  std::unique_ptr<Activations> act_;  // from forward to the end of backward
};

}  // namespace llmhpc

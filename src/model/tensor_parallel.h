// Tensor parallelism as the model runs it (Megatron-LM's layout, arXiv:1909.08053 and
// arXiv:2205.05198): each rank of a group holds part of every block (ParameterLayout's Split)
// and the collectives inside a layer go through a TensorParallelGroup, which src/dist builds
// on a Communicator. The model never includes comm or dist.
//
// In every block, q/k/v and w1/w3 are split by output rows (each rank computes its heads and its
// d_ff / tp features from the whole input) and the attention output and w2 by input columns
// (each rank's product is a partial sum of the whole output): one all-reduce after each of
// those two products in forward, and one of the input gradient of each column-parallel product
// in backward. The embedding and the LM head are split by vocabulary (padded_vocab): each
// rank looks up the tokens in its rows (an all-reduce adds the rows up), and the loss is
// computed from every rank's logits without gathering them (Ops::cross_entropy_stats, an
// all-gather of three numbers per token, Ops::cross_entropy_combine).
//
// Sequence parallelism splits the rest of a block, the norms and the residual stream, among
// the ranks by tokens (each rank rows [r N/tp, (r+1) N/tp) of the N = batch x sequence tokens):
// an all-gather of the norm's output before each column-parallel product and a
// reduce-scatter after each row-parallel one instead of the all-reduce: the same bytes in
// forward (backward gathers each column-parallel input again for its weight gradient), and
// the residual stream, the norms' outputs and their statistics at 1/tp of the memory. The norm
// gains' gradients are then partial sums, added up over the group as backward finishes them.
//
// Overlap. Backward always hides what it can without splitting a product: each column-parallel
// input gradient's reduction runs under the weight gradient, and under sequence parallelism the
// gather of that product's input under the input gradient. Forward's collectives have nothing
// to hide under unless a product is split (torchtitan's async tensor parallelism, Megatron-LM's
// --tp-comm-overlap): with `overlap_chunks` K >= 2 each row-parallel product runs in K chunks of
// tokens, each chunk's reduction begun before the next chunk's product, and under sequence
// parallelism each all-gather runs under the product of this rank's own tokens (in forward, and
// for backward's gathered gradients).
#pragma once
#include <memory>

#include "src/core/tensor.h"

namespace llmhpc {

// The collectives among the ranks of one tensor-parallel group, ordered after the model's
// work already issued and before the work it issues next (on a device: on its compute order,
// the host never blocking), in the tensors' dtype.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;

  // A collective begun: the work issued before finish() runs beside it (on a device, the
  // collective on a stream of its own), and the work issued after finish() sees its result.
  // Backward begins each input gradient's reduction and computes the weight gradient under it,
  // as Megatron-LM overlaps them.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void finish() = 0;
  };
  // x = the sum of every rank's x, in place; every rank gets the same bits.
  virtual std::unique_ptr<Pending> begin_all_reduce(Tensor x) = 0;
  // part = this rank's share (the rank-th of size()) of the sum of every rank's `whole`. In
  // place where `part` is whole's own share.
  virtual std::unique_ptr<Pending> begin_reduce_scatter(Tensor part, Tensor whole) = 0;
  // whole = the `part` of every rank, one after another in rank order (size() x part elements).
  virtual std::unique_ptr<Pending> begin_all_gather(Tensor whole, Tensor part) = 0;

  // The same, finished before the work issued next.
  void all_reduce(Tensor x) { begin_all_reduce(x)->finish(); }
  void reduce_scatter(Tensor part, Tensor whole) { begin_reduce_scatter(part, whole)->finish(); }
  void all_gather(Tensor whole, Tensor part) { begin_all_gather(whole, part)->finish(); }
};

// The model's tensor parallelism (TransformerLM::Config): `size` ranks in the group, this
// one `rank`, their collectives through `group` (required when size > 1), forward's products
// split in `overlap_chunks` chunks of tokens to hide the collectives (1: not split; above).
struct TensorParallel {
  int size = 1, rank = 0;
  bool sequence_parallel = false;
  int overlap_chunks = 1;
  TensorParallelGroup* group = nullptr;
  bool active() const { return size > 1; }
};

}  // namespace llmhpc

// The head a CTA works on and where that head's data starts: the per-(batch, head) set-up of
// every kernel of this folder, written once (FlashAttention keeps its equivalent in BlockInfo).
// The grids enumerate the heads as bh = b * heads + h; element (b, t, h, d) of a tensor is at
// ptr + b * batch + t * row + h * head + d (flash_attn.h), and row t of head (b, h) of the
// (B, H, T) fp32 arrays L and delta at (b * heads + h) * T + t.
// Offsets, not pointers, as in BlockInfo: the kernels add them to their typed base pointers.
// An output pointer formed inside this inlined helper compiled differently (the forward's was
// placed after its loop: at head dim 128 with two m tiles, 15 more instructions and other
// spills); with offsets the kernels compile to the instructions, registers and spills they had.
#pragma once
#include <cstdint>

#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/utils.cuh"

namespace llmhpc::flash {

struct HeadOffsets {
  int b, h;

  // Elements from a tensor's start to its element (b, t, h, 0).
  __device__ __forceinline__ int64_t offset(const Strides& s, int t = 0) const {
    return b * s.batch + t * s.row + h * s.head;
  }
  // Elements from the start of a (B, H, T) array (L, delta) to this head's row 0.
  __device__ __forceinline__ int64_t stats_offset(int heads, int T) const { return (int64_t(b) * heads + h) * T; }
};

// The tensor-core backward's inputs of one head: Q, K, V and dO at its element (b, 0, h, 0),
// L and delta at its row 0. (The CUDA-core kernels form some of these where they load them:
// formed here, ahead, they compiled to other registers and spills.)
template <class E>
struct HeadInputs {
  const E *q, *k, *v, *dout;
  const float *lse, *delta;
};
template <class E>
__device__ __forceinline__ HeadInputs<E> head_inputs(const FlashParams& p, const HeadOffsets& head) {
  return {static_cast<const E*>(p.q) + head.offset(p.q_strides),
          static_cast<const E*>(p.k) + head.offset(p.k_strides),
          static_cast<const E*>(p.v) + head.offset(p.v_strides),
          static_cast<const E*>(p.dout) + head.offset(p.dout_strides),
          p.lse + head.stats_offset(p.heads, p.seq),
          p.delta + head.stats_offset(p.heads, p.seq)};
}

// The head of grid index bh = b * heads + h.
__device__ __forceinline__ HeadOffsets head_offsets(int bh, int heads) { return {bh / heads, bh % heads}; }

}  // namespace llmhpc::flash

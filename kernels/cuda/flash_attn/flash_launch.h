// The launchers behind flash_attn.h's API (private to kernels/cuda/flash_attn/), and the
// choices flash_variant() (flash_api.cu) is made of. Each launcher runs the variant it is
// given (its compiled head dim, rows, dQ sum), sizes the grid and enqueues on `stream`; the
// API has checked p before. Split over several .cu files so they compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/flash_attn/flash_attn.h"

namespace llmhpc::flash {

// Tensor cores, bf16 (flash_fwd_mma.cu, flash_bwd_mma.cu). The backward expects delta.
void launch_fwd_tensor_core(const FlashParams& p, const FlashVariant::Kernels& fwd, cudaStream_t stream);
void launch_bwd_tensor_core(const FlashParams& p, const FlashVariant& v, cudaStream_t stream);

// Query rows per CTA of the tensor-core forward for p: 64, or 128 on long sequences with
// enough CTAs (flash_fwd_mma.cu; p.settings.fwd_rows forces one).
int fwd_tensor_core_rows(const FlashParams& p);
// Rows per CTA of the tensor-core backward for p and its plan: the fused kernel's 128, or
// 64, or 128 at head dim 64 on long sequences with enough CTAs (flash_bwd_mma.cu;
// p.settings.bwd_rows forces one).
int bwd_tensor_core_rows(const FlashParams& p);
// Rows per streamed tile of the tensor-core backward for p and its plan: the fused kernel's
// query tile (kernel_traits.h's with_fused_traits), or the split kernels' tile.
int bwd_tensor_core_streamed(const FlashParams& p);

// The tensor-core backward's plan (flash_bwd_mma.cu), made from p's sizes and settings, which
// set_packed_backward writes into p with the scratch:
// - fused (FlashParams::dq_atomic): five products, dQ added by the dK/dV kernel with atomics
//   into dq_accum (not bitwise deterministic); on long sequences whose grid of 128-key tiles
//   fills the GPU (FlashBwd::Auto, the default: fused_backward in flash_bwd_mma.cu), at every
//   head dim but 16 with Fused, never with Split. Else split (seven products, bitwise
//   deterministic), and:
// - chunks (FlashParams::kv_chunk, q_chunk): on a grid that cannot fill the GPU, the longest
//   stationary tiles (under causal, the first key tiles and the last query tiles each stream
//   the whole sequence) would run alone at the end; cut into chunks of about the grid's total
//   work per resident CTA, they spread over the SMs. settings.bwd_chunk (auto by default, off,
//   or N streamed tiles per chunk) decides.
struct BwdPlan {
  bool dq_atomic = false;
  int64_t dq_accum_floats = 0;                      // fused: the dQ accumulator (scratch)
  int kv_chunk = 0, q_chunk = 0;                    // streamed tiles per chunk; 0: not chunked
  int64_t kv_accum_floats = 0, q_accum_floats = 0;  // the chunks' accumulators (scratch)
  int64_t kv_turns = 0, q_turns = 0;                // the chunks' turn counters (scratch)
};
BwdPlan plan_bwd_tensor_core(const FlashParams& p);

// CUDA cores, fp32 or bf16 storage (flash_simt.cu). The backward expects delta.
void launch_fwd_simt(const FlashParams& p, const FlashVariant::Kernels& fwd, cudaStream_t stream);
void launch_bwd_simt(const FlashParams& p, const FlashVariant& v, cudaStream_t stream);

// delta = rowsum(dout * o) (flash_api.cu).
void launch_bwd_delta(const FlashParams& p, cudaStream_t stream);

// Multiprocessors of the current device (flash_api.cu).
int sm_count();

// The smallest compiled head dim that holds `head_dim` (0 if none).
int padded_head_dim(int head_dim, bool tensor_cores);

}  // namespace llmhpc::flash

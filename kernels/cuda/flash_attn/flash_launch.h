// The launchers behind flash_attn.h's API (private to kernels/cuda/flash_attn/). Each
// chooses the compiled head dim for p.head_dim, sizes the grid and enqueues on `stream`;
// the API has checked p before. Split over several .cu files so they compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include <initializer_list>

#include "kernels/cuda/flash_attn/flash_attn.h"

namespace llmhpc::flash {

// Tensor cores, bf16 (flash_fwd_mma.cu, flash_bwd_mma.cu). The backward expects delta.
void launch_fwd_tensor_core(const FlashParams& p, cudaStream_t stream);
void launch_bwd_tensor_core(const FlashParams& p, cudaStream_t stream);

// The tensor-core backward's plan (flash_bwd_mma.cu), made from p's sizes and the variables:
// - fused (FlashParams::dq_atomic): five products, dQ added by the dK/dV kernel with atomics
//   into dq_accum (not bitwise deterministic); at head dim 128 where the grid of 128-key tiles
//   fills the GPU (LLMHPC_FLASH_BWD=auto, the default), at head dims 64 and 128 with =fused,
//   never with =split. Else split (seven products, bitwise deterministic), and:
// - chunks (FlashParams::kv_chunk, q_chunk): on a grid that cannot fill the GPU, the longest
//   stationary tiles (under causal, the first key tiles and the last query tiles each stream
//   the whole sequence) would run alone at the end; cut into chunks of about the grid's total
//   work per resident CTA, they spread over the SMs. LLMHPC_FLASH_BWD_CHUNK=auto (default),
//   off, or N (streamed tiles per chunk) decides.
// Head dim 64 may take two m tiles per warp (BwdKvTraits, BwdQTraits): flash_bwd_mma.cu
// decides (LLMHPC_FLASH_BWD_ROWS=64|128 forces one). The variables are read at every call.
struct BwdPlan {
  bool dq_atomic = false;
  int64_t dq_accum_floats = 0;                       // fused: the dQ accumulator (scratch)
  int kv_chunk = 0, q_chunk = 0;                     // streamed tiles per chunk; 0: not chunked
  int64_t kv_accum_floats = 0, q_accum_floats = 0;  // the chunks' accumulators (scratch)
  int64_t kv_turns = 0, q_turns = 0;                // the chunks' turn counters (scratch)
};
BwdPlan plan_bwd_tensor_core(const FlashParams& p);

// LLMHPC_FLASH_BWD (flash_api.cu): auto (unset), fused or split; anything else is a UsageError.
enum class BwdVariant { Auto, Fused, Split };
BwdVariant bwd_variant();

// CUDA cores, fp32 or bf16 storage (flash_simt.cu). The backward expects delta.
void launch_fwd_simt(const FlashParams& p, cudaStream_t stream);
void launch_bwd_simt(const FlashParams& p, cudaStream_t stream);

// delta = rowsum(dout * o) (flash_api.cu).
void launch_bwd_delta(const FlashParams& p, cudaStream_t stream);

// Multiprocessors of the current device (flash_api.cu).
int sm_count();

// Which of `choices` an environment variable holds: -1 when unset, else its index; any other
// value is a UsageError that names the choices (flash_api.cu).
int env_choice(const char* variable, std::initializer_list<const char*> choices);

// The rows per CTA an environment variable forces (LLMHPC_FLASH_FWD_ROWS, _BWD_ROWS): 64 or
// 128, 0 when unset; anything else is a UsageError (flash_api.cu).
int forced_rows(const char* variable);

// The smallest compiled head dim that holds `head_dim` (0 if none).
int padded_head_dim(int head_dim, bool tensor_cores);

}  // namespace llmhpc::flash

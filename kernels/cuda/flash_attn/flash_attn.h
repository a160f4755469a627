// FlashAttention-2 on CUDA: the small host API that CudaOps (and the tests) call.
//
// Forward: tiles of queries against tiles of keys with an online softmax in fp32
// registers; writes the output O and the logsumexp L (B,H,T) fp32 of every query row.
// Backward: D = rowsum(dO * O), then P is recomputed from L tile by tile, so nothing of size
// T x T is ever stored. Split: dK, dV come from a key-stationary kernel and dQ from a
// query-stationary one, no atomics: bitwise the same on every run, at the price of computing
// Q K^T and dO V^T twice (7 instead of 5 matrix products). Fused (5 products): the dK/dV
// kernel also sums dQ into an fp32 accumulator; on CUDA cores in a fixed order (deterministic,
// the default there), on tensor cores with atomics (fp32 additions in any order: dQ may
// differ in its last bits from run to run; the default on long sequences whose grid fills the
// GPU). LLMHPC_FLASH_BWD=auto|fused|split (kernels/cuda/flash_attn/README.md); split makes
// every backward bitwise deterministic. flash_variant() says which variant runs.
//
// Storage dtypes: fp32 (CUDA-core kernels, fp32 arithmetic) or bf16 (tensor cores,
// mma.sync m16n8k16 with fp32 accumulation; bf16 is a storage format, P is rounded to bf16
// for the P V and dS Q products as FlashAttention-2 does). Head dims 1..128 (tensor cores:
// multiples of 8; the kernels are compiled for 16, 32, 64, 80, 96 and 128 and a smaller head
// dim runs zero-padded in the next one up), any sequence length, causal or not. Query or
// key tiles that the causal mask hides completely are never visited.
//
// Layout: element (b, t, h, d) of a tensor is at ptr + b*batch + t*row + h*head + d
// (strides in elements). packed_params() fills them for the layouts of kernels/ops.h:
// qkv (B,T,3,H,D), out and dout (B,T,H*D), dqkv like qkv.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "src/core/dtype.h"

namespace llmhpc::flash {

struct Strides {
  int64_t batch = 0, row = 0, head = 0;  // elements between consecutive b, t, h
};

// Which kernels run. Auto: tensor cores for bf16 (CUDA cores when a tensor-core
// precondition fails: head dim not a multiple of 8, or a pointer/stride not 16-byte
// aligned), CUDA cores for fp32. TensorCore: tensor cores, or a UsageError where they cannot
// run p. Simt: the CUDA-core kernels (LLMHPC_FLASH_IMPL=simt: a fallback, should the
// tensor-core path misbehave).
enum class FlashImpl { Auto, TensorCore, Simt };
// The backward's dQ. Auto: flash_variant() decides; Fused: five products, the dK/dV kernel
// sums dQ (tensor cores at head dims 32, 64, 96 and 128 only); Split: seven, bitwise deterministic.
enum class FlashBwd { Auto, Fused, Split };

// The variants the LLMHPC_FLASH_* environment variables force (README.md), read once per
// process (flash_settings()). FlashParams carries them, so that a caller (the tests) forces
// a variant for one call by setting its params' copy.
struct FlashSettings {
  FlashImpl impl = FlashImpl::Auto;  // LLMHPC_FLASH_IMPL=auto|simt
  FlashBwd bwd = FlashBwd::Auto;     // LLMHPC_FLASH_BWD=auto|fused|split
  int fwd_rows = 0;                  // LLMHPC_FLASH_FWD_ROWS=64|128: query rows per CTA, tensor-core forward; 0: chosen
  int bwd_rows = 0;    // LLMHPC_FLASH_BWD_ROWS=64|128: rows per CTA, split tensor-core backward at head dim 64
  int bwd_chunk = -1;  // LLMHPC_FLASH_BWD_CHUNK=auto|off|N: streamed tiles per chunk; -1 auto, 0 off
};
// The settings that the variables hold as `lookup` returns their values (null: unset), e.g.
// std::getenv. A value that is not one of a variable's is a UsageError that names the
// variable and the values it takes.
FlashSettings parse_flash_settings(const std::function<const char*(const char*)>& lookup);
// The process's settings: its environment, parsed at the first call.
const FlashSettings& flash_settings();

struct FlashParams {
  DType dtype = DType::BF16;  // storage of q, k, v, o, dout, dq, dk, dv: F32 or BF16
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 0.f;  // softmax scale, 1/sqrt(head_dim) for the model
  bool causal = false;

  // Forward inputs and outputs.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  Strides q_strides, k_strides, v_strides;
  void* o = nullptr;  // written by forward, read by backward
  Strides o_strides;
  float* lse = nullptr;  // (B,H,T) fp32, contiguous: written by forward, read by backward

  // Backward only.
  const void* dout = nullptr;
  Strides dout_strides;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dq_strides, dk_strides, dv_strides;
  float* delta = nullptr;  // scratch (B,H,T) fp32: flash_backward_scratch_bytes()
  // Scratch of the fused dQ, null where there is none (LLMHPC_FLASH_BWD=split): CUDA cores: an
  // fp32 accumulator (B*H, dq_accum_rows, padded head dim) and per query tile counters
  // (B*H, dq_counter_stride); tensor cores (dq_atomic): an fp32 accumulator of dq_atomic_floats,
  // (B*H, query tiles) tiles of query tile x fused head dim in fragment order
  // (flash_bwd_kernel.cuh's dq_share), zeroed by the delta kernel.
  bool dq_atomic = false;
  int64_t dq_atomic_floats = 0;
  float* dq_accum = nullptr;
  int* dq_counters = nullptr;
  int dq_accum_rows = 0, dq_counter_stride = 0;
  // Scratch of the chunked tensor-core backward (grids too small to fill the GPU, flash_api.cu):
  // a stationary tile's streamed tiles are cut into chunks of kv_chunk (dK/dV kernel) or
  // q_chunk (dQ kernel) tiles, one CTA each, whose fp32 sums meet in kv_accum / q_accum (one
  // tile of accumulators per stationary tile) in chunk order, through one turn counter per
  // stationary tile: kv_turns, then q_turns (turn_count in all, zeroed by the delta kernel).
  // 0 / null: not chunked.
  int kv_chunk = 0, q_chunk = 0;
  float* kv_accum = nullptr;
  float* q_accum = nullptr;
  int* kv_turns = nullptr;
  int* q_turns = nullptr;
  int64_t turn_count = 0;

  // The variants to run (packed_params: flash_settings()). The backward's plan follows them:
  // set them before flash_backward_scratch_bytes and set_packed_backward. (Last, so that the
  // kernels find every other member where it was.)
  FlashSettings settings;
};

// Params for ops.h's packed layouts: qkv (B,T,3,H,D), out (B,T,H,D), lse (B,H,T); scale
// 1/sqrt(D); the process's settings.
FlashParams packed_params(DType dtype, const void* qkv, void* out, float* lse, int64_t batch, int64_t seq,
                          int64_t heads, int64_t head_dim, bool causal);
// Adds the backward's tensors: dout (B,T,H,D), dqkv (B,T,3,H,D), and the scratch
// (flash_backward_scratch_bytes(p) bytes, 16-byte aligned): delta and the fused dQ's.
void set_packed_backward(FlashParams& p, const void* dout, void* dqkv, void* scratch);

// Bytes of the backward's scratch for p's sizes: delta ((B,H,T) fp32), plus, where the
// CUDA-core kernels may run and the fused dQ is on, its accumulator and counters.
size_t flash_backward_scratch_bytes(const FlashParams& p);

// How the backward sums dQ. None: split, a dQ kernel recomputes Q K^T and dO V^T (seven
// products, bitwise deterministic). Fused (five products): the dK/dV kernel adds dS K into an
// fp32 accumulator, Atomic (tensor cores: red.global.add in any order, so dQ's last bits vary
// from run to run) or Ordered (CUDA cores: in a fixed order, deterministic).
enum class DqSum { None, Ordered, Atomic };

// What flash_attention_forward and _backward run for p: its sizes, dtype, alignment and
// settings, and for the backward the plan that set_packed_backward wrote into p (fused or
// split, chunks, scratch). The launchers run what it says; results record it
// (CudaOps::attention_variant). Requests the kernels do not support are UsageErrors, as in
// flash_attention_forward.
struct FlashVariant {
  struct Kernels {
    FlashImpl impl = FlashImpl::Simt;  // TensorCore or Simt
    int head_dim = 0;                  // compiled head dim: p.head_dim or the next one up (zero-padded)
    int rows = 0;  // stationary rows per CTA: queries (forward); keys of the dK/dV kernel and queries of the dQ kernel
    int streamed = 0;  // rows per streamed tile: keys (forward); queries of the dK/dV kernel and keys of the dQ kernel
  };
  Kernels fwd, bwd;
  DqSum dq_sum = DqSum::None;
  int kv_chunk = 0, q_chunk = 0;  // split tensor-core backward: streamed tiles per chunk (dK/dV, dQ); 0: whole
};
FlashVariant flash_variant(const FlashParams& p);

// Enqueue on `stream`. Throw UsageError for what the kernels do not support (dtype, head
// dim > 128, sizes over the grid limits); a CUDA error is fatal (LLMHPC_CHECK_CALL).
void flash_attention_forward(const FlashParams& p, cudaStream_t stream);
void flash_attention_backward(const FlashParams& p, cudaStream_t stream);

// "auto", "tensor-core" or "simt".
const char* flash_impl_name(FlashImpl impl);

}  // namespace llmhpc::flash

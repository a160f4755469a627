// The host API of flash_attn.h: the settings, parameter checks, the variant (tensor-core or
// CUDA-core kernels and their choices), and the backward's preprocessing (delta) launch.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_launch.cuh"
#include "kernels/cuda/flash_attn/flash_launch.h"

namespace llmhpc::flash {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool aligned16(const Strides& s, size_t element) {
  return (s.batch * element) % 16 == 0 && (s.row * element) % 16 == 0 && (s.head * element) % 16 == 0;
}

// Which of `choices` the variable holds: -1 when unset, else its index; any other value is a
// UsageError that names the choices.
using Lookup = std::function<const char*(const char*)>;
int choice(const Lookup& lookup, const char* variable, std::initializer_list<const char*> choices) {
  const char* e = lookup(variable);
  if (!e) return -1;
  int i = 0;
  std::string expected;
  for (const char* c : choices) {
    if (std::strcmp(e, c) == 0) return i;
    expected += (i == 0 ? "" : i + 1 == int(choices.size()) ? " or " : ", ") + std::string(c);
    ++i;
  }
  throw UsageError(std::string(variable) + "=" + e + ": expected " + expected);
}

// Rows per CTA (LLMHPC_FLASH_FWD_ROWS, _BWD_ROWS): 64 or 128; 0 when unset.
int rows_setting(const Lookup& lookup, const char* variable) {
  switch (choice(lookup, variable, {"64", "128"})) {
    case 0: return 64;
    case 1: return 128;
  }
  return 0;
}

// LLMHPC_FLASH_BWD_CHUNK: -1 auto (or unset), 0 off, N > 0 tiles per chunk.
int chunk_setting(const Lookup& lookup) {
  const char* e = lookup("LLMHPC_FLASH_BWD_CHUNK");
  if (!e || std::strcmp(e, "auto") == 0) return -1;
  if (std::strcmp(e, "off") == 0) return 0;
  char* end = nullptr;
  const long n = std::strtol(e, &end, 10);
  if (*end != '\0' || n < 1 || n > (1 << 20))
    throw UsageError(std::string("LLMHPC_FLASH_BWD_CHUNK=") + e + ": expected auto, off or a number of tiles");
  return int(n);
}

// Whether the tensor-core kernels can run p: bf16, a compiled head dim of whole 16-byte chunks,
// and 16-byte aligned rows for cp.async (pointers and every stride).
bool tensor_cores_possible(const FlashParams& p, bool backward) {
  if (p.dtype != DType::BF16 || p.head_dim % 8 != 0 || p.head_dim > kMaxHeadDim) return false;
  bool ok = aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) && aligned16(p.q_strides, 2) &&
            aligned16(p.k_strides, 2) && aligned16(p.v_strides, 2) && aligned16(p.o_strides, 2);
  if (backward)
    ok = ok && aligned16(p.dout) && aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv) &&
         aligned16(p.dout_strides, 2) && aligned16(p.dq_strides, 2) && aligned16(p.dk_strides, 2) &&
         aligned16(p.dv_strides, 2);
  return ok;
}

bool use_tensor_cores(const FlashParams& p, bool backward) {
  if (p.settings.impl == FlashImpl::Simt) return false;
  const bool possible = tensor_cores_possible(p, backward);
  if (p.settings.impl == FlashImpl::TensorCore && !possible)
    throw UsageError("flash attention: the tensor-core kernels need bf16, a head dim that is a multiple of 8 and "
                     "16-byte aligned rows");
  return possible;
}

void check(const FlashParams& p, bool backward) {
  const char* op = backward ? "flash_attention_backward" : "flash_attention_forward";
  auto fail = [&](const std::string& what) { throw UsageError(std::string(op) + ": " + what); };
  if (p.dtype != DType::F32 && p.dtype != DType::BF16)
    fail(std::string("the CUDA kernels store fp32 or bf16, not ") + dtype_name(p.dtype));
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim)
    fail("head dim " + std::to_string(p.head_dim) + " is not supported (1 to " + std::to_string(kMaxHeadDim) + ")");
  if (p.batch < 0 || p.seq < 0 || p.heads < 1) fail("negative sizes");
  // Grids are (B*H, 64-row tiles), the dQ conversion's (blocks, B*H): both within y's 65535.
  if (int64_t(p.batch) * p.heads > 65535)
    fail("batch x heads = " + std::to_string(int64_t(p.batch) * p.heads) + " exceeds 65535 (a grid's y limit)");
  if ((int64_t(p.seq) + 63) / 64 > 65535)
    fail("seq = " + std::to_string(p.seq) + " exceeds 64 x 65535 (a grid's y limit)");
  if (int64_t(p.seq) * p.heads > (int64_t(1) << 30))
    fail("seq x heads = " + std::to_string(int64_t(p.seq) * p.heads) + " exceeds 2^30 (32-bit row indices)");
  const FlashSettings& s = p.settings;
  for (int rows : {s.fwd_rows, s.bwd_rows})
    if (rows != 0 && rows != 64 && rows != 128)
      fail("settings: " + std::to_string(rows) + " rows per CTA (0: chosen, 64, 128)");
  if (s.bwd_chunk < -1) fail("settings: bwd_chunk " + std::to_string(s.bwd_chunk) + " (-1: auto, 0: off, N tiles)");
  if (!p.q || !p.k || !p.v || !p.o || !p.lse) fail("a forward tensor is missing");
  if (backward && (!p.dout || !p.dq || !p.dk || !p.dv || !p.delta)) fail("a backward tensor or the scratch is missing");
}

}  // namespace

FlashSettings parse_flash_settings(const Lookup& lookup) {
  FlashSettings s;
  if (choice(lookup, "LLMHPC_FLASH_IMPL", {"auto", "simt"}) == 1) s.impl = FlashImpl::Simt;
  switch (choice(lookup, "LLMHPC_FLASH_BWD", {"auto", "fused", "split"})) {
    case 1: s.bwd = FlashBwd::Fused; break;
    case 2: s.bwd = FlashBwd::Split; break;
  }
  s.fwd_rows = rows_setting(lookup, "LLMHPC_FLASH_FWD_ROWS");
  s.bwd_rows = rows_setting(lookup, "LLMHPC_FLASH_BWD_ROWS");
  s.bwd_chunk = chunk_setting(lookup);
  return s;
}

const FlashSettings& flash_settings() {
  static const FlashSettings settings = parse_flash_settings(std::getenv);
  return settings;
}

int sm_count() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

int padded_head_dim(int head_dim, bool tensor_cores) {
  if (tensor_cores) {
    for (int d : kTensorCoreHeadDims)
      if (head_dim <= d) return d;
  } else {
    for (int d : kSimtHeadDims)
      if (head_dim <= d) return d;
  }
  return 0;
}

FlashParams packed_params(DType dtype, const void* qkv, void* out, float* lse, int64_t batch, int64_t seq,
                          int64_t heads, int64_t head_dim, bool causal) {
  FlashParams p;
  p.dtype = dtype;
  p.batch = int(batch);
  p.seq = int(seq);
  p.heads = int(heads);
  p.head_dim = int(head_dim);
  p.scale = float(1.0 / std::sqrt(double(head_dim)));
  p.causal = causal;
  const int64_t hd = heads * head_dim;
  const Strides qkv_strides{seq * 3 * hd, 3 * hd, head_dim}, out_strides{seq * hd, hd, head_dim};
  const size_t element = dtype_size(dtype);
  const char* base = static_cast<const char*>(qkv);
  p.q = base;
  p.k = base + hd * element;
  p.v = base + 2 * hd * element;
  p.q_strides = p.k_strides = p.v_strides = qkv_strides;
  p.o = out;
  p.o_strides = out_strides;
  p.lse = lse;
  p.settings = flash_settings();
  return p;
}

namespace {
// Whether the backward may run on CUDA cores with their fused dQ, the default there (bf16 with
// a head dim that is a multiple of 8 runs on tensor cores unless told otherwise).
bool fused_dq_scratch(const FlashParams& p) {
  return p.settings.bwd != FlashBwd::Split &&
         (p.settings.impl == FlashImpl::Simt || p.dtype != DType::BF16 || p.head_dim % 8 != 0);
}

// Scratch layout: delta, then (fused) the accumulator, rows rounded up to 64 (every CUDA-core
// query tile), then the counters, one per 32 queries (the smallest query tile).
size_t align16(size_t n) { return (n + 15) / 16 * 16; }
size_t delta_bytes(const FlashParams& p) { return align16(size_t(p.batch) * p.heads * p.seq * sizeof(float)); }
int accum_rows(const FlashParams& p) { return (p.seq + 63) / 64 * 64; }
int counter_stride(const FlashParams& p) { return (p.seq + 31) / 32; }
size_t accum_bytes(const FlashParams& p) {
  return size_t(p.batch) * p.heads * accum_rows(p) * padded_head_dim(p.head_dim, false) * sizeof(float);
}

// The tensor-core backward's plan (flash_launch.h), where it will run.
BwdPlan tensor_core_plan(const FlashParams& p) {
  return !fused_dq_scratch(p) && use_tensor_cores(p, true) ? plan_bwd_tensor_core(p) : BwdPlan{};
}
// Its scratch after delta: the fused dQ's or the chunks' accumulators, then the chunks' turn
// counters.
size_t plan_floats(const BwdPlan& c) { return size_t(c.dq_accum_floats + c.kv_accum_floats + c.q_accum_floats); }
size_t plan_bytes(const BwdPlan& c) {
  return align16(plan_floats(c) * sizeof(float)) + align16(size_t(c.kv_turns + c.q_turns) * sizeof(int));
}
}  // namespace

size_t flash_backward_scratch_bytes(const FlashParams& p) {
  if (fused_dq_scratch(p))
    return delta_bytes(p) + accum_bytes(p) + size_t(p.batch) * p.heads * counter_stride(p) * sizeof(int);
  return delta_bytes(p) + plan_bytes(tensor_core_plan(p));
}

void set_packed_backward(FlashParams& p, const void* dout, void* dqkv, void* scratch) {
  const int64_t hd = int64_t(p.heads) * p.head_dim;
  const size_t element = dtype_size(p.dtype);
  p.dout = dout;
  p.dout_strides = p.o_strides;
  char* base = static_cast<char*>(dqkv);
  p.dq = base;
  p.dk = base + hd * element;
  p.dv = base + 2 * hd * element;
  p.dq_strides = p.dk_strides = p.dv_strides = p.q_strides;
  p.delta = static_cast<float*>(scratch);
  char* after_delta = static_cast<char*>(scratch) + delta_bytes(p);
  if (fused_dq_scratch(p)) {
    p.dq_accum = reinterpret_cast<float*>(after_delta);
    p.dq_counters = reinterpret_cast<int*>(after_delta + accum_bytes(p));
    p.dq_accum_rows = accum_rows(p);
    p.dq_counter_stride = counter_stride(p);
    return;
  }
  const BwdPlan c = tensor_core_plan(p);
  float* accum = reinterpret_cast<float*>(after_delta);
  int* turns = reinterpret_cast<int*>(after_delta + align16(plan_floats(c) * sizeof(float)));
  p.dq_atomic = c.dq_atomic;
  p.dq_atomic_floats = c.dq_accum_floats;
  if (c.dq_atomic) p.dq_accum = accum;
  p.kv_chunk = c.kv_chunk, p.q_chunk = c.q_chunk;
  p.kv_accum = c.kv_chunk ? accum : nullptr;
  p.q_accum = c.q_chunk ? accum + c.kv_accum_floats : nullptr;
  p.kv_turns = c.kv_chunk ? turns : nullptr;
  p.q_turns = c.q_chunk ? turns + c.kv_turns : nullptr;
  p.turn_count = c.kv_turns + c.q_turns;
}

namespace {
constexpr int kSimtBlockM = SimtTraits<kSimtHeadDims[0]>::kBlockM;  // the same at every head dim

// The forward's kernels.
FlashVariant::Kernels forward_kernels(const FlashParams& p) {
  if (!use_tensor_cores(p, false)) {
    const int head_dim = padded_head_dim(p.head_dim, false);
    return {FlashImpl::Simt, head_dim, kSimtBlockM, simt_streamed_tile(head_dim)};
  }
  const int head_dim = padded_head_dim(p.head_dim, true);
  return {FlashImpl::TensorCore, head_dim, fwd_tensor_core_rows(p), fwd_key_tile(head_dim)};
}

// The backward's kernels and dQ sum, as p's plan (set_packed_backward) has them; CUDA cores
// fuse where the scratch holds their accumulator (not with FlashBwd::Split).
FlashVariant backward_variant(const FlashParams& p) {
  FlashVariant v;
  if (!use_tensor_cores(p, true)) {
    const int head_dim = padded_head_dim(p.head_dim, false);
    v.bwd = {FlashImpl::Simt, head_dim, kSimtBlockM, simt_streamed_tile(head_dim)};
    const bool fused = p.settings.bwd != FlashBwd::Split && p.dq_accum && p.dq_counters;
    v.dq_sum = fused ? DqSum::Ordered : DqSum::None;
    return v;
  }
  const int head_dim = padded_head_dim(p.head_dim, true);
  v.bwd = {FlashImpl::TensorCore, p.dq_atomic ? fused_head_dim(head_dim) : head_dim, bwd_tensor_core_rows(p),
           bwd_tensor_core_streamed(p)};
  v.dq_sum = p.dq_atomic ? DqSum::Atomic : DqSum::None;
  v.kv_chunk = p.kv_chunk, v.q_chunk = p.q_chunk;
  return v;
}
}  // namespace

FlashVariant flash_variant(const FlashParams& p) {
  check(p, false);  // unsupported requests are UsageErrors, as at the launch
  FlashVariant v = backward_variant(p);
  v.fwd = forward_kernels(p);
  return v;
}

const char* flash_impl_name(FlashImpl impl) {
  switch (impl) {
    case FlashImpl::Auto: return "auto";
    case FlashImpl::TensorCore: return "tensor-core";
    case FlashImpl::Simt: return "simt";
  }
  return "?";
}

void launch_bwd_delta(const FlashParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool f32 = p.dtype == DType::F32;
  const int rows_per_block = kThreads / (f32 ? delta_lanes<float>(p.head_dim) : delta_lanes<bf16>(p.head_dim));
  const dim3 grid(unsigned((p.seq * p.heads + rows_per_block - 1) / rows_per_block), unsigned(p.batch));
  launch_kernel(f32 ? flash_bwd_delta_kernel<float> : flash_bwd_delta_kernel<bf16>, grid, kThreads, 0, stream, p);
}

void flash_attention_forward(const FlashParams& p, cudaStream_t stream) {
  check(p, false);
  if (p.batch == 0 || p.seq == 0) return;
  const FlashVariant::Kernels fwd = forward_kernels(p);
  if (fwd.impl == FlashImpl::TensorCore) launch_fwd_tensor_core(p, fwd, stream);
  else launch_fwd_simt(p, fwd, stream);
}

void flash_attention_backward(const FlashParams& p, cudaStream_t stream) {
  check(p, true);
  if (p.batch == 0 || p.seq == 0) return;
  const FlashVariant v = backward_variant(p);
  launch_bwd_delta(p, stream);
  if (v.bwd.impl == FlashImpl::TensorCore) launch_bwd_tensor_core(p, v, stream);
  else launch_bwd_simt(p, v, stream);
}

}  // namespace llmhpc::flash

// The CUDA FlashAttention-2 kernels (kernels/cuda/flash_attn/) on a GPU: forward (O and L)
// and backward (dQ, dK, dV) against naive attention in fp64 computed on the CPU, causal and
// not, for the tensor-core kernels (bf16) and the CUDA-core kernels (fp32 and bf16), at
// sequence lengths that are and are not multiples of the tiles (64 and 32) and head dims
// that are and are not compiled (80 and 20 run zero-padded).
//
// The rule, as in flash-attention's own tests: the kernel's error versus the fp64 reference
// is at most twice the error of naive attention computed in the same precision, plus a floor:
// twice the error of storing the fp64 reference itself in that dtype (no result stored in the
// dtype can beat that), and for the gradients twice what rounding the saved L to fp32 does
// (see check()). Errors are max |x - ref| over all elements.
//
// "Naive attention in the same precision" (computed on the CPU from the same inputs):
//  - fp32: the definition with fp32 arithmetic everywhere (fp32 sums over the head dim and
//    over keys, fp32 softmax), which is what naive fp32 attention on a GPU does.
//  - bf16: what the CUDA backend's naive path does (kernels/cuda/cuda_ops.cu): every
//    product runs in fp32 but its result is stored in bf16, so S = bf16(scale Q K^T),
//    P = bf16(softmax(S)) (fp32 softmax), O = bf16(P V); backward dP = bf16(dO V^T),
//    dV = bf16(P^T dO), dS = bf16(P (dP - rowsum(dP P))), dQ = bf16(scale dS K),
//    dK = bf16(scale dS^T Q).
// Why 2x holds for bf16 flash (derivation of the bound): each bf16 rounding moves a value by
// at most u = 2^-8 of itself. Naive rounds S (which moves each probability by up to u |S|,
// several u for |S| of a few units), P (u) and O (u); flash keeps S and the softmax in fp32
// and rounds only the unnormalised P (u, relative to the running max) before P V, and O (u).
// So flash's forward carries a subset of naive's roundings, and its error is at most naive's
// up to how the same-size errors happen to add up: factor 2 covers that. The backward is the
// same story: naive rounds dP, dS and P; flash rounds P and dS as operands of the dV, dK, dQ
// products (fp32 accumulation) and uses D = rowsum(dO O) from the bf16 O, which is within u
// of naive's rowsum(dP P) from bf16 dP and P.
//
// Also: outputs start as NaN (an element a kernel skips fails); the backward is bitwise
// deterministic; L of every row; unsupported requests and bad tiling variables are
// UsageErrors. Skipped without a GPU, but for the check of the tiling variables.
// The CUDA-core variants run the fused dQ (flash_attn.h); LLMHPC_FLASH_BWD=split runs them split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/flash_launch.h"
#include "src/core/cuda/check.h"
#include "tests/unit/attention_test_util.h"

namespace llmhpc::test {
namespace {

using flash::FlashImpl;

struct Shape {
  int64_t B, T, H, D;
};
std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B" << s.B << " T" << s.T << " H" << s.H << " D" << s.D;
}

// A device buffer holding `n` elements of `dtype`, with host-side conversions.
class DeviceBuffer {
 public:
  DeviceBuffer(DType dtype, size_t n) : dtype_(dtype), n_(n) {
    CUDA_CHECK(cudaMalloc(&ptr_, bytes() ? bytes() : 1));
    poison();
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return n_ * dtype_size(dtype_); }
  void poison() { CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes())); }  // NaN in fp32 and bf16
  void write(const std::vector<double>& v) {
    std::vector<unsigned char> raw(bytes());
    from_doubles(v.data(), n_, dtype_, raw.data());
    CUDA_CHECK(cudaMemcpy(ptr_, raw.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<double> read() const {
    std::vector<unsigned char> raw(bytes());
    CUDA_CHECK(cudaMemcpy(raw.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    std::vector<double> v(n_);
    to_doubles(raw.data(), dtype_, n_, v.data());
    return v;
  }

 private:
  DType dtype_;
  size_t n_;
  void* ptr_ = nullptr;
};

using Result = AttentionResult;

// The kernels on the GPU: forward, then backward, on packed qkv (B,T,3,H,D).
Result run_flash(FlashImpl impl, DType dt, const std::vector<double>& qkv_v, const std::vector<double>& dout_v,
                 const Shape& s, bool causal) {
  DeviceBuffer qkv(dt, qkv_v.size()), dout(dt, dout_v.size()), out(dt, dout_v.size()), dqkv(dt, qkv_v.size());
  DeviceBuffer lse(DType::F32, s.B * s.H * s.T);
  qkv.write(qkv_v);
  dout.write(dout_v);
  flash::FlashParams p = flash::packed_params(dt, qkv.get(), out.get(), static_cast<float*>(lse.get()), s.B, s.T,
                                              s.H, s.D, causal);
  // NaN-filled like the outputs: a fused dQ accumulator element that no first turn writes fails.
  DeviceBuffer scratch(DType::F32, flash::flash_backward_scratch_bytes(p) / sizeof(float));
  flash::set_packed_backward(p, dout.get(), dqkv.get(), scratch.get());
  p.impl = impl;
  flash::flash_attention_forward(p, nullptr);
  flash::flash_attention_backward(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {out.read(), lse.read(), dqkv.read()};
}

// ---- references on the CPU --------------------------------------------------------------
Result fp64_reference(const std::vector<double>& qkv, const std::vector<double>& dout, const Shape& s, bool causal) {
  std::vector<double> out(dout.size()), probs(s.B * s.H * s.T * s.T), dqkv(qkv.size()), lse(s.B * s.H * s.T);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, s.H, s.D, causal);
  cpu::attention_backward(dqkv.data(), dout.data(), probs.data(), qkv.data(), s.B, s.T, s.H, s.D, causal);
  const int64_t row = 3 * s.H * s.D;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.T; ++i) {
        double mx = -INFINITY, sum = 0;
        std::vector<double> sc;
        for (int64_t j = 0; j < (causal ? i + 1 : s.T); ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d)
            dot += qkv[(b * s.T + i) * row + h * s.D + d] * qkv[(b * s.T + j) * row + s.H * s.D + h * s.D + d];
          sc.push_back(dot / std::sqrt(double(s.D)));
          mx = std::max(mx, sc.back());
        }
        for (double x : sc) sum += std::exp(x - mx);
        lse[(b * s.H + h) * s.T + i] = mx + std::log(sum);
      }
  return {out, lse, dqkv};
}

// ---- measures -----------------------------------------------------------------------------

double storage_error(const std::vector<double>& ref, DType dt) {
  double m = 0;
  for (double x : ref) {
    const double stored = dt == DType::BF16 ? double(round_to_bf16(float(x))) : double(float(x));
    m = std::max(m, std::fabs(stored - x));
  }
  return m;
}

// ---- fixture ----------------------------------------------------------------------------
struct Variant {
  FlashImpl impl;
  DType dtype;
  const char* name;
};
const Variant kVariants[] = {{FlashImpl::TensorCore, DType::BF16, "tensor-core bf16"},
                             {FlashImpl::Simt, DType::F32, "simt fp32"},
                             {FlashImpl::Simt, DType::BF16, "simt bf16"}};

class FlashAttnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  // Normal(0, 1) values the dtype holds exactly.
  std::vector<double> random(int64_t n, DType dt) {
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> v(n);
    for (double& x : v) {
      const float f = float(normal(rng_));
      x = dt == DType::BF16 ? double(round_to_bf16(f)) : double(f);
    }
    return v;
  }

  // Every check of one variant on one shape.
  void check(const Variant& var, const Shape& s, bool causal) {
    const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, var.dtype),
                              dout = random(s.B * s.T * s.H * s.D, var.dtype);
    const Result ref = fp64_reference(qkv, dout, s, causal);
    const Result naive = naive_low_precision(qkv, dout, s, causal, var.dtype == DType::BF16);
    const Result got = run_flash(var.impl, var.dtype, qkv, dout, s, causal);
    std::ostringstream what;
    what << var.name << " " << s << (causal ? " causal" : " full") << ", random seed " << seed_;
    // Floor: twice the storage error of the reference; for the gradients also twice what
    // rounding the saved L to fp32 does (|dL| <= 2^-24 |L| scales every recomputed
    // probability exp(s - L) by 1 + dL; naive attention saves P instead and has no such term).
    const double l_term = std::ldexp(1.0, -24) * max_abs(ref.lse);
    // And for dq, dk the cancellation in dS = P (dP - D): dP = dO.v and D = rowsum(dO * O) are
    // fp32 sums of D_head terms each at most max|dO| max|v|, so one dS element is off by up
    // to 2^-24 D_head max|dO| max|v| even where the exact dS is 0 (T = 1, where naive
    // attention is exact); dq = scale dS K and dk = scale dS^T Q carry it times max|K|, max|Q|.
    const double cancel = std::ldexp(1.0, -24) * double(s.D) * max_abs(dout) * max_abs(part(qkv, s, 2)) /
                          std::sqrt(double(s.D));
    const double cancel_floor[3] = {2 * cancel * max_abs(part(qkv, s, 1)), 2 * cancel * max_abs(part(qkv, s, 0)), 0};
    auto rule = [&](const std::vector<double>& g, const std::vector<double>& n, const std::vector<double>& r,
                    const char* name, bool gradient, double extra_floor) {
      const double err = max_abs_diff(g, r), naive_err = max_abs_diff(n, r);
      // fp32: both errors are a few units in the last place, and their maxima over the
      // elements fluctuate from draw to draw (seen on an H100: flash 2.27x naive at 6.3e-7,
      // fp32, T=50, D=20), so a few such units at the result's scale are allowed on top.
      const double ulps = var.dtype == DType::F32 ? 8 * std::ldexp(1.0, -24) * max_abs(r) : 0.0;
      const double floor =
          2 * storage_error(r, var.dtype) + (gradient ? 2 * l_term * max_abs(r) : 0.0) + extra_floor + ulps;
      EXPECT_LE(err, 2 * naive_err + floor)
          << what.str() << ": " << name << " error " << err << ", naive same-precision error " << naive_err;
    };
    rule(got.out, naive.out, ref.out, "out", false, 0.0);
    const char* names[] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; ++which)
      rule(part(got.dqkv, s, which), part(naive.dqkv, s, which), part(ref.dqkv, s, which), names[which], true,
           cancel_floor[which]);
    // L is fp32 arithmetic on exact inputs in every variant.
    EXPECT_LE(max_abs_diff(got.lse, ref.lse), 1e-5 * std::max(1.0, max_abs(ref.lse))) << what.str() << ": L";
  }

  unsigned seed_ = 0;
  std::mt19937_64 rng_;
};

// Tiles: 64 rows (tensor cores), 32 (CUDA cores). Compiled head dims: 16, 32, 64, 96, 128
// (tensor cores), 32, 64, 128 (CUDA cores).
const Shape kShapes[] = {
    {2, 1, 2, 64},    // one position
    {1, 17, 3, 16},   // less than a tile
    {2, 64, 2, 32},   // exactly one tensor-core tile, two CUDA-core tiles
    {1, 100, 2, 64},  // neither
    {2, 77, 2, 80},   // head dim padded to 96 / 128 (the 2.7B model's)
    {1, 130, 1, 96},
    {1, 257, 1, 128},
    {1, 45, 2, 40},   // padded to 64
};

TEST_F(FlashAttnGpu, ForwardAndBackwardWithinTwiceNaiveError) {
  for (const Variant& var : kVariants)
    for (const Shape& s : kShapes)
      for (bool causal : {false, true}) check(var, s, causal);
}

// Many tiles, so the causal skipping and the streaming of K/V (forward, dQ) and Q/dO (dK/dV)
// run through several stages.
TEST_F(FlashAttnGpu, LongSequence) {
  for (const Variant& var : kVariants)
    for (bool causal : {true, false}) check(var, {1, 700, 2, 64}, causal);
}

// The CUDA-core variants sum dQ across CTAs (in a fixed order, unless LLMHPC_FLASH_BWD=split):
// the larger shapes give many CTAs in flight per query tile. (The tensor-core backward is split
// at these head dims, bitwise deterministic; its fused variant: FusedBackward.)
TEST_F(FlashAttnGpu, BackwardIsDeterministic) {
  const char* mode = flash::flash_fused_dq() ? " (fused dQ)" : " (split)";
  for (const Variant& var : kVariants)
    for (const Shape& s : {Shape{2, 300, 2, 64}, Shape{4, 1024, 8, 64}, Shape{2, 1000, 4, 80}})
      for (bool causal : {true, false}) {
        const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, var.dtype),
                                  dout = random(s.B * s.T * s.H * s.D, var.dtype);
        const Result a = run_flash(var.impl, var.dtype, qkv, dout, s, causal);
        const Result b = run_flash(var.impl, var.dtype, qkv, dout, s, causal);
        EXPECT_EQ(a.out, b.out) << var.name << mode << " " << s;
        EXPECT_EQ(a.dqkv, b.dqkv) << var.name << mode << " " << s << (causal ? " causal" : " full")
                                  << ": two backward runs differ";
      }
}

// Sets an environment variable for a scope (the kernels' variants read theirs at every call).
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name), had_(std::getenv(name) != nullptr) {
    if (had_) saved_ = std::getenv(name);
  }
  void set(const char* value) { setenv(name_, value, 1); }
  ~ScopedEnv() {
    if (had_) setenv(name_, saved_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_;
  std::string saved_;
};

// The variables that force a tiling take 64 or 128 and nothing else (no GPU needed).
TEST(FlashTilingVariables, AcceptSixtyFourOrOneTwentyEight) {
  for (const char* variable : {"LLMHPC_FLASH_FWD_ROWS", "LLMHPC_FLASH_BWD_ROWS"}) {
    ScopedEnv rows(variable);
    unsetenv(variable);
    EXPECT_EQ(flash::forced_rows(variable), 0);
    rows.set("64");
    EXPECT_EQ(flash::forced_rows(variable), 64);
    rows.set("128");
    EXPECT_EQ(flash::forced_rows(variable), 128);
    for (const char* bad : {"96", "", "128x", "auto"}) {
      rows.set(bad);
      EXPECT_THROW(flash::forced_rows(variable), UsageError) << variable << "=" << bad;
    }
  }
}

// Two m tiles per warp (128 rows per CTA) are taken only on long sequences: the forward's
// queries (flash_fwd_mma.cu) and, at head dim 64, the backward's keys and queries
// (flash_bwd_mma.cu). Forced here on small shapes (chunks off: their sizes follow the rows),
// they must give the bits of one.
TEST_F(FlashAttnGpu, RowTilesAgree) {
  ScopedEnv chunk("LLMHPC_FLASH_BWD_CHUNK");
  chunk.set("off");
  for (const char* variable : {"LLMHPC_FLASH_FWD_ROWS", "LLMHPC_FLASH_BWD_ROWS"}) {
    ScopedEnv rows(variable);
    for (const Shape& s : {Shape{1, 700, 2, 64}, Shape{2, 77, 2, 80}, Shape{1, 257, 1, 128}, Shape{1, 45, 2, 40},
                           Shape{1, 300, 1, 16}, Shape{2, 77, 2, 48}})
      for (bool causal : {true, false}) {
        const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, DType::BF16),
                                  dout = random(s.B * s.T * s.H * s.D, DType::BF16);
        rows.set("64");
        const Result a = run_flash(FlashImpl::TensorCore, DType::BF16, qkv, dout, s, causal);
        rows.set("128");
        const Result b = run_flash(FlashImpl::TensorCore, DType::BF16, qkv, dout, s, causal);
        const std::string what = std::string(variable) + " " + (causal ? "causal" : "full");
        EXPECT_EQ(a.out, b.out) << s << " " << what;
        EXPECT_EQ(a.lse, b.lse) << s << " " << what;
        EXPECT_EQ(a.dqkv, b.dqkv) << s << " " << what;
      }
  }
}

// The tensor-core backward cuts long tiles into chunks on grids too small to fill the GPU
// (flash_bwd_mma.cu); forced here to chunks of 2 and 3 streamed tiles (every tile longer than
// that cut, up to 22 chunks; at head dim 64 also with two m tiles), it must keep the accuracy
// rule and stay bitwise deterministic.
TEST_F(FlashAttnGpu, ChunkedBackward) {
  ScopedEnv chunk("LLMHPC_FLASH_BWD_CHUNK"), rows("LLMHPC_FLASH_BWD_ROWS");
  const Variant& tensor_core = kVariants[0];
  for (const char* tiles : {"2", "3"})
    for (const char* row_tiles : {"64", "128"})
      for (const Shape& s : {Shape{1, 700, 2, 64}, Shape{1, 257, 1, 128}, Shape{2, 77, 2, 80}, Shape{1, 300, 1, 16}})
        for (bool causal : {true, false}) {
          chunk.set(tiles);
          rows.set(row_tiles);
          check(tensor_core, s, causal);
          const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, DType::BF16),
                                    dout = random(s.B * s.T * s.H * s.D, DType::BF16);
          const Result a = run_flash(FlashImpl::TensorCore, DType::BF16, qkv, dout, s, causal);
          const Result b = run_flash(FlashImpl::TensorCore, DType::BF16, qkv, dout, s, causal);
          EXPECT_EQ(a.dqkv, b.dqkv) << s << (causal ? " causal" : " full") << ", chunks of " << tiles << ", "
                                    << row_tiles << " rows";
        }
}

// The fused tensor-core backward (five products, dQ by atomics; flash_bwd_mma.cu), forced at
// every shape (auto takes it at head dim 128 on grids that fill the GPU): head dims 64 and 128,
// padded ones (120, 40), several key tiles of 128 and query tiles of 32, partial tiles. Its dQ
// is not bitwise repeatable, so only the accuracy rule (on a NaN-filled accumulator the
// launcher must zero). Head dims without a fused kernel (96) run split.
TEST_F(FlashAttnGpu, FusedBackward) {
  ScopedEnv variant("LLMHPC_FLASH_BWD");
  variant.set("fused");
  const Variant& tensor_core = kVariants[0];
  for (const Shape& s : {Shape{1, 257, 1, 128}, Shape{1, 700, 2, 128}, Shape{2, 77, 2, 120}, Shape{1, 100, 2, 64},
                         Shape{1, 45, 2, 40}, Shape{2, 1, 2, 128}, Shape{3, 530, 2, 64}, Shape{1, 130, 1, 96}})
    for (bool causal : {true, false}) check(tensor_core, s, causal);
  // Auto's choice (flash_bwd_mma.cu): head dim 128, T >= 2048, 128-key tiles for every SM.
  variant.set("auto");
  const int sms = flash::sm_count();
  auto fused = [&](int64_t batch, int64_t seq, int64_t head_dim) {
    const flash::FlashParams q = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256),
                                                      reinterpret_cast<void*>(256), reinterpret_cast<float*>(256),
                                                      batch, seq, 1, head_dim, true);
    return flash::plan_bwd_tensor_core(q).dq_atomic;
  };
  EXPECT_TRUE(fused(sms, 2048, 128));
  EXPECT_TRUE(fused(1, 128 * sms, 120));
  EXPECT_FALSE(fused(1, 128 * (sms - 1), 128));  // a grid smaller than the GPU
  EXPECT_FALSE(fused(2 * sms, 1024, 128));  // short key loops
  EXPECT_FALSE(fused(sms, 2048, 64));
  variant.set("split");
  EXPECT_FALSE(fused(sms, 2048, 128));
  variant.set("sideways");
  flash::FlashParams p = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256), reinterpret_cast<void*>(256),
                                              reinterpret_cast<float*>(256), 1, 8, 1, 128, true);
  EXPECT_THROW(flash::flash_backward_scratch_bytes(p), UsageError);  // LLMHPC_FLASH_BWD=sideways
}

TEST_F(FlashAttnGpu, ImplementationChoiceAndUnsupportedRequests) {
  flash::FlashParams p = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256), reinterpret_cast<void*>(256),
                                              reinterpret_cast<float*>(256), 1, 8, 1, 64, true);
  if (!std::getenv("LLMHPC_FLASH_IMPL")) EXPECT_STREQ(flash::flash_impl_name(p), "tensor-core");
  p.dtype = DType::F32;
  EXPECT_STREQ(flash::flash_impl_name(p), "simt");
  p.dtype = DType::F64;
  EXPECT_THROW(flash::flash_attention_forward(p, nullptr), UsageError);
  flash::FlashParams big = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256),
                                                reinterpret_cast<void*>(256), reinterpret_cast<float*>(256), 1, 8, 1,
                                                256, false);
  EXPECT_THROW(flash::flash_attention_forward(big, nullptr), UsageError);  // head dim > 128
  flash::FlashParams odd = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256),
                                                reinterpret_cast<void*>(256), reinterpret_cast<float*>(256), 1, 8, 1,
                                                20, false);
  EXPECT_STREQ(flash::flash_impl_name(odd), "simt");  // 20 is not a multiple of 8: CUDA cores
  odd.impl = FlashImpl::TensorCore;
  EXPECT_THROW(flash::flash_attention_forward(odd, nullptr), UsageError);
}

// A head dim the tensor cores cannot take (20) runs on CUDA cores under Auto, correctly.
TEST_F(FlashAttnGpu, AutoFallsBackForOddHeadDims) {
  check({FlashImpl::Auto, DType::BF16, "auto bf16"}, {1, 50, 2, 20}, true);
  check({FlashImpl::Auto, DType::F32, "auto fp32"}, {1, 50, 2, 20}, false);
}

}  // namespace
}  // namespace llmhpc::test

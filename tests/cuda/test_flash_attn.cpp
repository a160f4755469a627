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
// deterministic; L of every row; unsupported requests and bad LLMHPC_FLASH_* values are
// UsageErrors; flash_variant (what results record) names what the settings force and auto
// chooses. Skipped without a GPU, but for the settings' parsing (FlashSettings).
// Every run takes the environment's settings (a run under LLMHPC_FLASH_BWD=split checks the
// split backward everywhere) with the test's own forcing on top (FlashParams::settings). The
// CUDA-core variants run the fused dQ (flash_attn.h); LLMHPC_FLASH_BWD=split runs them split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/flash_attn/flash_attn.h"
#include "kernels/cuda/flash_attn/flash_launch.h"
#include "src/core/cuda/check.h"
#include "tests/unit/attention_test_util.h"

namespace llmhpc::test {
namespace {

using flash::DqSum;
using flash::FlashBwd;
using flash::FlashImpl;
using flash::FlashSettings;

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

// The environment's settings with `impl` forced.
FlashSettings with_impl(FlashImpl impl, FlashSettings settings = flash::flash_settings()) {
  settings.impl = impl;
  return settings;
}

// The kernels on the GPU: forward, then backward, on packed qkv (B,T,3,H,D).
Result run_flash(const FlashSettings& settings, DType dt, const std::vector<double>& qkv_v,
                 const std::vector<double>& dout_v, const Shape& s, bool causal) {
  DeviceBuffer qkv(dt, qkv_v.size()), dout(dt, dout_v.size()), out(dt, dout_v.size()), dqkv(dt, qkv_v.size());
  DeviceBuffer lse(DType::F32, s.B * s.H * s.T);
  qkv.write(qkv_v);
  dout.write(dout_v);
  flash::FlashParams p =
      flash::packed_params(dt, qkv.get(), out.get(), static_cast<float*>(lse.get()), s.B, s.T, s.H, s.D, causal);
  p.settings = settings;  // before the scratch: the backward's plan follows them
  // NaN-filled like the outputs: a fused dQ accumulator element that no first turn writes fails.
  DeviceBuffer scratch(DType::F32, flash::flash_backward_scratch_bytes(p) / sizeof(float));
  flash::set_packed_backward(p, dout.get(), dqkv.get(), scratch.get());
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

  // Every check of one variant on one shape, with `settings` (their impl: the variant's).
  void check(const Variant& var, const Shape& s, bool causal, const FlashSettings& settings = flash::flash_settings()) {
    const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, var.dtype),
                              dout = random(s.B * s.T * s.H * s.D, var.dtype);
    const Result ref = fp64_reference(qkv, dout, s, causal);
    const Result naive = naive_low_precision(qkv, dout, s, causal, var.dtype == DType::BF16);
    const Result got = run_flash(with_impl(var.impl, settings), var.dtype, qkv, dout, s, causal);
    std::ostringstream what;
    what << var.name << " " << s << (causal ? " causal" : " full") << ", random seed " << seed_;
    // Floor: twice the storage error of the reference; for the gradients also twice what
    // rounding the saved L to fp32 does (|dL| <= 2^-24 |L| scales every recomputed
    // probability exp(s - L) by 1 + dL; naive attention saves P instead and has no such term).
    const double l_term = std::ldexp(1.0, -24) * max_abs(ref.lse);
    // And for dq, dk the cancellation in dS = P (dP - D): dP = dO.v and D = rowsum(dO * O) are
    // fp32 sums of D_head terms each at most max|dO| max|v|, so one dS element is off by up
    // to 2^-24 D_head max|dO| max|v| even where the exact dS is 0 (T = 1, where naive
    // attention is exact); dq = scale dS K and dk = scale dS^T Q multiply it by max|K|, max|Q|.
    const double cancel =
        std::ldexp(1.0, -24) * double(s.D) * max_abs(dout) * max_abs(part(qkv, s, 2)) / std::sqrt(double(s.D));
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

// Tiles: 64 rows (tensor cores), 32 (CUDA cores). Compiled head dims: 16, 32, 64, 80, 96, 128
// (tensor cores), 32, 64, 128 (CUDA cores).
const Shape kShapes[] = {
    {2, 1, 2, 64},                                      // one position
    {1, 17, 3, 16},                                     // less than a tile
    {2, 64, 2, 32},                                     // exactly one tensor-core tile, two CUDA-core tiles
    {1, 100, 2, 64},                                    // neither
    {2, 77, 2, 80},                                     // the 2.7B model's head dim (CUDA cores: padded to 128)
    {1, 130, 1, 96}, {1, 257, 1, 128}, {1, 45, 2, 40},  // padded to 64
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
  const char* mode = flash::flash_settings().bwd == FlashBwd::Split ? " (split)" : " (fused dQ)";
  for (const Variant& var : kVariants)
    for (const Shape& s : {Shape{2, 300, 2, 64}, Shape{4, 1024, 8, 64}, Shape{2, 1000, 4, 80}})
      for (bool causal : {true, false}) {
        const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, var.dtype),
                                  dout = random(s.B * s.T * s.H * s.D, var.dtype);
        const Result a = run_flash(with_impl(var.impl), var.dtype, qkv, dout, s, causal);
        const Result b = run_flash(with_impl(var.impl), var.dtype, qkv, dout, s, causal);
        EXPECT_EQ(a.out, b.out) << var.name << mode << " " << s;
        EXPECT_EQ(a.dqkv, b.dqkv) << var.name << mode << " " << s << (causal ? " causal" : " full")
                                  << ": two backward runs differ";
      }
}

// The variables parse into FlashSettings; a value a variable does not take is a UsageError
// that names the variable and the values it takes (no GPU needed).
TEST(FlashSettings, ParseTheVariables) {
  std::map<std::string, std::string> env;
  auto parse = [&] {
    return flash::parse_flash_settings([&](const char* name) -> const char* {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  FlashSettings s = parse();
  EXPECT_EQ(s.impl, FlashImpl::Auto);
  EXPECT_EQ(s.bwd, FlashBwd::Auto);
  EXPECT_EQ(s.fwd_rows, 0);
  EXPECT_EQ(s.bwd_rows, 0);
  EXPECT_EQ(s.bwd_chunk, -1);
  env = {{"LLMHPC_FLASH_IMPL", "simt"},
         {"LLMHPC_FLASH_BWD", "split"},
         {"LLMHPC_FLASH_FWD_ROWS", "128"},
         {"LLMHPC_FLASH_BWD_ROWS", "64"},
         {"LLMHPC_FLASH_BWD_CHUNK", "3"}};
  s = parse();
  EXPECT_EQ(s.impl, FlashImpl::Simt);
  EXPECT_EQ(s.bwd, FlashBwd::Split);
  EXPECT_EQ(s.fwd_rows, 128);
  EXPECT_EQ(s.bwd_rows, 64);
  EXPECT_EQ(s.bwd_chunk, 3);
  env = {{"LLMHPC_FLASH_IMPL", "auto"}, {"LLMHPC_FLASH_BWD", "fused"}, {"LLMHPC_FLASH_BWD_CHUNK", "off"}};
  s = parse();
  EXPECT_EQ(s.impl, FlashImpl::Auto);
  EXPECT_EQ(s.bwd, FlashBwd::Fused);
  EXPECT_EQ(s.bwd_chunk, 0);
  env = {{"LLMHPC_FLASH_BWD_CHUNK", "auto"}};
  EXPECT_EQ(parse().bwd_chunk, -1);

  const std::pair<const char*, const char*> expected[] = {
      {"LLMHPC_FLASH_IMPL", "expected auto or simt"},
      {"LLMHPC_FLASH_BWD", "expected auto, fused or split"},
      {"LLMHPC_FLASH_FWD_ROWS", "expected 64 or 128"},
      {"LLMHPC_FLASH_BWD_ROWS", "expected 64 or 128"},
      {"LLMHPC_FLASH_BWD_CHUNK", "expected auto, off or a number of tiles"}};
  for (const auto& [variable, values] : expected)
    for (const char* bad : {"96", "", "128x", "sideways", "0", "-1"}) {
      env = {{variable, bad}};
      if (std::string(variable) == "LLMHPC_FLASH_BWD_CHUNK" && std::string(bad) == "96") continue;  // 96 tiles
      try {
        parse();
        ADD_FAILURE() << variable << "=" << bad << " was accepted";
      } catch (const UsageError& e) {
        EXPECT_EQ(std::string(e.what()), std::string(variable) + "=" + bad + ": " + values);
      }
    }
}

// The process's settings are its environment's, read once, and packed_params carries them;
// settings a caller sets out of range are UsageErrors of the launch (no GPU needed: the
// checks come first).
TEST(FlashSettings, EnvironmentReadOnceAndChecked) {
  const FlashSettings env = flash::parse_flash_settings(std::getenv), &once = flash::flash_settings();
  EXPECT_EQ(once.impl, env.impl);
  EXPECT_EQ(once.bwd, env.bwd);
  EXPECT_EQ(once.fwd_rows, env.fwd_rows);
  EXPECT_EQ(once.bwd_rows, env.bwd_rows);
  EXPECT_EQ(once.bwd_chunk, env.bwd_chunk);
  EXPECT_EQ(&flash::flash_settings(), &once);
  flash::FlashParams p = flash::packed_params(DType::BF16, reinterpret_cast<void*>(256), reinterpret_cast<void*>(256),
                                              reinterpret_cast<float*>(256), 1, 8, 1, 64, true);
  EXPECT_EQ(p.settings.bwd, once.bwd);
  EXPECT_EQ(p.settings.bwd_chunk, once.bwd_chunk);
  p.settings.fwd_rows = 96;
  EXPECT_THROW(flash::flash_attention_forward(p, nullptr), UsageError);
  p.settings.fwd_rows = 0;
  p.settings.bwd_chunk = -2;
  EXPECT_THROW(flash::flash_attention_forward(p, nullptr), UsageError);
}

// Two m tiles per warp (128 rows per CTA) are taken only on long sequences: the forward's
// queries (flash_fwd_mma.cu) and, at head dim 64, the backward's keys and queries
// (flash_bwd_mma.cu). Forced here on small shapes (split, whose dQ is bitwise repeatable;
// chunks off: their sizes follow the rows), they must give the bits of one.
TEST_F(FlashAttnGpu, RowTilesAgree) {
  for (int FlashSettings::*rows : {&FlashSettings::fwd_rows, &FlashSettings::bwd_rows}) {
    FlashSettings sixty_four = with_impl(FlashImpl::TensorCore);
    sixty_four.bwd = FlashBwd::Split;
    sixty_four.bwd_chunk = 0;
    FlashSettings one_twenty_eight = sixty_four;
    sixty_four.*rows = 64;
    one_twenty_eight.*rows = 128;
    for (const Shape& s : {Shape{1, 700, 2, 64}, Shape{2, 77, 2, 80}, Shape{1, 257, 1, 128}, Shape{1, 45, 2, 40},
                           Shape{1, 300, 1, 16}, Shape{2, 77, 2, 48}})
      for (bool causal : {true, false}) {
        const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, DType::BF16),
                                  dout = random(s.B * s.T * s.H * s.D, DType::BF16);
        const Result a = run_flash(sixty_four, DType::BF16, qkv, dout, s, causal);
        const Result b = run_flash(one_twenty_eight, DType::BF16, qkv, dout, s, causal);
        const std::string what =
            std::string(rows == &FlashSettings::fwd_rows ? "forward" : "backward") + (causal ? " causal" : " full");
        EXPECT_EQ(a.out, b.out) << s << " " << what;
        EXPECT_EQ(a.lse, b.lse) << s << " " << what;
        EXPECT_EQ(a.dqkv, b.dqkv) << s << " " << what;
      }
  }
}

// The tensor-core backward cuts long tiles into chunks on grids too small to fill the GPU
// (flash_bwd_mma.cu); forced here to chunks of 2 and 3 streamed tiles (every tile longer than
// that cut, up to 22 chunks; at head dim 64 also with two m tiles), it must keep the accuracy
// rule and stay bitwise deterministic (split: chunks are the split backward's).
TEST_F(FlashAttnGpu, ChunkedBackward) {
  const Variant& tensor_core = kVariants[0];
  for (int tiles : {2, 3})
    for (int rows : {64, 128})
      for (const Shape& s : {Shape{1, 700, 2, 64}, Shape{1, 257, 1, 128}, Shape{2, 77, 2, 80}, Shape{1, 300, 1, 16}})
        for (bool causal : {true, false}) {
          FlashSettings chunked = with_impl(FlashImpl::TensorCore);
          chunked.bwd = FlashBwd::Split;
          chunked.bwd_chunk = tiles;
          chunked.bwd_rows = rows;
          check(tensor_core, s, causal, chunked);
          const std::vector<double> qkv = random(s.B * s.T * 3 * s.H * s.D, DType::BF16),
                                    dout = random(s.B * s.T * s.H * s.D, DType::BF16);
          const Result a = run_flash(chunked, DType::BF16, qkv, dout, s, causal);
          const Result b = run_flash(chunked, DType::BF16, qkv, dout, s, causal);
          EXPECT_EQ(a.dqkv, b.dqkv) << s << (causal ? " causal" : " full") << ", chunks of " << tiles << ", " << rows
                                    << " rows";
        }
}

// Params of ops.h's packed layouts with placeholder addresses, aligned like the device
// allocator's buffers (the choices read addresses only for their alignment), and the
// backward's plan set with `settings`.
flash::FlashParams placeholder_params(DType dt, int64_t B, int64_t T, int64_t H, int64_t D, bool causal,
                                      const FlashSettings& settings) {
  void* const aligned = reinterpret_cast<void*>(256);
  flash::FlashParams p = flash::packed_params(dt, aligned, aligned, static_cast<float*>(aligned), B, T, H, D, causal);
  p.settings = settings;
  flash::set_packed_backward(p, aligned, aligned, aligned);
  return p;
}

// The fused tensor-core backward (five products, dQ by atomics; flash_bwd_mma.cu), forced at
// every shape (auto takes it on long sequences whose grid fills the GPU): head dims 32, 64, 96
// and 128, padded ones (120, 40, and 80 in 96), several key tiles of 128 and query tiles of 64
// and 128, partial tiles. Its dQ is not bitwise repeatable, so only the accuracy rule (on a
// NaN-filled accumulator the delta kernel must zero).
TEST_F(FlashAttnGpu, FusedBackward) {
  FlashSettings fused = flash::flash_settings();
  fused.bwd = FlashBwd::Fused;
  const Variant& tensor_core = kVariants[0];
  for (const Shape& s :
       {Shape{1, 257, 1, 128}, Shape{1, 700, 2, 128}, Shape{2, 77, 2, 120}, Shape{1, 100, 2, 64}, Shape{1, 45, 2, 40},
        Shape{2, 1, 2, 128}, Shape{3, 530, 2, 64}, Shape{1, 130, 1, 96}, Shape{2, 300, 2, 32}, Shape{1, 90, 1, 80}})
    for (bool causal : {true, false}) check(tensor_core, s, causal, fused);
  // Auto's choice (flash_bwd_mma.cu): T >= 2048 (4096 at head dim 80, 8192 at 64), 128-key tiles
  // for every SM.
  const int sms = flash::sm_count();
  auto atomic = [&](int64_t batch, int64_t seq, int64_t head_dim, FlashBwd bwd) {
    FlashSettings settings;
    settings.bwd = bwd;
    return placeholder_params(DType::BF16, batch, seq, 1, head_dim, true, settings).dq_atomic;
  };
  EXPECT_TRUE(atomic(sms, 2048, 128, FlashBwd::Auto));
  EXPECT_TRUE(atomic(1, 128 * sms, 120, FlashBwd::Auto));
  EXPECT_FALSE(atomic(1, 128 * (sms - 1), 128, FlashBwd::Auto));  // a grid smaller than the GPU
  EXPECT_FALSE(atomic(2 * sms, 1024, 128, FlashBwd::Auto));       // short key loops
  EXPECT_FALSE(atomic(sms, 4096, 64, FlashBwd::Auto));            // the split kernels' two m tiles win there
  EXPECT_TRUE(atomic(sms, 8192, 64, FlashBwd::Auto));
  EXPECT_TRUE(atomic(sms, 2048, 32, FlashBwd::Auto));
  EXPECT_TRUE(atomic(sms, 2048, 96, FlashBwd::Auto));
  EXPECT_TRUE(atomic(sms, 2048, 88, FlashBwd::Auto));   // runs in 96
  EXPECT_FALSE(atomic(sms, 2048, 80, FlashBwd::Auto));  // in 96, from T 4096
  EXPECT_TRUE(atomic(sms, 4096, 80, FlashBwd::Auto));
  EXPECT_FALSE(atomic(sms, 2048, 128, FlashBwd::Split));
  EXPECT_TRUE(atomic(1, 8, 64, FlashBwd::Fused));
  EXPECT_TRUE(atomic(1, 8, 32, FlashBwd::Fused));
  EXPECT_TRUE(atomic(1, 8, 80, FlashBwd::Fused));   // in 96
  EXPECT_FALSE(atomic(1, 8, 16, FlashBwd::Fused));  // no fused kernel: split
}

// flash_variant, which CudaOps::attention_variant records with results, names the kernels the
// settings force and those auto chooses; the launchers run what it names.
TEST_F(FlashAttnGpu, VariantNamesWhatRuns) {
  const FlashSettings autos;  // every choice automatic
  auto variant = [](DType dt, int64_t B, int64_t T, int64_t H, int64_t D, const FlashSettings& settings) {
    return flash::flash_variant(placeholder_params(dt, B, T, H, D, true, settings));
  };
  // bf16, head dim 40: tensor cores at the compiled 64, zero-padded; short: 64 rows, split, whole.
  flash::FlashVariant v = variant(DType::BF16, 1, 100, 2, 40, autos);
  EXPECT_EQ(v.fwd.impl, FlashImpl::TensorCore);
  EXPECT_EQ(v.bwd.impl, FlashImpl::TensorCore);
  EXPECT_EQ(v.fwd.head_dim, 64);
  EXPECT_EQ(v.bwd.head_dim, 64);
  EXPECT_EQ(v.fwd.rows, 64);
  EXPECT_EQ(v.bwd.rows, 64);
  EXPECT_EQ(v.fwd.streamed, 64);
  EXPECT_EQ(v.bwd.streamed, 64);
  EXPECT_EQ(v.dq_sum, DqSum::None);
  EXPECT_EQ(v.kv_chunk, 0);
  EXPECT_EQ(v.q_chunk, 0);
  // fp32 (and bf16 at a head dim the tensor cores cannot take): CUDA cores, dQ summed in order.
  for (const auto& [dt, d] : {std::pair{DType::F32, int64_t(80)}, std::pair{DType::BF16, int64_t(20)}}) {
    v = variant(dt, 2, 77, 2, d, autos);
    EXPECT_EQ(v.fwd.impl, FlashImpl::Simt) << dtype_name(dt);
    EXPECT_EQ(v.bwd.impl, FlashImpl::Simt) << dtype_name(dt);
    EXPECT_EQ(v.fwd.head_dim, d == 80 ? 128 : 32) << dtype_name(dt);
    EXPECT_EQ(v.bwd.rows, 64) << dtype_name(dt);
    EXPECT_EQ(v.fwd.streamed, d == 80 ? 32 : 64) << dtype_name(dt);  // 32 above head dim 64
    EXPECT_EQ(v.bwd.streamed, v.fwd.streamed) << dtype_name(dt);
    EXPECT_EQ(v.dq_sum, DqSum::Ordered) << dtype_name(dt);
  }
  FlashSettings split = autos;
  split.bwd = FlashBwd::Split;
  EXPECT_EQ(variant(DType::F32, 2, 77, 2, 80, split).dq_sum, DqSum::None);
  FlashSettings simt = autos;
  simt.impl = FlashImpl::Simt;
  v = variant(DType::BF16, 1, 100, 2, 64, simt);
  EXPECT_EQ(v.fwd.impl, FlashImpl::Simt);
  EXPECT_EQ(v.dq_sum, DqSum::Ordered);
  // Auto's forward rows: 128 where the grid of 128-row tiles has two CTAs per SM (causal) or one,
  // above head dim 16.
  const int64_t sms = flash::sm_count();
  EXPECT_EQ(variant(DType::BF16, sms, 128, 1, 64, autos).fwd.rows, 64);
  EXPECT_EQ(variant(DType::BF16, 2 * sms, 128, 1, 64, autos).fwd.rows, 128);
  EXPECT_EQ(variant(DType::BF16, 2 * sms, 128, 1, 32, autos).fwd.rows, 128);
  EXPECT_EQ(variant(DType::BF16, sms, 128, 1, 24, autos).fwd.rows, 64);
  EXPECT_EQ(variant(DType::BF16, 2 * sms, 128, 1, 16, autos).fwd.rows, 64);  // head dim 16: always 64
  // Key tiles of 128 up to head dim 32 (24 runs in 32), 64 above.
  for (const auto& [d, keys] : {std::pair{int64_t(16), 128}, std::pair{int64_t(24), 128}, std::pair{int64_t(64), 64},
                                std::pair{int64_t(80), 64}, std::pair{int64_t(128), 64}})
    EXPECT_EQ(variant(DType::BF16, 1, 100, 2, d, autos).fwd.streamed, keys) << d;
  EXPECT_EQ(flash::flash_variant(placeholder_params(DType::BF16, sms, 128, 1, 64, false, autos)).fwd.rows, 128);
  // Forced rows: two m tiles wherever they are compiled (the backward's at head dim 64 only).
  FlashSettings rows = autos;
  rows.fwd_rows = rows.bwd_rows = 128;
  for (int64_t d : {64, 128}) {
    v = variant(DType::BF16, 1, 300, 1, d, rows);
    EXPECT_EQ(v.fwd.rows, 128) << d;
    EXPECT_EQ(v.bwd.rows, d == 64 ? 128 : 64) << d;
    EXPECT_EQ(v.bwd.streamed, 32) << d;  // two m tiles (64) or above head dim 64 (128)
  }
  // Forced chunks: 2 streamed tiles each, for both kernels of the split backward.
  FlashSettings chunks = autos;
  chunks.bwd_chunk = 2;
  v = variant(DType::BF16, 1, 700, 2, 64, chunks);
  EXPECT_EQ(v.dq_sum, DqSum::None);
  EXPECT_EQ(v.kv_chunk, 2);
  EXPECT_EQ(v.q_chunk, 2);
  // Fused, forced at head dim 64 and auto's at 128 on a grid that fills the GPU: 128 keys a CTA.
  FlashSettings fused = autos;
  fused.bwd = FlashBwd::Fused;
  for (const auto& [d, batch, settings] :
       {std::tuple{int64_t(64), int64_t(1), fused}, std::tuple{int64_t(128), int64_t(flash::sm_count()), autos}}) {
    v = variant(DType::BF16, batch, 2048, 1, d, settings);
    EXPECT_EQ(v.dq_sum, DqSum::Atomic) << d;
    EXPECT_EQ(v.bwd.rows, 128) << d;
    EXPECT_EQ(v.bwd.streamed, d == 64 ? 128 : 64) << d;  // the fused kernel's query tile
    EXPECT_EQ(v.kv_chunk + v.q_chunk, 0) << d;
  }
  // Head dim 32's fused query tile: 64 (two CTAs per SM) without a causal mask, 128 with one.
  for (const bool causal : {false, true})
    EXPECT_EQ(flash::flash_variant(placeholder_params(DType::BF16, 1, 2048, 1, 32, causal, fused)).bwd.streamed,
              causal ? 128 : 64)
        << causal;
  // Head dim 80 (the 2.7B model's) fuses in the kernel of 96; its forward stays at 80.
  v = variant(DType::BF16, flash::sm_count(), 4096, 1, 80, autos);
  EXPECT_EQ(v.dq_sum, DqSum::Atomic);
  EXPECT_EQ(v.bwd.head_dim, 96);
  EXPECT_EQ(v.bwd.streamed, 64);
  EXPECT_EQ(v.fwd.head_dim, 80);
  // Split forced where auto would fuse.
  EXPECT_EQ(variant(DType::BF16, flash::sm_count(), 2048, 1, 128, split).dq_sum, DqSum::None);
}

// CudaOps::attention_variant: the (name, value) pairs results record, for the process's
// settings.
TEST_F(FlashAttnGpu, BackendRecordsTheVariant) {
  const Backend be = make_backend({DeviceKind::Cuda});
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  const AttentionDims naive{4, 1024, 16, 64, true, AttentionKind::Naive};
  const AttentionDims flash_dims{4, 1024, 16, 64, true, AttentionKind::Flash};
  EXPECT_EQ(be.ops->attention_variant(naive, DType::BF16),
            (Pairs{{"attention_kernel", "naive (cuBLAS + softmax kernel)"}}));
  const flash::FlashVariant v =
      flash::flash_variant(placeholder_params(DType::BF16, 4, 1024, 16, 64, true, flash::flash_settings()));
  const Pairs got = be.ops->attention_variant(flash_dims, DType::BF16);
  std::vector<std::string> keys;
  for (const auto& kv : got) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"attention_kernel", "flash_impl", "flash_head_dim", "flash_fwd_rows",
                                            "flash_fwd_streamed", "flash_bwd", "flash_bwd_head_dim", "flash_bwd_rows",
                                            "flash_bwd_streamed", "flash_bwd_chunks", "flash_dq"}));
  const std::map<std::string, std::string> m(got.begin(), got.end());
  EXPECT_EQ(m.at("attention_kernel"), "flash");
  EXPECT_EQ(m.at("flash_impl"), flash::flash_impl_name(v.fwd.impl));
  EXPECT_EQ(m.at("flash_fwd_rows"), std::to_string(v.fwd.rows));
  EXPECT_EQ(m.at("flash_bwd_rows"), std::to_string(v.bwd.rows));
  EXPECT_EQ(m.at("flash_fwd_streamed"), std::to_string(v.fwd.streamed));
  EXPECT_EQ(m.at("flash_bwd_streamed"), std::to_string(v.bwd.streamed));
  EXPECT_EQ(m.at("flash_bwd_head_dim"), std::to_string(v.bwd.head_dim));
  const FlashSettings& env = flash::flash_settings();
  if (env.impl == FlashImpl::Auto && env.bwd == FlashBwd::Auto && !env.fwd_rows && !env.bwd_rows &&
      env.bwd_chunk == -1)  // auto's choices at these sizes (512 forward CTAs of 128 rows fill the GPU; too
                            // short for the backward's two m tiles, the fused backward, chunks)
    EXPECT_EQ(got, (Pairs{{"attention_kernel", "flash"},
                          {"flash_impl", "tensor-core"},
                          {"flash_head_dim", "64"},
                          {"flash_fwd_rows", "128"},
                          {"flash_fwd_streamed", "64"},
                          {"flash_bwd", "split"},
                          {"flash_bwd_head_dim", "64"},
                          {"flash_bwd_rows", "64"},
                          {"flash_bwd_streamed", "64"},
                          {"flash_bwd_chunks", "off"},
                          {"flash_dq", "none"}}));
  const Pairs fp32 = be.ops->attention_variant({2, 77, 2, 80, false, AttentionKind::Flash}, DType::F32);
  EXPECT_EQ(fp32[1], (std::pair<std::string, std::string>{"flash_impl", "simt"}));
  EXPECT_EQ(fp32[2], (std::pair<std::string, std::string>{"flash_head_dim", "128"}));
  // Head dim 80's fused backward runs in the kernel of 96, and says so.
  const flash::FlashVariant v80 = flash::flash_variant(
      placeholder_params(DType::BF16, flash::sm_count(), 4096, 1, 80, true, flash::flash_settings()));
  const Pairs d80 =
      be.ops->attention_variant({flash::sm_count(), 4096, 1, 80, true, AttentionKind::Flash}, DType::BF16);
  const std::map<std::string, std::string> m80(d80.begin(), d80.end());
  EXPECT_EQ(m80.at("flash_head_dim"), "80");
  EXPECT_EQ(m80.at("flash_bwd_head_dim"), std::to_string(v80.bwd.head_dim));
  EXPECT_EQ(m80.at("flash_bwd"), v80.dq_sum == flash::DqSum::Atomic ? "fused" : "split");
  EXPECT_THROW(be.ops->attention_variant({1, 8, 1, 256, true, AttentionKind::Flash}, DType::BF16), UsageError);
}

TEST_F(FlashAttnGpu, ImplementationChoiceAndUnsupportedRequests) {
  flash::FlashParams p = placeholder_params(DType::BF16, 1, 8, 1, 64, true, flash::flash_settings());
  if (p.settings.impl == FlashImpl::Auto) EXPECT_EQ(flash::flash_variant(p).fwd.impl, FlashImpl::TensorCore);
  p.dtype = DType::F32;
  EXPECT_EQ(flash::flash_variant(p).fwd.impl, FlashImpl::Simt);
  p.dtype = DType::F64;
  EXPECT_THROW(flash::flash_attention_forward(p, nullptr), UsageError);
  flash::FlashParams big = placeholder_params(DType::BF16, 1, 8, 1, 256, false, flash::flash_settings());
  EXPECT_THROW(flash::flash_attention_forward(big, nullptr), UsageError);  // head dim > 128
  EXPECT_THROW(flash::flash_attention_backward(big, nullptr), UsageError);
  EXPECT_THROW(flash::flash_variant(big), UsageError);
  flash::FlashParams odd = placeholder_params(DType::BF16, 1, 8, 1, 20, false, flash::flash_settings());
  EXPECT_EQ(flash::flash_variant(odd).fwd.impl, FlashImpl::Simt);  // 20 is not a multiple of 8: CUDA cores
  odd.settings.impl = FlashImpl::TensorCore;
  EXPECT_THROW(flash::flash_attention_forward(odd, nullptr), UsageError);
}

// A head dim the tensor cores cannot take (20) runs on CUDA cores under Auto, correctly.
TEST_F(FlashAttnGpu, AutoFallsBackForOddHeadDims) {
  check({FlashImpl::Auto, DType::BF16, "auto bf16"}, {1, 50, 2, 20}, true);
  check({FlashImpl::Auto, DType::F32, "auto fp32"}, {1, 50, 2, 20}, false);
}

}  // namespace
}  // namespace llmhpc::test

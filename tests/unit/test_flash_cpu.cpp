// The CPU FlashAttention-2 reference (kernels/cpu/flash_attention.h) against naive attention
// (cpu_kernels.h) computed in fp64: forward output and logsumexp, backward dQ, dK, dV;
// causal and not; sequence lengths that are and are not multiples of the tiles, tiles of
// equal and unequal sizes. In fp64 the two agree to rounding. In fp32 the rule of
// flash-attention's own tests: the flash error versus the fp64 reference is at most twice
// the error of naive attention in the same precision, plus a small floor (see
// flash_floor below). Plus the wiring in the CPU backend (AttentionKind::Flash saves
// (B,H,T)) and finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/flash_attention.h"
#include "tests/unit/attention_test_util.h"
#include "tests/unit/cpu_test_util.h"

namespace llmhpc::test {
namespace {

struct Shape5 {
  int64_t B, T, H, D, tile_q, tile_k;
};

std::ostream& operator<<(std::ostream& os, const Shape5& s) {
  return os << "B" << s.B << " T" << s.T << " H" << s.H << " D" << s.D << " tiles " << s.tile_q << "x" << s.tile_k;
}

// Normal(0, 1) values that fp32 holds exactly, so fp32 and fp64 runs see the same inputs.
std::vector<double> random_values(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = double(float(normal(rng)));
  return v;
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// L_i = logsumexp_j (q_i . k_j / sqrt(D)) over the visible keys, from the definition, in fp64.
std::vector<double> reference_lse(const std::vector<double>& qkv, const Shape5& s, bool causal) {
  std::vector<double> L(s.B * s.H * s.T);
  const int64_t row = 3 * s.H * s.D;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.T; ++i) {
        std::vector<double> sc;
        for (int64_t j = 0; j < (causal ? i + 1 : s.T); ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d)
            dot += qkv[(b * s.T + i) * row + h * s.D + d] * qkv[(b * s.T + j) * row + s.H * s.D + h * s.D + d];
          sc.push_back(dot / std::sqrt(double(s.D)));
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        L[(b * s.H + h) * s.T + i] = mx + std::log(sum);
      }
  return L;
}

using Result = AttentionResult;

template <class T>
Result run_flash(const std::vector<double>& qkv, const std::vector<double>& dout, const Shape5& s, bool causal) {
  std::vector<T> q = as<T>(qkv), d = as<T>(dout), out(dout.size()), lse(s.B * s.H * s.T), dq(qkv.size(), T(NAN));
  cpu::flash_attention_forward(out.data(), lse.data(), q.data(), s.B, s.T, s.H, s.D, causal, s.tile_q, s.tile_k);
  cpu::flash_attention_backward(dq.data(), d.data(), out.data(), lse.data(), q.data(), s.B, s.T, s.H, s.D, causal,
                                s.tile_q, s.tile_k);
  return {to_double(out), to_double(lse), to_double(dq)};
}

template <class T>
Result run_naive(const std::vector<double>& qkv, const std::vector<double>& dout, const Shape5& s, bool causal) {
  std::vector<T> q = as<T>(qkv), d = as<T>(dout), out(dout.size()), probs(s.B * s.H * s.T * s.T),
                 dq(qkv.size(), T(NAN));
  cpu::attention_forward(out.data(), probs.data(), q.data(), s.B, s.T, s.H, s.D, causal);
  cpu::attention_backward(dq.data(), d.data(), probs.data(), q.data(), s.B, s.T, s.H, s.D, causal);
  return {to_double(out), {}, to_double(dq)};
}

// Error of storing `ref` in fp32: what no fp32 result can go below.
double fp32_storage_error(const std::vector<double>& ref) {
  double m = 0;
  for (double x : ref) m = std::max(m, std::fabs(double(float(x)) - x));
  return m;
}

// The floor of the 2x rule, in fp32. The CPU computes both attentions in double and rounds
// only what it stores, so naive fp32's error is about one rounding of each stored value. What
// flash stores in addition is L, rounded to fp32: |dL| <= u |L| (u = 2^-24), which scales
// every probability recomputed in backward, p = exp(s - L), by (1 + dL), so the gradients
// move by up to u max|L| of their size (measured: this is nearly all of the fp32 flash
// backward error). Floor: twice that, plus twice the error of storing the reference itself.
double flash_floor(const std::vector<double>& ref, const std::vector<double>& lse) {
  const double u = std::ldexp(1.0, -24);
  return 2 * fp32_storage_error(ref) + 2 * u * max_abs(lse) * max_abs(ref);
}

const Shape5 kShapes[] = {
    {2, 64, 2, 16, 16, 16},  // T a multiple of both tiles
    {1, 37, 3, 8, 16, 8},    // T a multiple of neither; unequal tiles
    {2, 50, 1, 32, 8, 16},   // query tiles smaller than key tiles
    {1, 45, 2, 16, 32, 32},  // the default tiles, T not a multiple
    {2, 5, 2, 8, 32, 32},    // T smaller than a tile
    {1, 1, 1, 4, 32, 32},    // a single position
};

class FlashCpu : public ::testing::TestWithParam<std::tuple<Shape5, bool>> {
 protected:
  std::mt19937_64 rng{20261122};
};

TEST_P(FlashCpu, Fp64MatchesNaiveAttention) {
  const Shape5 s = std::get<0>(GetParam());
  const bool causal = std::get<1>(GetParam());
  const std::vector<double> qkv = random_values(rng, s.B * s.T * 3 * s.H * s.D),
                            dout = random_values(rng, s.B * s.T * s.H * s.D);
  const Result flash = run_flash<double>(qkv, dout, s, causal), naive = run_naive<double>(qkv, dout, s, causal);
  EXPECT_LT(rel_error(flash.out, naive.out), 1e-13) << s;
  EXPECT_LT(rel_error(flash.lse, reference_lse(qkv, s, causal)), 1e-13) << s;
  for (int which = 0; which < 3; ++which)
    EXPECT_LT(rel_error(part(flash.dqkv, s, which), part(naive.dqkv, s, which)), 1e-12) << s << " d"
                                                                                        << "qkv"[which];
}

TEST_P(FlashCpu, Fp32ErrorAtMostTwiceNaiveFp32Error) {
  const Shape5 s = std::get<0>(GetParam());
  const bool causal = std::get<1>(GetParam());
  for (int trial = 0; trial < 3; ++trial) {  // fresh inputs each time
    const std::vector<double> qkv = random_values(rng, s.B * s.T * 3 * s.H * s.D),
                              dout = random_values(rng, s.B * s.T * s.H * s.D);
    const Result ref = run_naive<double>(qkv, dout, s, causal);
    const Result naive = run_naive<float>(qkv, dout, s, causal), flash = run_flash<float>(qkv, dout, s, causal);
    const std::vector<double> lse64 = reference_lse(qkv, s, causal);
    auto check = [&](const std::vector<double>& f, const std::vector<double>& n, const std::vector<double>& r,
                     const char* what) {
      const double flash_err = max_abs_diff(f, r), naive_err = max_abs_diff(n, r);
      EXPECT_LE(flash_err, 2 * naive_err + flash_floor(r, lse64))
          << s << (causal ? " causal " : " ") << what << ": flash " << flash_err << ", naive " << naive_err;
    };
    check(flash.out, naive.out, ref.out, "out");
    for (int which = 0; which < 3; ++which) {
      const char* names[] = {"dq", "dk", "dv"};
      check(part(flash.dqkv, s, which), part(naive.dqkv, s, which), part(ref.dqkv, s, which), names[which]);
    }
    // Naive attention has no L: it must be L in fp64 rounded once (twice at most).
    EXPECT_LE(max_abs_diff(flash.lse, lse64), 2 * fp32_storage_error(lse64) + 1e-12) << s << " L";
  }
}

std::string shape_name(const Shape5& s, bool causal) {
  std::ostringstream os;
  os << "B" << s.B << "_T" << s.T << "_H" << s.H << "_D" << s.D;
  if (s.tile_q) os << "_tiles" << s.tile_q << "x" << s.tile_k;
  os << (causal ? "_causal" : "_full");
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashCpu, ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Bool()),
                         [](const auto& info) { return shape_name(std::get<0>(info.param), std::get<1>(info.param)); });

// Through the CPU backend: AttentionKind::Flash saves (B,H,T) and computes what naive does.
class FlashCpuOps : public ::testing::TestWithParam<bool> {
 protected:
  Backend be = cpu_backend();
  Device& dev = *be.device;
  Ops& ops = *be.ops;
  std::mt19937_64 rng{77};
  HostTensor randn(Shape s, DType t = DType::F64) {
    HostTensor x(dev, t, s);
    x.fill_normal(rng);
    return x;
  }
};

TEST_P(FlashCpuOps, BackendDispatchesFlashAndMatchesNaive) {
  const bool causal = GetParam();
  for (DType dt : {DType::F64, DType::F32}) {
    const int64_t B = 2, T = 45, H = 3, D = 8;
    const AttentionDims naive{B, T, H, D, causal, AttentionKind::Naive};
    const AttentionDims flash{B, T, H, D, causal, AttentionKind::Flash};
    const SavedSpec spec = ops.attention_saved(flash, dt);
    EXPECT_EQ(spec.shape, (Shape{B, H, T}));
    EXPECT_EQ(spec.dtype, dt);
    HostTensor qkv = randn({B, T, 3 * H * D}, dt), dout = randn({B, T, H * D}, dt);
    HostTensor out_n(dev, dt, {B, T, H * D}), out_f(dev, dt, {B, T, H * D});
    HostTensor probs(dev, dt, ops.attention_saved(naive, dt).shape), lse(dev, dt, spec.shape);
    HostTensor dq_n(dev, dt, {B, T, 3 * H * D}), dq_f(dev, dt, {B, T, 3 * H * D});
    ops.attention_forward(out_n, probs, qkv, naive);
    ops.attention_forward(out_f, lse, qkv, flash);
    ops.attention_backward(dq_n, dout, out_n, probs, qkv, naive);
    ops.attention_backward(dq_f, dout, out_f, lse, qkv, flash);
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    EXPECT_LT(rel_error(out_f.values(), out_n.values()), tol) << dtype_name(dt);
    EXPECT_LT(rel_error(dq_f.values(), dq_n.values()), tol) << dtype_name(dt);
  }
}

// What results record of the attention that ran (Ops::attention_variant): the kernel only.
TEST_P(FlashCpuOps, NamesTheKernelItRuns) {
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  const bool causal = GetParam();
  EXPECT_EQ(ops.attention_variant({2, 45, 3, 8, causal, AttentionKind::Flash}, DType::F64),
            (Pairs{{"attention_kernel", "cpu flash"}}));
  EXPECT_EQ(ops.attention_variant({2, 45, 3, 8, causal, AttentionKind::Naive}, DType::F32),
            (Pairs{{"attention_kernel", "cpu naive"}}));
}

TEST_P(FlashCpuOps, GradientsMatchFiniteDifferences) {
  const bool causal = GetParam();
  const int64_t B = 1, T = 6, H = 2, D = 4;
  const AttentionDims dims{B, T, H, D, causal, AttentionKind::Flash};
  HostTensor qkv = randn({B, T, 3 * H * D}), R = randn({B, T, H * D}), out(dev, DType::F64, {B, T, H * D}),
             lse(dev, DType::F64, ops.attention_saved(dims, DType::F64).shape),
             dqkv(dev, DType::F64, {B, T, 3 * H * D});
  ops.attention_forward(out, lse, qkv, dims);
  ops.attention_backward(dqkv, R, out, lse, qkv, dims);
  auto fd = finite_difference(qkv, [&] {
    ops.attention_forward(out, lse, qkv, dims);
    return dot(out, R);
  });
  EXPECT_LT(rel_error(dqkv.values(), fd), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(CausalAndNot, FlashCpuOps, ::testing::Bool());

}  // namespace
}  // namespace llmhpc::test

// ---- The CUDA kernels' own code, run on a host emulation of the GPU ---------------------------
// With the CUDA toolkit's headers at hand, kernels/cuda/flash_attn/*.cuh compile as C++ against
// kernels/cuda/flash_attn/emulate.h (threads of a block as fibers taking turns, warp collectives and
// the mma/ldmatrix fragment layouts of the PTX ISA emulated). That checks the kernels'
// indexing - fragments, masks, tile loops, bounds, padding of the head dim - on machines
// without a GPU; tests/cuda/test_flash_attn.cpp checks the real thing on a GPU. The kernels
// are compiled into namespace llmhpc::flash_emu here, apart from the library's real ones.
#if defined(LLMHPC_WITH_CUDA) && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define LLMHPC_FLASH_EMULATE 1
#define flash flash_emu
#include "kernels/cuda/flash_attn/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_attn/flash_simt_kernel.cuh"
#undef flash
#pragma GCC diagnostic pop

namespace llmhpc::test {
namespace {

namespace fe = llmhpc::flash_emu;

// Fused: the CUDA-core backward with the dQ summed by the dK/dV kernel (the default on the GPU).
// TensorCoreBf16Fused: the tensor-core backward with dQ added by the dK/dV kernel (head dims 64
// and 128; the others run split, as on the GPU).
enum class EmuImpl {
  TensorCoreBf16,
  TensorCoreBf16Chunked,
  TensorCoreBf16Fused,
  SimtFp32,
  SimtBf16,
  SimtFp32Fused,
  SimtBf16Fused
};
const char* emu_name(EmuImpl i) {
  switch (i) {
    case EmuImpl::TensorCoreBf16: return "tensor-core bf16";
    case EmuImpl::TensorCoreBf16Chunked: return "tensor-core bf16 chunked";
    case EmuImpl::TensorCoreBf16Fused: return "tensor-core bf16 fused";
    case EmuImpl::SimtFp32: return "simt fp32";
    case EmuImpl::SimtBf16: return "simt bf16";
    case EmuImpl::SimtFp32Fused: return "simt fp32 fused";
    case EmuImpl::SimtBf16Fused: return "simt bf16 fused";
  }
  return "?";
}
bool emu_tensor_core(EmuImpl i) {
  return i == EmuImpl::TensorCoreBf16 || i == EmuImpl::TensorCoreBf16Chunked || i == EmuImpl::TensorCoreBf16Fused;
}
bool emu_fp32(EmuImpl i) { return i == EmuImpl::SimtFp32 || i == EmuImpl::SimtFp32Fused; }
bool emu_fused(EmuImpl i) { return i == EmuImpl::SimtFp32Fused || i == EmuImpl::SimtBf16Fused; }

// Device-side storage, on the host: values in the kernel's dtype.
struct EmuTensor {
  DType dtype;
  std::vector<float> f32;
  std::vector<__nv_bfloat16> b16;
  EmuTensor(DType t, const std::vector<double>& v) : dtype(t) {
    if (t == DType::F32) f32.assign(v.begin(), v.end());
    else
      for (double x : v) b16.push_back(__float2bfloat16_rn(float(x)));
  }
  EmuTensor(DType t, size_t n) : EmuTensor(t, std::vector<double>(n, NAN)) {}  // poisoned
  void* data() { return dtype == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(b16.data()); }
  std::vector<double> values() const {
    std::vector<double> v;
    if (dtype == DType::F32) v.assign(f32.begin(), f32.end());
    else
      for (const auto& x : b16) v.push_back(__bfloat162float(x));
    return v;
  }
};

// fwd and bwd of the emulated kernels on packed qkv (B,T,3,H,D); returns out, lse, dqkv.
Result run_emulated(EmuImpl impl, const std::vector<double>& qkv_v, const std::vector<double>& dout_v, const Shape5& s,
                    bool causal) {
  const DType dt = emu_fp32(impl) ? DType::F32 : DType::BF16;
  EmuTensor qkv(dt, qkv_v), dout(dt, dout_v), out(dt, dout_v.size()), dqkv(dt, qkv_v.size());
  std::vector<float> lse(s.B * s.H * s.T, NAN), delta(s.B * s.H * s.T, NAN);
  fe::FlashParams p;
  p.dtype = dt;
  p.batch = int(s.B), p.seq = int(s.T), p.heads = int(s.H), p.head_dim = int(s.D);
  p.scale = float(1.0 / std::sqrt(double(s.D)));
  p.causal = causal;
  const int64_t hd = s.H * s.D, el = int64_t(dtype_size(dt));
  const fe::Strides packed{s.T * 3 * hd, 3 * hd, s.D}, rows{s.T * hd, hd, s.D};
  char* base = static_cast<char*>(qkv.data());
  char* dbase = static_cast<char*>(dqkv.data());
  p.q = base, p.k = base + hd * el, p.v = base + 2 * hd * el;
  p.dq = dbase, p.dk = dbase + hd * el, p.dv = dbase + 2 * hd * el;
  p.q_strides = p.k_strides = p.v_strides = p.dq_strides = p.dk_strides = p.dv_strides = packed;
  p.o = out.data(), p.dout = dout.data();
  p.o_strides = p.dout_strides = rows;
  p.lse = lse.data(), p.delta = delta.data();

  const unsigned bh = unsigned(s.B * s.H);
  auto tiles = [&](int rows_per_tile) { return unsigned((s.T + rows_per_tile - 1) / rows_per_tile); };
  auto by_head_dim = [&](auto run) {  // the launchers' choice of compiled head dim
    if (emu_tensor_core(impl)) {
      if (s.D <= 16) run(std::integral_constant<int, 16>{});
      else if (s.D <= 32) run(std::integral_constant<int, 32>{});
      else if (s.D <= 64) run(std::integral_constant<int, 64>{});
      else if (s.D <= 80) run(std::integral_constant<int, 80>{});
      else if (s.D <= 96) run(std::integral_constant<int, 96>{});
      else run(std::integral_constant<int, 128>{});
    } else {
      if (s.D <= 32) run(std::integral_constant<int, 32>{});
      else if (s.D <= 64) run(std::integral_constant<int, 64>{});
      else run(std::integral_constant<int, 128>{});
    }
  };
  by_head_dim([&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if (emu_tensor_core(impl)) {
      using F1 = fe::FwdTraits<kD, 1>;
      using F2 = fe::FwdTraits<kD, 2>;
      using Kv = fe::BwdKvTraits<kD>;
      using Q = fe::BwdQTraits<kD>;
      // The forward with two m tiles per warp (128 queries per CTA) must give the same bits as
      // with one (same products over the same key tiles in the same order, per row); both
      // write into poisoned outputs.
      fe::emulate_launch(fe::flash_fwd_mma_kernel<F1>, dim3(bh, tiles(F1::kBlockM)), F1::kThreads, F1::kSmemBytes, p);
      const std::vector<double> out1 = out.values();
      const std::vector<float> lse1 = lse;
      const EmuTensor poison(dt, dout_v.size());
      std::copy(poison.b16.begin(), poison.b16.end(), out.b16.begin());
      std::fill(lse.begin(), lse.end(), NAN);
      fe::emulate_launch(fe::flash_fwd_mma_kernel<F2>, dim3(bh, tiles(F2::kBlockM)), F2::kThreads, F2::kSmemBytes, p);
      EXPECT_TRUE(out.values() == out1 && std::memcmp(lse.data(), lse1.data(), lse.size() * sizeof(float)) == 0)
          << "forward with 128 and with 64 query rows per CTA differ";
      // Chunked: 2 streamed tiles per chunk, so every longer tile is cut (flash_bwd_mma.cu's
      // launch); the first chunk must write over the NaNs, the delta kernel zero the counters.
      fe::FlashParams b = p;
      std::vector<float> accum;
      std::vector<int> turns;
      unsigned kv_chunks = 1, q_chunks = 1;
      if (impl == EmuImpl::TensorCoreBf16Chunked) {
        const int64_t n_kv = tiles(Kv::kBlockM), n_q = tiles(Q::kBlockM), kv_floats = bh * n_kv * 2 * Kv::kBlockM * kD;
        accum.assign(size_t(kv_floats + bh * n_q * Q::kBlockM * kD), NAN);
        turns.assign(size_t(bh * (n_kv + n_q)), 7);
        b.kv_chunk = b.q_chunk = 2;
        b.kv_accum = accum.data(), b.q_accum = accum.data() + kv_floats;
        b.kv_turns = turns.data(), b.q_turns = turns.data() + bh * n_kv, b.turn_count = int64_t(turns.size());
        kv_chunks = (tiles(Kv::kBlockN) + 1) / 2, q_chunks = (tiles(Q::kBlockN) + 1) / 2;
      }
      // Fused: flash_bwd_mma.cu's launch with its traits, on a NaN-filled accumulator that the
      // delta kernel must zero.
      const bool fused = fe::fused_head_dim(kD) != 0 && impl == EmuImpl::TensorCoreBf16Fused;
      auto with_fused = [&](auto run) {
        if constexpr (fe::fused_head_dim(kD) != 0) fe::with_fused_traits<fe::fused_head_dim(kD)>(causal, run);
      };
      if (fused)
        with_fused([&](auto traits) {
          using F = decltype(traits);
          accum.assign(size_t(bh * tiles(F::kBlockN) * F::kBlockN * F::kHeadDim), NAN);
          b.dq_atomic = true, b.dq_atomic_floats = int64_t(accum.size()), b.dq_accum = accum.data();
        });
      fe::emulate_launch(fe::flash_bwd_delta_kernel<fe::bf16>, dim3(2, s.B), 64, 0, b);
      if (fused)
        with_fused([&](auto traits) {
          using F = decltype(traits);
          fe::emulate_launch(fe::flash_bwd_fused_mma_kernel<F>, dim3(bh, tiles(F::kBlockM)), F::kThreads, F::kSmemBytes,
                             b);
          fe::emulate_launch(fe::flash_bwd_dq_convert_mma_kernel<F>, dim3(tiles(F::kBlockN), bh), F::kThreads,
                             F::kConvertSmemBytes, b);
        });
      if (!fused) {
        fe::emulate_launch(fe::flash_bwd_dkdv_mma_kernel<Kv>, dim3(bh, tiles(Kv::kBlockM), kv_chunks), Kv::kThreads,
                           Kv::kSmemBytes, b);
        fe::emulate_launch(fe::flash_bwd_dq_mma_kernel<Q>, dim3(bh, tiles(Q::kBlockM), q_chunks), Q::kThreads,
                           Q::kSmemBytes, b);
      }
      if constexpr (kD == 64) {
        if (impl == EmuImpl::TensorCoreBf16) {
          // Two m tiles per warp (128 keys or queries per CTA, 32-row streamed tiles) must give
          // the bits of one: the same products over the same rows in the same order.
          using Kv2 = fe::BwdKvTraits<kD, 2>;
          using Q2 = fe::BwdQTraits<kD, 2>;
          const std::vector<double> dqkv1 = dqkv.values();
          const EmuTensor poison_grad(dt, qkv_v.size());
          std::copy(poison_grad.b16.begin(), poison_grad.b16.end(), dqkv.b16.begin());
          fe::emulate_launch(fe::flash_bwd_dkdv_mma_kernel<Kv2>, dim3(bh, tiles(Kv2::kBlockM)), Kv2::kThreads,
                             Kv2::kSmemBytes, p);
          fe::emulate_launch(fe::flash_bwd_dq_mma_kernel<Q2>, dim3(bh, tiles(Q2::kBlockM)), Q2::kThreads,
                             Q2::kSmemBytes, p);
          EXPECT_TRUE(dqkv.values() == dqkv1) << "backward with 128 and with 64 rows per CTA differ";
        }
      }
    } else if constexpr (kD == 32 || kD == 64 || kD == 128) {  // the CUDA-core head dims
      using Tr = fe::SimtTraits<kD>;
      auto launch = [&](auto e) {
        using E = decltype(e);
        const dim3 grid(bh, tiles(Tr::kBlockM));
        fe::emulate_launch(fe::flash_fwd_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kFwdSmemBytes, p);
        if (emu_fused(impl)) {  // flash_simt.cu's fused launch: the first turn must write over the NaNs,
                                // and the delta kernel zero the counters
          const int rows = int(tiles(64)) * 64, counters_per_head = int(tiles(32));
          std::vector<float> accum(size_t(bh) * rows * kD, NAN);
          std::vector<int> counters(size_t(bh) * counters_per_head, 7);
          fe::FlashParams f = p;
          f.dq_accum = accum.data(), f.dq_counters = counters.data();
          f.dq_accum_rows = rows, f.dq_counter_stride = counters_per_head;
          fe::emulate_launch(fe::flash_bwd_delta_kernel<E>, dim3(2, s.B), 64, 0, f);
          fe::emulate_launch(fe::flash_bwd_dkdv_simt_kernel<Tr, E, true>, grid, Tr::kThreads, Tr::kBwdKvSmemBytes, f);
          fe::emulate_launch(fe::flash_bwd_dq_convert_simt_kernel<Tr, E>, dim3((s.T * kD / 4 + 63) / 64, bh), 64, 0, f);
          return;
        }
        fe::emulate_launch(fe::flash_bwd_delta_kernel<E>, dim3(2, s.B), 64, 0, p);
        fe::emulate_launch(fe::flash_bwd_dkdv_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kBwdKvSmemBytes, p);
        fe::emulate_launch(fe::flash_bwd_dq_simt_kernel<Tr, E>, grid, Tr::kThreads, Tr::kBwdQSmemBytes, p);
      };
      if (dt == DType::F32) launch(float{});
      else launch(fe::bf16{});
    }
  });
  return {out.values(), std::vector<double>(lse.begin(), lse.end()), dqkv.values()};
}

// Values a bf16 tensor holds exactly (so the fp64 reference sees the kernel's inputs).
std::vector<double> bf16_values(std::mt19937_64& rng, int64_t n) {
  std::vector<double> v = random_values(rng, n);
  for (double& x : v) x = __bfloat162float(__float2bfloat16_rn(float(x)));
  return v;
}

// max |a - b| / max |b|; NaN (an element never written) fails.
double emu_error(const std::vector<double>& a, const std::vector<double>& b) {
  const double e = max_abs_diff(a, b);
  return std::isfinite(e) ? e / std::max(max_abs(b), 1e-30) : INFINITY;
}

double storage_error(const std::vector<double>& ref, bool bf16) {
  double m = 0;
  for (double x : ref)
    m = std::max(m, std::fabs((bf16 ? double(__bfloat162float(__float2bfloat16_rn(float(x)))) : double(float(x))) - x));
  return m;
}

class FlashKernelsEmulated : public ::testing::TestWithParam<std::tuple<EmuImpl, Shape5, bool>> {};

std::string emu_test_name(const ::testing::TestParamInfo<std::tuple<EmuImpl, Shape5, bool>>& info) {
  std::string impl = emu_name(std::get<0>(info.param));
  for (char& ch : impl) ch = ch == ' ' || ch == '-' ? '_' : ch;
  return impl + "_" + shape_name(std::get<1>(info.param), std::get<2>(info.param));
}

TEST_P(FlashKernelsEmulated, MatchFp64Reference) {
  const EmuImpl impl = std::get<0>(GetParam());
  const Shape5 s = std::get<1>(GetParam());
  const bool causal = std::get<2>(GetParam());
  std::mt19937_64 rng(99);
  const std::vector<double> qkv = bf16_values(rng, s.B * s.T * 3 * s.H * s.D),
                            dout = bf16_values(rng, s.B * s.T * s.H * s.D);
  const Result ref = run_naive<double>(qkv, dout, s, causal);
  const Result got = run_emulated(impl, qkv, dout, s, causal);
  // Wrong indexing gives errors of order 1; fp32 lands near 1e-6 and bf16 near 1e-2.
  const double tol = emu_fp32(impl) ? 2e-5 : 3e-2;
  std::ostringstream what;
  what << emu_name(impl) << " " << shape_name(s, causal);
  EXPECT_LT(emu_error(got.out, ref.out), tol) << what.str() << " out";
  EXPECT_LT(emu_error(got.lse, reference_lse(qkv, s, causal)), emu_fp32(impl) ? 1e-6 : 1e-5) << what.str() << " L";
  for (int which = 0; which < 3; ++which)
    EXPECT_LT(emu_error(part(got.dqkv, s, which), part(ref.dqkv, s, which)), tol) << what.str() << " d"
                                                                                  << "qkv"[which];

  // The 2x rule of the GPU test (tests/cuda/test_flash_attn.cpp), previewed on the emulation.
  const bool bf16 = !emu_fp32(impl);
  const Result naive = naive_low_precision(qkv, dout, s, causal, bf16);
  const double l_term = std::ldexp(1.0, -24) * max_abs(ref.lse.empty() ? reference_lse(qkv, s, causal) : ref.lse);
  auto rule = [&](const std::vector<double>& g, const std::vector<double>& n, const std::vector<double>& r,
                  const char* name, bool gradient) {
    const double err = max_abs_diff(g, r), naive_err = max_abs_diff(n, r);
    EXPECT_LE(err, 2 * naive_err + 2 * storage_error(r, bf16) + (gradient ? 2 * l_term * max_abs(r) : 0.0))
        << what.str() << ": " << name << " error " << err << ", naive same-precision error " << naive_err;
  };
  rule(got.out, naive.out, ref.out, "out", false);
  const char* names[] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which)
    rule(part(got.dqkv, s, which), part(naive.dqkv, s, which), part(ref.dqkv, s, which), names[which], true);
}

// Small shapes (the emulation is slow): T below, at and across the tiles (CUDA-core 64 x 64,
// 64 x 32 at head dim 128; tensor-core 64, and 128 queries in the forward), head dims that are
// and are not compiled (88 runs zero-padded in 96; 80 is compiled for tensor cores, padded
// to 128 on CUDA cores), B, H > 1.
const Shape5 kEmuShapes[] = {
    {1, 37, 2, 16, 0, 0}, {2, 33, 2, 32, 0, 0},  {1, 70, 1, 64, 0, 0},  {2, 20, 1, 80, 0, 0},
    {1, 30, 1, 88, 0, 0}, {1, 40, 1, 128, 0, 0}, {1, 150, 1, 64, 0, 0},
};

INSTANTIATE_TEST_SUITE_P(Kernels, FlashKernelsEmulated,
                         ::testing::Combine(::testing::Values(EmuImpl::TensorCoreBf16, EmuImpl::SimtFp32,
                                                              EmuImpl::SimtBf16),
                                            ::testing::ValuesIn(kEmuShapes), ::testing::Bool()),
                         emu_test_name);

// The hand-offs in turns over several tiles (under causal masking too; the first turn writing
// into a NaN accumulator; B x H > 1: the counters and rows of each head): the CUDA-core fused
// dQ (64 keys x 64 queries at head dims 32, 64; 64 x 32 at 128) and the tensor-core chunks (2
// streamed tiles per chunk: 64 rows, 32 at head dims above 64; up to 2 chunks per tile).
const Shape5 kTurnShapes[] = {
    {1, 140, 2, 64, 0, 0},
    {2, 100, 1, 32, 0, 0},
    {1, 100, 1, 80, 0, 0},
    {1, 20, 1, 16, 0, 0},
};

INSTANTIATE_TEST_SUITE_P(FusedDq, FlashKernelsEmulated,
                         ::testing::Combine(::testing::Values(EmuImpl::SimtFp32Fused, EmuImpl::SimtBf16Fused),
                                            ::testing::ValuesIn(kTurnShapes), ::testing::Bool()),
                         emu_test_name);
// The fused tensor-core backward (128 keys x query tiles of 128 at head dims 32 (causal), 48
// (padded to 64) and 64, of 64 at 32 without a mask (two CTAs per SM), 96 and 120 (padded to
// 128)): several key and query tiles, partial ones, the rotation of the non-causal visits (3
// key tiles over 10 query tiles wrap around), a padded head dim, B x H > 1 (each head's
// accumulator tiles).
const Shape5 kFusedShapes[] = {
    {1, 300, 1, 128, 0, 0}, {2, 50, 1, 120, 0, 0}, {1, 140, 2, 64, 0, 0}, {1, 20, 1, 48, 0, 0},  {1, 150, 1, 32, 0, 0},
    {1, 200, 2, 24, 0, 0},  {1, 70, 2, 96, 0, 0},  {1, 300, 1, 64, 0, 0}, {1, 130, 2, 80, 0, 0},
};
INSTANTIATE_TEST_SUITE_P(Fused, FlashKernelsEmulated,
                         ::testing::Combine(::testing::Values(EmuImpl::TensorCoreBf16Fused),
                                            ::testing::ValuesIn(kFusedShapes), ::testing::Bool()),
                         emu_test_name);
INSTANTIATE_TEST_SUITE_P(Chunked, FlashKernelsEmulated,
                         ::testing::Combine(::testing::Values(EmuImpl::TensorCoreBf16Chunked),
                                            ::testing::ValuesIn(kTurnShapes), ::testing::Bool()),
                         emu_test_name);

// The emulator itself: a thread that throws ends the launch with its exception (the others, at a
// barrier it never reaches, are left), and threads waiting at a barrier others never reach end
// it with an error rather than a hang; a launch after either runs as usual.
struct EmuProbe {
  int* out;
  int thrower;  // the thread that throws, or -1
  int leavers;  // threads that return before the barrier
};
void emu_probe_kernel(const EmuProbe p) {
  const int t = int(threadIdx.x);
  if (t == p.thrower) throw std::runtime_error("thread " + std::to_string(t) + " threw");
  if (t < p.leavers) return;
  fe::smem[t] = 1;
  __syncthreads();
  int sum = 0;  // every thread's write, seen after the barrier
  for (int i = 0; i < int(blockDim.x); ++i) sum += fe::smem[i];
  p.out[blockIdx.x * blockDim.x + t] = sum;
}

TEST(FlashEmulator, ThrowingThreadAndMissedBarrierEndTheLaunch) {
  std::vector<int> out(2 * 64, 0);
  EXPECT_THROW(
      {
        try {
          fe::emulate_launch(emu_probe_kernel, dim3(2), 64, 64, EmuProbe{out.data(), 37, 0});
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "thread 37 threw");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_THROW(fe::emulate_launch(emu_probe_kernel, dim3(2), 64, 64, EmuProbe{out.data(), -1, 32}), std::runtime_error);
  fe::emulate_launch(emu_probe_kernel, dim3(2), 64, 64, EmuProbe{out.data(), -1, 0});
  for (int v : out) EXPECT_EQ(v, 64);
}

}  // namespace
}  // namespace llmhpc::test
#endif  // LLMHPC_WITH_CUDA

// Mode attention: naive attention against FlashAttention-2, forward and backward, over a sweep of
// batch sizes x heads x head dims x sequence lengths x causal x precisions x implementations (the
// reference attention study's two tables: PyTorch attention and FlashAttention-2). Each
// configuration allocates its own inputs (random, seeded) and runs the backend's attention op
// (kernels/ops.h) `--warmup` times untimed, then `--iters` times timed with device events: forward,
// backward and the two end to end. The device allocator's peak during the configuration is its
// memory. An out-of-memory is recorded as status "oom" and the sweep goes on. Records:
// /attention/<label>, one per configuration, on every rank.
#include <algorithm>
#include <cmath>
#include <limits>

#include "src/core/stats.h"
#include "src/core/units.h"
#include "src/modes/options.h"
#include "src/modes/sweep.h"

namespace llmhpc {
namespace {

struct AttentionCase {
  int64_t batch, heads, head_dim, seq;
  bool causal;
  Precision precision;
  AttentionKind impl;

  std::string label() const {
    return std::string(attention_name(impl)) + "_" + precision_name(precision) + "_B" + std::to_string(batch) + "_H" +
           std::to_string(heads) + "_T" + std::to_string(seq) + "_D" + std::to_string(head_dim) +
           (causal ? "_causal" : "_full");
  }
  AttentionDims dims() const { return {batch, seq, heads, head_dim, causal, impl}; }
  // FLOPs of the two matrix products of the forward (Q K^T and P V), counting only the
  // visible part of the score matrix under causal; the backward does 2.5 times as much
  // (five products), FlashAttention's convention (its recomputation not counted).
  double flops_forward() const {
    const double visible = causal ? double(seq) * double(seq + 1) / 2.0 : double(seq) * double(seq);
    return 4.0 * double(batch) * double(heads) * visible * double(head_dim);
  }
};

std::vector<bool> causal_values(const po::variables_map& vm) {
  std::vector<bool> out;
  for (const std::string& c : split_list(opt_string(vm, "causal"), "causal")) {
    require_choice(c, {"on", "off"}, "causal");
    out.push_back(c == "on");
  }
  return out;
}

std::vector<int64_t> positive_list(const po::variables_map& vm, const std::string& name) {
  std::vector<int64_t> out = parse_int_list(opt_string(vm, name), name);
  for (int64_t v : out)
    if (v <= 0) throw UsageError("--" + name + " must be positive (got " + std::to_string(v) + ")");
  return out;
}

std::vector<AttentionKind> implementations(const po::variables_map& vm) {
  return opt_list(vm, "attention", [](const std::string& a) {
    require_choice(a, {"naive", "flash"}, "attention");
    return parse_attention(a);
  });
}

// Outermost first: precision, causal, batch, heads, head dim, sequence, implementation (so
// naive and flash of one shape are neighbours in the table).
std::vector<AttentionCase> sweep(const po::variables_map& vm) {
  std::vector<AttentionCase> cases;
  for (Precision p : precisions(vm))
    for (bool causal : causal_values(vm))
      for (int64_t b : positive_list(vm, "batch-size"))
        for (int64_t h : positive_list(vm, "num-heads"))
          for (int64_t d : positive_list(vm, "head-dim"))
            for (int64_t t : positive_list(vm, "context-length"))
              for (AttentionKind impl : implementations(vm)) cases.push_back({b, h, d, t, causal, p, impl});
  return cases;
}

void add_options(po::options_description& desc) {
  po::options_description a("Attention options (comma-separated lists sweep)");
  auto text = [](const char* def) { return po::value<std::string>()->default_value(def); };
  a.add_options()("batch-size", text("8"), "batch size B")("num-heads", text("1"), "attention heads H")(
      "head-dim", text("16,32,64,128"), "head dimension D")("context-length", text("256,1024,4096"),
                                                            "sequence length T")(
      "causal", po::value<std::string>()->default_value("off")->implicit_value("on"),
      "causal mask: on | off | on,off (--causal alone means on; give a list as --causal=on,off)")(
      "precision", text("fp32"),
      "fp32 | bf16 (on the CPU computed in fp32 on bf16 values: for checking, not speed) | fp64 (CPU "
      "reference)")("attention", text("naive,flash"), "naive | flash")(
      "warmup", text("5"), "untimed forward+backward iterations first (recorded apart)")(
      "steps", text("20"), "timed forward+backward iterations");
  desc.add(a);
}

// Everything attention takes from the command line, parsed and checked once by parse_options
// before any file or device is touched; run() reads only this.
struct AttentionOptions {
  int64_t warmup = 0, iters = 0;
  std::vector<AttentionCase> cases;
  std::vector<Precision> precisions;  // --precision, as listed
  uint64_t seed = 0;
};

AttentionOptions parse_options(const po::variables_map& vm, int) {
  AttentionOptions o;
  o.warmup = opt_nonnegative(vm, "warmup");
  o.iters = opt_positive(vm, "steps");
  o.cases = sweep(vm);
  o.precisions = precisions(vm);
  o.seed = uint64_t(opt_int(vm, "seed"));
  return o;
}

struct Samples {
  std::vector<double> forward, backward, total;
  void record(Record& r, const std::string& prefix) const {
    r.add(prefix + "forward_ms", forward);
    r.add(prefix + "backward_ms", backward);
    r.add(prefix + "total_ms", total);
  }
};

// Forward then backward, one timer mark before, between and after; waits for the device
// once, after the last mark.
void timed_iteration(Ops& ops, Timer& timer, const AttentionDims& d, const Tensor& qkv, const Tensor& out,
                     const Tensor& saved, const Tensor& dout, const Tensor& dqkv, Samples& s) {
  timer.mark(0);
  ops.attention_forward(out, saved, qkv, d);
  timer.mark(1);
  ops.attention_backward(dqkv, dout, out, saved, qkv, d);
  timer.mark(2);
  s.total.push_back(timer.elapsed_ms(0, 2));
  s.forward.push_back(timer.elapsed_ms(0, 1));
  s.backward.push_back(timer.elapsed_ms(1, 2));
}

void run(ModeContext& ctx, const AttentionOptions& o) {
  const int64_t warmup = o.warmup, iters = o.iters;
  const std::vector<AttentionCase>& cases = o.cases;
  Device& dev = *ctx.backend.device;
  Ops& ops = *ctx.backend.ops;
  const uint64_t seed = o.seed;

  // What the backend cannot run at all is an error before anything starts.
  collective_check(ctx.rt, [&] {
    for (const AttentionCase& c : cases) {
      if (c.precision == Precision::FP64 && dev.kind() == DeviceKind::Cuda)
        throw UsageError("--precision fp64 is the CPU reference: use --device cpu");
      ops.attention_saved({1, 1, 1, c.head_dim, c.causal, c.impl}, compute_dtype(c.precision));
    }
  });
  note_cpu_bf16(ctx, o.precisions);

  log_root(ctx.rt, "attention: %zu configuration(s), %lld warm-up + %lld timed iterations, %d rank(s) on %s\n",
           cases.size(), (long long)warmup, (long long)iters, ctx.rt.world_size, dev.name().c_str());
  Sweep sweep(ctx, "attention", cases.size(),
              {"impl", "prec", "B", "H", "D", "T", "causal", "Fwd ms", "Bwd ms", "Total ms", "Fwd TFLOP/s",
               "Bwd TFLOP/s", "Peak MiB", "status"});
  auto timer = dev.make_timer(3);
  TracingAllocator& alloc = dev.allocator();
  for (const AttentionCase& c : cases) {
    const AttentionDims d = c.dims();
    const DType cd = compute_dtype(c.precision);
    Record rec;
    rec.group = "attention/" + c.label();
    rec.attr("impl", std::string(attention_name(c.impl)))
        .attr("precision", std::string(precision_name(c.precision)))
        .attr("dtype", std::string(dtype_name(cd)))
        .attr("batch", c.batch)
        .attr("heads", c.heads)
        .attr("head_dim", c.head_dim)
        .attr("seq", c.seq)
        .attr("causal", int64_t(c.causal ? 1 : 0))
        .attr("warmup", warmup)
        .attr("iters", iters)
        .attr("flops_forward", c.flops_forward())
        .attr("flops_backward", 2.5 * c.flops_forward());
    Samples warm, timed;
    const int64_t live_before = alloc.live_bytes();
    alloc.reset_peak();
    const SweepStatus status = sweep.run(
        c.label(), rec,
        [&] {
          for (const auto& [name, value] : ops.attention_variant(d, cd)) rec.attr(name, value);
          const SavedSpec spec = ops.attention_saved(d, cd);
          const int64_t B = c.batch, T = c.seq, HD = c.heads * c.head_dim;
          Buffer qkv(alloc, cd, {B, T, 3 * HD}, "attention.qkv"), dout(alloc, cd, {B, T, HD}, "attention.dout");
          Buffer out(alloc, cd, {B, T, HD}, "attention.out"), dqkv(alloc, cd, {B, T, 3 * HD}, "attention.dqkv");
          Buffer saved(alloc, spec.dtype, spec.shape,
                       c.impl == AttentionKind::Flash ? "attention.logsumexp" : "attention.probs");
          rec.attr("saved_bytes", int64_t(spec.shape.numel() * int64_t(dtype_size(spec.dtype))));  // as allocated
          // Normal(0, 1) values, counter-based: the same on every rank and device.
          const double unbounded = std::numeric_limits<double>::infinity();
          ops.random_normal(qkv, seed, 1, 1.0, unbounded);
          ops.random_normal(dout, seed, 2, 1.0, unbounded);
          auto record_iterations = [&](Record& r) {
            timed.record(r, "");
            if (warmup > 0) warm.record(r, "warmup_");
          };
          SweepSteps progress(sweep, rec, warmup + iters, "iterations", [&](Record& r) {
            record_iterations(r);
            keep_timed_steps(r, int64_t(timed.total.size()), iters);
          });
          for (int64_t k = 0; k < warmup; ++k) {
            timed_iteration(ops, *timer, d, qkv, out, saved, dout, dqkv, warm);
            progress.done();
          }
          for (int64_t k = 0; k < iters; ++k) {
            timed_iteration(ops, *timer, d, qkv, out, saved, dout, dqkv, timed);
            progress.done();
          }
          record_iterations(rec);
          return "fwd " + fmt(median(timed.forward), 3) + " ms, bwd " + fmt(median(timed.backward), 3) + " ms";
        },
        [&](Record& r) {
          r.attr("peak_memory_bytes", alloc.peak_bytes() - live_before).attr("baseline_memory_bytes", live_before);
        });
    const double fwd = median(timed.forward), bwd = median(timed.backward), total = median(timed.total);
    auto tflops = [](double flops, double ms) { return ms > 0 ? fmt(flops / (ms * 1e9), 2) : std::string("-"); };
    sweep.add_row({attention_name(c.impl), precision_name(c.precision), std::to_string(c.batch),
                   std::to_string(c.heads), std::to_string(c.head_dim), std::to_string(c.seq), c.causal ? "yes" : "no",
                   fmt(fwd, 3), fmt(bwd, 3), fmt(total, 3), tflops(c.flops_forward(), fwd),
                   tflops(2.5 * c.flops_forward(), bwd),
                   fmt(double(alloc.peak_bytes() - live_before) / (1024.0 * 1024.0), 1), status.column()});
  }
  sweep.print_summary("attention summary (median ms of " + std::to_string(iters) + " iterations, rank 0 of " +
                      std::to_string(ctx.rt.world_size) + "; raw times in " + ctx.out_dir + "):");
}

}  // namespace

ModeSpec attention_mode() {
  return {"attention",
          "naive vs FlashAttention-2: forward/backward time and peak memory over a sweep",
          add_options,
          [](const po::variables_map& vm, int world_size) -> ModeRun {
            const AttentionOptions options = parse_options(vm, world_size);
            return [options](ModeContext& ctx) { run(ctx, options); };
          },
          {{"batch", "batch-size"},
           {"heads", "num-heads"},
           {"seq", "context-length"},
           {"impl", "attention"},
           {"iters", "steps"}}};
}

}  // namespace llmhpc

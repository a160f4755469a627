#!/usr/bin/env python3
"""PyTorch on the same GPU, the same model and the same timing as `llmhpc --mode bench`.

The model is llmhpc's TransformerLM (the architecture and names of tests/reference/torch_model.py),
written here for speed rather than for exact reference arithmetic: RoPE tables built once on
the device, the causal mask from SDPA or a cached buffer. Setups, from weakest to strongest:

  eager     naive attention (matmul, mask, softmax, matmul), torch.optim.AdamW defaults
  compiled  torch.compile of each block (one compiled graph reused by all layers), fused
            attention (F.scaled_dot_product_attention, is_causal), AdamW(fused=True)
  graphs    as compiled, but the whole model compiled with mode="reduce-overhead": forward and
            backward replayed from CUDA graphs (PyTorch's answer to launch-bound steps, beside
            `llmhpc --cuda-graph`)

Precision fp32, or bf16 as autocast does it (fp32 master weights). Every step is timed with
CUDA events: forward (with the loss), backward, optimizer (zero_grad(set_to_none=True) before
forward, untimed, so that no gradients are live during forward); warm-up steps
apart; one synchronize per step. With --trace, as many steps again run under torch.profiler
(CUDA activities: Kineto tracing kernels through CUPTI, as `llmhpc --mode profile` does), the
untraced steps split half before and half after them, as that mode does, for its overhead
beside llmhpc's ("traced_step_ms", "traced_kernels_per_step"). Out-of-memory is recorded as
status "oom" and the sweep goes on. Results: one JSON object per configuration, appended to --out (JSON lines).

    python3 analysis/torch_baseline.py --model small,medium --context-length 128,512 \
        --precision fp32,bf16 --setup eager,compiled --out torch.jsonl
    python3 analysis/torch_baseline.py --ceilings --out torch.jsonl    # GEMM and copy rates (burst)
    python3 analysis/torch_baseline.py --ceilings --sustain-s 20 --out torch.jsonl  # and bf16 at the settled clock
    python3 analysis/torch_baseline.py --model small --precision bf16 --trace --out torch.jsonl

analysis/model_bench.py puts these next to an llmhpc bench run.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from statistics import median

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # run as a script: say so plainly; imported (torch_ddp.py checks first): as is
    if __name__ == "__main__":
        raise SystemExit(f"torch_baseline.py: error: PyTorch is needed ({e})")
    raise

PRESETS = {  # d_model, d_ff, num_layers, num_heads (llmhpc's presets, src/model/config.cpp)
    "tiny": (512, 1344, 4, 16), "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32),
}


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).to(dtype)


def rope(x, cos, sin):
    """x (B, H, T, D); interleaved pairs rotated by the cached angles (T, D/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, d, heads, fused):
        super().__init__()
        self.heads, self.head_dim, self.fused = heads, d // heads, fused
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        # -1 heads: all of them, or under tensor parallelism (analysis/torch_tp.py) this rank's share, whose
        # projections give it n_heads / tp heads of head_dim each
        split = lambda y: y.view(b, t, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = rope(split(self.q_proj(x)), cos, sin), rope(split(self.k_proj(x)), cos, sin), split(self.v_proj(x))
        if self.fused:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            o = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.output_proj(o.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, d, d_ff, heads, fused):
        super().__init__()
        self.ln1, self.attn, self.ln2 = RMSNorm(d), Attention(d, heads, fused), RMSNorm(d)
        self.w1, self.w2, self.w3 = nn.Linear(d, d_ff, bias=False), nn.Linear(d_ff, d, bias=False), nn.Linear(d, d_ff, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        h = self.ln2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d, d_ff, layers, heads, fused):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, d_ff, heads, fused) for _ in range(layers))
        self.ln_final, self.lm_head = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.head_dim = d // heads
        with torch.no_grad():  # llmhpc's initialisation (src/model/transformer.h, init_parameters)
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    std = 1.0 if "embeddings" in name else math.sqrt(2.0 / sum(p.shape))
                    nn.init.trunc_normal_(p, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        inv = 10000.0 ** (-torch.arange(0, self.head_dim, 2, device=tokens.device, dtype=torch.float32) / self.head_dim)
        angle = torch.arange(t, device=tokens.device, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = angle.cos(), angle.sin()
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.ln_final(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def bench_one(size, ctx, batch, precision, setup, warmup, steps, vocab, trace=False, clip_grad_norm=0.0, heat_s=0.0):
    d, d_ff, layers, heads = PRESETS[size]
    rec = dict(tool="pytorch", model=size, d_model=d, d_ff=d_ff, num_layers=layers, num_heads=heads,
               context_length=ctx, batch_size=batch, precision=precision, setup=setup, warmup=warmup, steps=steps,
               clip_grad_norm=clip_grad_norm, torch_version=torch.__version__,
               device_name=torch.cuda.get_device_name())
    compiled = setup in ("compiled", "graphs")
    model = opt = None
    try:
        torch.cuda.reset_peak_memory_stats()
        model = TransformerLM(vocab, d, d_ff, layers, heads, fused=compiled).cuda()
        if setup == "graphs":
            model.compile(mode="reduce-overhead")
        elif compiled:
            for block in model.layers:
                block.compile()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=compiled or None)
        tokens = torch.randint(0, vocab, (batch, ctx), device="cuda")
        targets = torch.randint(0, vocab, (batch, ctx), device="cuda")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        times = {k: [] for k in ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")}

        def run(n, into):
            for _ in range(n):
                # Gradients freed before forward (the usual loop's first line): the previous step's
                # gradients never sit beside this step's activations, PyTorch's lowest peak.
                opt.zero_grad(set_to_none=True)
                if setup == "graphs":
                    torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten
                ev[0].record()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = model(tokens, targets)
                ev[1].record()
                loss.backward()
                ev[2].record()
                if clip_grad_norm > 0:  # timed with the optimizer, as llmhpc times its clipping
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
                opt.step()
                ev[3].record()
                torch.cuda.synchronize()
                if into is not None:
                    into["forward_ms"].append(ev[0].elapsed_time(ev[1]))
                    into["backward_ms"].append(ev[1].elapsed_time(ev[2]))
                    into["optimizer_ms"].append(ev[2].elapsed_time(ev[3]))
                    into["step_ms"].append(ev[0].elapsed_time(ev[3]))

        t0 = time.time()
        run(warmup, None)
        heated = time.time()
        while time.time() - heated < heat_s:  # llmhpc's --heat-s: timed at the clocks the GPU holds under load
            run(1, None)
        rec.update(heat_s=heat_s)
        if not trace:
            run(steps, times)
        else:
            traced = {k: [] for k in times}
            run(steps // 2, times)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                run(steps, traced)
            run(steps - steps // 2, times)
            try:  # the kernels Kineto recorded (its event list's API has moved between versions)
                kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / steps
            except Exception:  # noqa: BLE001
                kernels = None
            rec.update(traced_step_ms=traced["step_ms"], traced_kernels_per_step=kernels)
        rec.update(times, status="ok", peak_memory_bytes=torch.cuda.max_memory_allocated(), wall_s=time.time() - t0)
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="oom", error=str(e).splitlines()[0], peak_memory_bytes=torch.cuda.max_memory_allocated())
    finally:
        del model, opt
        torch.cuda.empty_cache()
        torch._dynamo.reset()
    return rec


def ceilings(sustain_s=0.0):
    """The GPU's measured rates: bf16 and fp32/tf32 GEMM (8192^3, random data) and copy bandwidth,
    each over a burst of ten products or copies, at whatever clock the GPU starts at; with
    sustain_s, also the bf16 GEMM rate kept up for that long (gemm_bf16_sustained_tflops: the
    median of its second half's batches), at the clock a GPU at full load settles to under its
    power cap, as a long model step runs."""
    out = dict(tool="ceilings", device_name=torch.cuda.get_device_name())

    def timed(fn, reps=10):
        for _ in range(3):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / reps / 1e3

    n = 8192
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp32", torch.float32, False), ("tf32", torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x, y = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        out[f"gemm_{name}_tflops"] = 2 * n**3 / timed(lambda: x @ y) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    out["copy_tb_per_s"] = 2 * src.numel() / timed(lambda: dst.copy_(src)) / 1e12
    if sustain_s > 0:
        del src, dst
        x, y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        rates, start = [], time.time()
        while time.time() - start < sustain_s:
            rates.append(2 * n**3 / timed(lambda: x @ y, reps=20) / 1e12)
        out["gemm_bf16_sustained_tflops"] = statistics.median(rates[len(rates) // 2:])
        out["sustain_s"] = sustain_s
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small,medium,large,xl,2.7B")
    p.add_argument("--context-length", default="128")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--precision", default="fp32,bf16")
    p.add_argument("--setup", default="eager,compiled")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab-size", type=int, default=10000)
    p.add_argument("--ceilings", action="store_true", help="only measure the GEMM and copy rates")
    p.add_argument("--sustain-s", type=float, default=0,
                   help="with --ceilings: also the bf16 GEMM rate kept up for this many seconds (the clock under "
                        "the power cap, as in a long step)")
    p.add_argument("--trace", action="store_true", help="also time --steps steps under torch.profiler (CUDA activities)")
    p.add_argument("--deadline-s", type=float, default=0,
                   help="configurations not started within this many seconds are recorded as 'not run' (0: none)")
    p.add_argument("--clip-grad-norm", type=float, default=0,
                   help="clip the gradients with torch.nn.utils.clip_grad_norm_ before each AdamW step (0: no)")
    p.add_argument("--heat-s", type=float, default=0,
                   help="as llmhpc's: run each configuration's steps untimed this many seconds after its warm-up, so "
                        "that every configuration is timed at the clocks a power-capped GPU holds under load")
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    a = p.parse_args()
    if not torch.cuda.is_available():  # everything runs on the GPU; checked before --out is opened
        print("torch_baseline.py: no CUDA GPU visible", file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as llmhpc without --tf32
    torch.backends.cudnn.allow_tf32 = False
    start = time.time()

    def one(m, c, prec, s):
        if a.deadline_s and time.time() - start > a.deadline_s:
            return dict(tool="pytorch", model=m, context_length=c, batch_size=a.batch_size, precision=prec, setup=s,
                        status="not run (deadline)")
        return bench_one(m, c, a.batch_size, prec, s, a.warmup, a.steps, a.vocab_size, a.trace, a.clip_grad_norm,
                         a.heat_s)

    records = [ceilings(a.sustain_s)] if a.ceilings else (
        one(m, int(c), prec, s)
        for s in a.setup.split(",") for prec in a.precision.split(",")
        for m in a.model.split(",") for c in a.context_length.split(","))
    with open(a.out, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
            f.flush()
            brief = {k: r[k] for k in ("model", "context_length", "precision", "setup", "status") if k in r}
            mean = sum(r["step_ms"]) / len(r["step_ms"]) if r.get("step_ms") else float("nan")
            if r.get("traced_step_ms"):
                brief["overhead"] = f"{median(r['traced_step_ms']) / median(r['step_ms']) - 1:+.1%} (medians)"
            print(json.dumps(brief), f"step {mean:.2f} ms" if r.get("status") == "ok" else
                  json.dumps({k: v for k, v in r.items() if k != "tool"}), flush=True)


if __name__ == "__main__":
    main()

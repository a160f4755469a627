#!/usr/bin/env python3
"""PyTorch's attention on the shapes llmhpc --mode attention measures, for the comparison table.

    python3 analysis/torch_attention.py --seq 4096,16384,65536 --head-dim 64,128 --precision bf16 --causal \
        --out torch_attention.json
    python3 analysis/attention.py LLMHPC_RUN_DIR --torch torch_attention.json
    # the reference attention study's eager against torch.compile table (naive attention both ways)
    python3 analysis/torch_attention.py --batch 8 --head-dim 16,32,64,128 --seq 256,1024,4096,8192,16384 \
        --precision bf16 --impl naive,compiled --out torch_compile.json
    python3 analysis/attention.py --torch torch_compile.json

For every precision x head dim x sequence length (batch --batch, --heads heads): q, k, v
(B, H, T, D) standard normal with requires_grad, dout standard normal; `--impl fused` runs
F.scaled_dot_product_attention restricted to the FlashAttention backend (SDPBackend.
FLASH_ATTENTION; fp32, which that backend does not take, falls back to the memory-efficient
one and says so in `backend`), `--impl naive` the textbook softmax(Q K^T / sqrt(D)) V with
PyTorch ops, `--impl compiled` the same naive attention under torch.compile (default mode,
static shapes): compiled afresh for each shape by one untimed forward and backward before the
warm-up (its wall time, the compilation's, is `compile_s`), so neither the warm-up nor the
timed iterations include compiling. torch.compile may turn the pattern into a fused attention
kernel; the peak memory shows it (no T x T scores kept). After --warmup untimed iterations,
--iters timed ones; an iteration is the forward (timed with CUDA events) then out.backward(dout)
(timed likewise), with the input gradients cleared before it. Writes JSON: {"device", "torch",
"results": [{precision, batch, heads, head_dim, seq, causal, impl, backend, status, forward_ms,
backward_ms (per iteration), forward_ms_median, backward_ms_median, peak_memory_bytes, and
compile_s for compiled}]}, and prints a markdown table (median ms). An out-of-memory is
recorded as status "oom" and the sweep goes on. Needs a CUDA GPU; `--device cpu` runs the same
on the CPU (the clock times it, no peak memory), for small checks.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time


def int_list(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


IMPLS = ("fused", "naive", "compiled")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", default="64,128")
    parser.add_argument("--seq", default="4096,16384,65536")
    parser.add_argument("--precision", default="bf16", help="bf16 | fp32 (a comma-separated list sweeps)")
    parser.add_argument("--causal", action="store_true", help="causal mask (as llmhpc --causal)")
    parser.add_argument("--impl", default="fused",
                        help="fused | naive | compiled (torch.compile of naive; a comma-separated list sweeps)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (the comparison) or cpu (small checks: timed by the clock, no peak memory)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    impls = args.impl.split(",")
    if any(impl not in IMPLS for impl in impls):
        parser.error(f"--impl takes {', '.join(IMPLS)}, not '{args.impl}'")
    if any(p not in ("bf16", "fp32") for p in args.precision.split(",")):
        parser.error(f"--precision takes bf16 and fp32, not '{args.precision}'")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"torch_attention.py: error: PyTorch is needed ({e})", file=sys.stderr)
        return 2

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("torch_attention.py: no CUDA GPU visible (--device cpu runs on the CPU)", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}

    def naive(q, k, v, causal):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if causal:
            T = q.shape[-2]
            mask = torch.ones(T, T, device=q.device, dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    class Marks:
        """Three marks per iteration: CUDA events, or the clock on the CPU."""

        def __init__(self):
            self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else [0.0] * 3

        def record(self, i):
            if cuda:
                self.marks[i].record()
            else:
                self.marks[i] = time.perf_counter()

        def wait(self):
            if cuda:
                self.marks[2].synchronize()

        def ms(self, i, j):
            return self.marks[i].elapsed_time(self.marks[j]) if cuda else 1e3 * (self.marks[j] - self.marks[i])

    results = []
    for precision in args.precision.split(","):
        dtype = dtypes[precision]
        for impl in impls:
            for d in int_list(args.head_dim):
                for T in int_list(args.seq):
                    rec = dict(precision=precision, batch=args.batch, heads=args.heads, head_dim=d, seq=T,
                               causal=int(args.causal), impl=impl, status="ok", forward_ms=[], backward_ms=[])
                    if impl == "fused":
                        backends = [SDPBackend.FLASH_ATTENTION] if dtype != torch.float32 else [
                            SDPBackend.EFFICIENT_ATTENTION]
                        rec["backend"] = backends[0].name
                    else:
                        rec["backend"] = impl  # naive, or compiled: torch.compile's kernels for naive
                    attention = naive
                    if impl == "compiled":
                        # A fresh compilation per shape: static shapes, and no earlier shape's graphs to
                        # count against the recompilation limit (past it torch.compile runs eager).
                        torch._dynamo.reset()
                        attention = torch.compile(naive, dynamic=False)
                    base = 0
                    if cuda:
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    try:
                        g = torch.Generator(device=dev).manual_seed(0)
                        shape = (args.batch, args.heads, T, d)
                        q, k, v = (torch.randn(shape, device=dev, dtype=dtype, generator=g).requires_grad_()
                                   for _ in range(3))
                        dout = torch.randn(shape, device=dev, dtype=dtype, generator=g)

                        def forward():
                            if impl == "fused":
                                with sdpa_kernel(backends):
                                    return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                            return attention(q, k, v, args.causal)

                        if impl == "compiled":  # compiles forward and backward; neither warm-up nor timing sees it
                            started = time.perf_counter()
                            forward().backward(dout)
                            if cuda:
                                torch.cuda.synchronize()
                                torch.cuda.reset_peak_memory_stats()  # the peak of the iterations, as the others'
                            rec["compile_s"] = time.perf_counter() - started
                        marks = Marks()
                        for i in range(args.warmup + args.iters):
                            q.grad = k.grad = v.grad = None
                            marks.record(0)
                            out = forward()
                            marks.record(1)
                            out.backward(dout)
                            marks.record(2)
                            marks.wait()
                            if i >= args.warmup:
                                rec["forward_ms"].append(marks.ms(0, 1))
                                rec["backward_ms"].append(marks.ms(1, 2))
                            del out
                        rec["forward_ms_median"] = statistics.median(rec["forward_ms"])
                        rec["backward_ms_median"] = statistics.median(rec["backward_ms"])
                    except torch.cuda.OutOfMemoryError as e:
                        rec["status"] = "oom"
                        rec["error"] = str(e).splitlines()[0]
                    except RuntimeError as e:  # e.g. no kernel of the backend for this shape/dtype
                        rec["status"] = "error: " + (str(e).strip().splitlines() or [type(e).__name__])[0]
                    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated() - base if cuda else None
                    q = k = v = dout = None
                    results.append(rec)
                    compiled = f" (compiled in {rec['compile_s']:.1f} s)" if "compile_s" in rec else ""
                    print(f"{precision} {impl} D={d} T={T}: " + (
                        f"fwd {rec['forward_ms_median']:.3f} ms, bwd {rec['backward_ms_median']:.3f} ms{compiled}"
                        if rec["status"] == "ok" else rec["status"]), file=sys.stderr, flush=True)
    if "compiled" in impls:
        torch._dynamo.reset()

    with open(args.out, "w") as f:
        json.dump(dict(device=device_name, torch=torch.__version__, results=results), f, indent=1)

    print(f"PyTorch {torch.__version__} on {device_name}: median ms over {args.iters} iterations, "
          f"batch {args.batch}, {args.heads} head(s), {'causal' if args.causal else 'no mask'}\n")
    print("| dtype | impl | backend | head dim | seq | fwd ms | bwd ms | peak MiB | status |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        ok = r["status"] == "ok"
        times = f"{r['forward_ms_median']:.3f} | {r['backward_ms_median']:.3f}" if ok else "- | -"
        peak = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**20:.1f}"
        print(f"| {r['precision']} | {r['impl']} | {r['backend']} | {r['head_dim']} | {r['seq']} | {times} | {peak} | "
              f"{r['status'].split(':')[0]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

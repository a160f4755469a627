#!/usr/bin/env python3
"""PyTorch's attention on the shapes llmhpc --mode attention measures, for the comparison table.

    python3 analysis/torch_attention.py --seq 4096,16384,65536 --head-dim 64,128 --precision bf16 --causal \
        --out torch_attention.json
    python3 analysis/attention.py LLMHPC_RUN_DIR --torch torch_attention.json

For every precision x head dim x sequence length (batch --batch, --heads heads): q, k, v
(B, H, T, D) standard normal with requires_grad, dout standard normal; `--impl fused` runs
F.scaled_dot_product_attention restricted to the FlashAttention backend (SDPBackend.
FLASH_ATTENTION; fp32, which that backend does not take, falls back to the memory-efficient
one and says so in `backend`), `--impl naive` the textbook softmax(Q K^T / sqrt(D)) V with
PyTorch ops. After --warmup untimed iterations, --iters timed ones; an iteration is the
forward (timed with CUDA events) then out.backward(dout) (timed likewise), with the input
gradients cleared before it. Writes JSON: {"device", "torch", "results": [{precision, batch,
heads, head_dim, seq, causal, impl, backend, status, forward_ms, backward_ms (per
iteration), forward_ms_median, backward_ms_median, peak_memory_bytes}]}, and prints a
markdown table (median ms). An out-of-memory is recorded as status "oom" and the sweep goes
on. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys


def int_list(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", default="64,128")
    parser.add_argument("--seq", default="4096,16384,65536")
    parser.add_argument("--precision", default="bf16", help="bf16 | fp32 (a comma-separated list sweeps)")
    parser.add_argument("--causal", action="store_true", help="causal mask (as llmhpc --causal)")
    parser.add_argument("--impl", default="fused", help="fused | naive (a comma-separated list sweeps)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"torch_attention.py: error: PyTorch is needed ({e})", file=sys.stderr)
        return 2

    if not torch.cuda.is_available():
        print("torch_attention.py: no CUDA GPU visible", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}

    def naive(q, k, v, causal):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if causal:
            T = q.shape[-2]
            mask = torch.ones(T, T, device=q.device, dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    results = []
    for precision in args.precision.split(","):
        dtype = dtypes[precision]
        for impl in args.impl.split(","):
            for d in int_list(args.head_dim):
                for T in int_list(args.seq):
                    rec = dict(precision=precision, batch=args.batch, heads=args.heads, head_dim=d, seq=T,
                               causal=int(args.causal), impl=impl, status="ok", forward_ms=[], backward_ms=[])
                    if impl == "fused":
                        backends = [SDPBackend.FLASH_ATTENTION] if dtype != torch.float32 else [
                            SDPBackend.EFFICIENT_ATTENTION]
                        rec["backend"] = backends[0].name
                    else:
                        rec["backend"] = "naive"
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
                            return naive(q, k, v, args.causal)

                        for i in range(args.warmup + args.iters):
                            q.grad = k.grad = v.grad = None
                            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                            start.record()
                            out = forward()
                            mid.record()
                            out.backward(dout)
                            end.record()
                            end.synchronize()
                            if i >= args.warmup:
                                rec["forward_ms"].append(start.elapsed_time(mid))
                                rec["backward_ms"].append(mid.elapsed_time(end))
                            del out
                        rec["forward_ms_median"] = statistics.median(rec["forward_ms"])
                        rec["backward_ms_median"] = statistics.median(rec["backward_ms"])
                    except torch.cuda.OutOfMemoryError as e:
                        rec["status"] = "oom"
                        rec["error"] = str(e).splitlines()[0]
                    except RuntimeError as e:  # e.g. no kernel of the backend for this shape/dtype
                        rec["status"] = "error: " + str(e).splitlines()[0]
                    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated() - base
                    q = k = v = dout = None
                    results.append(rec)
                    print(f"{precision} {impl} D={d} T={T}: " + (
                        f"fwd {rec['forward_ms_median']:.3f} ms, bwd {rec['backward_ms_median']:.3f} ms"
                        if rec["status"] == "ok" else rec["status"]), file=sys.stderr, flush=True)

    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)

    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: median ms over {args.iters} iterations, "
          f"batch {args.batch}, {args.heads} head(s), {'causal' if args.causal else 'no mask'}\n")
    print("| dtype | impl | backend | head dim | seq | fwd ms | bwd ms | peak MiB | status |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        ok = r["status"] == "ok"
        print(f"| {r['precision']} | {r['impl']} | {r['backend']} | {r['head_dim']} | {r['seq']} | "
              f"{r['forward_ms_median']:.3f} | {r['backward_ms_median']:.3f} | " if ok else
              f"| {r['precision']} | {r['impl']} | {r['backend']} | {r['head_dim']} | {r['seq']} | - | - | ",
              end="")
        print(f"{r['peak_memory_bytes'] / 2**20:.1f} | {r['status'].split(':')[0]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How much slower NCCL's collectives run beside compute than alone: each collective timed back to
back (CUDA events on a stream of its own), once alone and once beside a load on the default stream:

  --load products  one matrix product of a model's, over and over, enough of them queued to
                   outlast the timed collectives three times over: the most a step's products can
                   take from the collectives;
  --load step      the model's own train step (analysis/torch_baseline.py's TransformerLM, bf16
                   autocast, fused AdamW; forward, backward and optimizer) twice, the collectives
                   issued once both are queued and spanning about half a step: what a step leaves
                   them, products, attention, norms, the optimizer and the gaps between kernels.

One JSON line per (load, collective, size) on rank 0's stdout; the size is the largest buffer's
(the all-reduce's, the reduce-scatter's input, the all-gather's output), as nccl-tests and llmhpc's
mode comm count it.

    torchrun --standalone --nproc_per_node 2 analysis/torch_comm_contention.py > contention.jsonl
    torchrun --standalone --nproc_per_node 2 analysis/torch_comm_contention.py --load step --model xl

The models are the scaling study's (docs/results/scaling.md): medium at context 128 and batch 4,
xl at context 1024 and batch 8; --load products takes their products (medium: 512 tokens x d_model
1024 -> d_ff 4096; xl: 8192 tokens x 1600 -> 6400, and 6400 -> 1600), bf16.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import PRESETS, TransformerLM  # noqa: E402

PRODUCTS = {"medium": (512, 1024, 4096), "xl": (8192, 1600, 6400), "xl_dff": (8192, 6400, 1600)}
SHAPES = {"medium": (128, 4), "xl": (1024, 8)}  # context, batch
VOCAB = 50257
ITERS = 20


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", default="products,step", help="products, step or both (comma-separated)")
    parser.add_argument("--model", default="medium,xl", help="medium, xl or both: the step's model")
    parser.add_argument("--size-mb", default=None, help="collective sizes in MB (default: products 1,4,16,25,64,128; "
                                                        "step 4,25,64)")
    args = parser.parse_args()
    loads, models = args.load.split(","), args.model.split(",")
    for m in models:
        if m not in SHAPES:
            parser.error(f"--model {m}: medium or xl")
    if not torch.cuda.is_available():  # NCCL and every load run on the GPUs
        print("torch_comm_contention.py: no CUDA GPU visible", file=sys.stderr)
        sys.exit(2)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = torch.cuda.Stream()

    def timed(fn, iters):  # ms per call, back to back on the comm stream, from when the stream reaches them
        with torch.cuda.stream(comm):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(comm)
            for _ in range(iters):
                fn()
            end.record(comm)
        return start, end

    def agreed(count):  # the same count on every rank, or the collectives would not pair up
        t = torch.tensor([count], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def collectives(mb):
        n = mb * 2**20 // 2 // world * world
        x = torch.ones(n, dtype=torch.bfloat16, device=dev)
        part = torch.empty(n // world, dtype=torch.bfloat16, device=dev)
        return {"allreduce": lambda: dist.all_reduce(x),
                "allgather": lambda: dist.all_gather_into_tensor(x, part),
                "reducescatter": lambda: dist.reduce_scatter_tensor(part, x)}

    def alone_ms(fn):
        torch.cuda.synchronize()
        dist.barrier()
        timed(fn, 3)
        start, end = timed(fn, ITERS)
        end.synchronize()
        return start.elapsed_time(end) / ITERS

    def emit(**rec):
        if rank == 0:
            print(json.dumps(dict(date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(dev), ranks=world,
                                  torch=torch.__version__, nccl=".".join(map(str, torch.cuda.nccl.version())),
                                  dtype="bf16", **rec)), flush=True)

    if "products" in loads:
        for mb in [int(s) for s in (args.size_mb or "1,4,16,25,64,128").split(",")]:
            for op, fn in collectives(mb).items():
                alone = alone_ms(fn)
                for name, (m, k, nn) in PRODUCTS.items():
                    a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                    b = torch.randn(k, nn, dtype=torch.bfloat16, device=dev)
                    c = torch.empty(m, nn, dtype=torch.bfloat16, device=dev)
                    for _ in range(5):
                        torch.matmul(a, b, out=c)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(50):
                        torch.matmul(a, b, out=c)
                    torch.cuda.synchronize()
                    product_ms = (time.perf_counter() - t0) / 50 * 1e3
                    count = agreed(int(3 * ITERS * alone / product_ms) + 20)
                    torch.cuda.synchronize()
                    dist.barrier()
                    for _ in range(count):
                        torch.matmul(a, b, out=c)
                    start, end = timed(fn, ITERS)
                    torch.cuda.synchronize()
                    beside = start.elapsed_time(end) / ITERS
                    emit(load="products", beside=name, load_shape_mkn=[m, k, nn], load_product_ms=round(product_ms, 4),
                         collective=op, mb=mb, alone_ms=round(alone, 4), ms=round(beside, 4),
                         slowdown=round(beside / alone, 3))
    if "step" in loads:
        for model in models:
            d, d_ff, layers, heads = PRESETS[model]
            ctx, batch = SHAPES[model]
            torch.manual_seed(0)
            net = TransformerLM(VOCAB, d, d_ff, layers, heads, True).to(dev)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
            tokens = torch.randint(0, VOCAB, (batch, ctx + 1), device=dev)
            inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = net(inputs, targets)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            step_ms = (time.perf_counter() - t0) / 5 * 1e3
            for mb in [int(s) for s in (args.size_mb or "4,25,64").split(",")]:
                for op, fn in collectives(mb).items():
                    alone = alone_ms(fn)
                    count = agreed(max(10, int(0.5 * step_ms / alone)))
                    torch.cuda.synchronize()
                    dist.barrier()
                    step()
                    step()  # both queued: the collectives start while the first runs
                    start, end = timed(fn, count)
                    torch.cuda.synchronize()
                    beside = start.elapsed_time(end) / count
                    emit(load="step", beside=model, context_length=ctx, batch_size=batch, step_ms=round(step_ms, 2),
                         collective=op, mb=mb, count=count, alone_ms=round(alone, 4), ms=round(beside, 4),
                         slowdown=round(beside / alone, 3))
            del net, opt
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

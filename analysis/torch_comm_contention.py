#!/usr/bin/env python3
"""How much slower NCCL's collectives run beside matrix products than alone: each collective
timed back to back (CUDA events on a stream of its own), once alone and once while another stream
runs a matrix product of a given shape over and over, enough of them queued to outlast the timed
collectives three times over. One JSON line per (collective, size, load) on rank 0's stdout.

    torchrun --standalone --nproc_per_node 2 analysis/torch_comm_contention.py > contention.jsonl

The loads are the products of the scaling study's models (docs/results/scaling.md): medium at
context 128 and batch 4 (512 tokens x d_model 1024 -> d_ff 4096) and xl at context 1024 and batch
8 (8192 tokens x 1600 -> 6400, and 6400 -> 1600), bf16. A load that never stops is the most a
step's products can take from the collectives: a step also runs attention, norms and the
optimizer, and leaves gaps (the page's "Tried and rejected" compares the two).
"""
import json
import time

import torch
import torch.distributed as dist

LOADS = {"none": None, "medium": (512, 1024, 4096), "xl": (8192, 1600, 6400), "xl_dff": (8192, 6400, 1600)}
SIZES_MB = (1, 4, 16, 25, 64, 128)
ITERS = 20


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    comm, load = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(fn):  # ms per call, back to back on the comm stream
        with torch.cuda.stream(comm):
            for _ in range(3):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(comm)
            for _ in range(ITERS):
                fn()
            end.record(comm)
        end.synchronize()
        return start.elapsed_time(end) / ITERS

    for mb in SIZES_MB:
        n = mb * 2**20 // 2
        x = torch.ones(n, dtype=torch.bfloat16, device=dev)
        y = torch.empty(2 * n, dtype=torch.bfloat16, device=dev)
        ops = {"allreduce": lambda: dist.all_reduce(x), "allgather": lambda: dist.all_gather_into_tensor(y, x),
               "reducescatter": lambda: dist.reduce_scatter_tensor(x[: n // 2], x)}
        for op, fn in ops.items():
            dist.barrier()
            torch.cuda.synchronize()
            alone = timed(fn)
            for name, shape in LOADS.items():
                if shape is None:
                    ms, gemm_ms = alone, 0.0
                else:
                    m, k, nn = shape
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
                    gemm_ms = (time.perf_counter() - t0) / 50 * 1e3
                    count = int(3 * ITERS * alone / gemm_ms) + 20
                    dist.barrier()
                    torch.cuda.synchronize()
                    with torch.cuda.stream(load):
                        for _ in range(count):
                            torch.matmul(a, b, out=c)
                    ms = timed(fn)
                    torch.cuda.synchronize()
                if rank == 0:
                    print(json.dumps(dict(op=op, dtype="bf16", mb=mb, beside=name, ms=round(ms, 4),
                                          alone_ms=round(alone, 4), slowdown=round(ms / alone, 3),
                                          gemm_ms=round(gemm_ms, 4))), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel and FSDP2 on the model of analysis/torch_baseline.py, timed as
`llmhpc --mode ddp` times its strategies, for the side-by-side tables of analysis/ddp.py.

    torchrun --standalone --nproc_per_node 2 analysis/torch_ddp.py --model xl --context-length 128 \
        --batch-size 4 --precision fp32,bf16 --setup eager,compiled --bucket-mb 1,10,25,100,1000 --out torch_ddp.jsonl
    torchrun --standalone --nproc_per_node 2 analysis/torch_ddp.py --model xl --context-length 1024 --batch-size 8 \
        --precision bf16 --setup eager,compiled --shard-optimizer none,zero,fsdp2,fsdp2-noreshard --out torch_ddp.jsonl
    torchrun --standalone --nproc_per_node 2 analysis/torch_ddp.py --single ... --out torch_ddp.jsonl
    mpirun -np 2 python3 analysis/torch_ddp.py ...     # Open MPI's rank variables are read too
    python3 analysis/ddp.py LLMHPC_DDP_DIR --torch torch_ddp.jsonl

--batch-size is the global batch: each of the n ranks takes B/n sequences of its own (seeded by
rank). Per configuration (setups x precisions x models x contexts x batches x bucket sizes x
optimizer shardings x gradient reduce dtypes): the model (torch_baseline.TransformerLM, SDPA attention, seeded init; DDP
broadcasts rank 0's weights), then DDP(bucket_cap_mb=--bucket-mb, gradient_as_bucket_view=True)
and AdamW(fused=True on GPUs), or with --shard-optimizer zero PyTorch's ZeRO-1,
ZeroRedundancyOptimizer(optimizer_class=AdamW, fused=True): each rank keeps the AdamW state of
its share of the parameters and broadcasts what it updated (the reference DDP study's "broadcast" scheme,
beside llmhpc's --shard-optimizer broadcast and zero1). --grad-reduce-dtype bf16 registers
DDP's bf16_compress_hook: each bucket cast to bf16, all-reduced, cast back (llmhpc's
--grad-reduce-dtype bf16). `compiled`: the model is compiled in place (model.compile())
before it is wrapped, as PyTorch recommends for DDP
(docs.pytorch.org/docs/stable/compile/programming_model.where_to_apply_compile.html);
`eager`: not compiled (torch.compile's DDPOptimizer refuses a bucket smaller than a parameter: such
a configuration is recorded as an error). --precision bf16 is autocast (fp32 master weights). --single: no DDP and
no communication, every rank alone at the local batch: the compute-only baseline, llmhpc's
`--ddp none`.

--shard-optimizer fsdp2 and fsdp2-noreshard replace DDP by PyTorch's FSDP2
(torch.distributed.fsdp.fully_shard over a 1-D mesh of every rank): fully_shard on each transformer
block, then on the root module (embedding, final norm, LM head); every parameter split along dim 0,
its gradient reduce-scattered during backward (averaged over the ranks) and its AdamW(fused=True on
GPUs) state kept by the rank that holds the shard. `fsdp2`: reshard_after_forward=True, a block's
gathered parameters freed after its forward and gathered again for its backward (ZeRO-3, parameters
sharded too); `fsdp2-noreshard`: False, kept from forward to backward, one all-gather per block and
step (ZeRO-2-like: gradients and optimizer state sharded); between steps both hold only the shards.
Under bf16, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), and no autocast: FSDP2
gathers bf16 copies of the fp32 shards and casts each block's floating inputs (the residual stream,
the RoPE tables) to bf16, so every matmul and SDPA runs in bf16 (SDPA gets q, k and v in one dtype);
RMSNorm and the loss compute in fp32 inside the model, as under autocast. Unlike autocast, the
residual stream and the RoPE rotation are bf16 (autocast keeps them fp32). fp32: no policy.
--grad-reduce-dtype bf16: reduce_dtype=bf16. FSDP2 has no buckets: --bucket-mb does not apply, and
each fsdp2 sharding runs once per configuration (bucket_mb null in its record). `compiled` under
FSDP2: each block compiled in place before fully_shard (PyTorch's advice for distributed wrappers is
to compile the inner module; per block, as torchtitan does under FSDP2), the hooks that gather and
reduce staying outside the compiled graphs; a failure to compile is recorded as that configuration's
error status. The gradients are freed before each backward (zero_grad(set_to_none=True)), where DDP
keeps its buckets' views.

Every rank times every step with CUDA events (the clock on CPUs): forward (with the loss, and
FSDP2's all-gathers), backward (zero_grad, backward and DDP's all-reduce or FSDP2's reduce-scatters,
which backward waits for at its end), optimizer, and the whole step; warm-up steps untimed; one
synchronize per step. Live bytes (torch.cuda.memory_allocated) at the reference DDP study's three
points: after the model, DDP and optimizer are made (memory_after_init_bytes), before the first
optimizer step (memory_before_optimizer_bytes: no optimizer state yet) and after it
(memory_after_optimizer_bytes: the state exists), and at the end of the last step
(memory_after_step_bytes: weights, gradients and optimizer state between steps). Rank 0 appends one
JSON line per configuration to --out: the configuration (shard_optimizer as given; fsdp2:
reshard_after_forward, param_dtype and reduce_dtype; autocast), status ("ok", "oom" if a rank ran
out of memory, "error: ..."), `ranks` (each rank's forward_ms, backward_ms, optimizer_ms, step_ms
arrays, the four memory points, peak_memory_bytes and final_loss, its local loss at the last step)
and step_ms_max_over_ranks (the slowest rank's time of each step). An OOM that strikes only some
ranks inside a collective can hang the job, as it would any DDP or FSDP job: the sweep runs its
configurations in the same order on every rank.

Ranks: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, else Open MPI's OMPI_COMM_WORLD_RANK, _SIZE,
_LOCAL_RANK (MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500: one node), else one
process. Backend nccl on GPUs (rank r uses GPU LOCAL_RANK), gloo with --device cpu.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RANK_VARIABLES = (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                  ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"))
SETUPS = ("eager", "compiled")
SHARDINGS = ("none", "zero", "fsdp2", "fsdp2-noreshard")
FSDP2 = {"fsdp2": True, "fsdp2-noreshard": False}  # --shard-optimizer value: fully_shard's reshard_after_forward
REDUCE_DTYPES = ("same", "bf16")  # --grad-reduce-dtype: bf16 is DDP's bf16_compress_hook, FSDP2's reduce_dtype
MEMORY_POINTS = ("memory_after_init_bytes", "memory_before_optimizer_bytes", "memory_after_optimizer_bytes",
                 "memory_after_step_bytes")
PRECISIONS = ("fp32", "bf16")
SHAPE_OPTIONS = ("d_model", "d_ff", "num_layers", "num_heads")
PHASES = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")


def distributed_env() -> tuple:
    """(rank, world size, local rank) from the launcher's variables, exported as torch.distributed's env:// wants."""
    for rank_var, size_var, local_var in RANK_VARIABLES:
        if rank_var in os.environ and size_var in os.environ:
            rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            local = int(os.environ.get(local_var, rank))
            break
    else:
        rank, size, local = 0, 1, 0
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    return rank, size, local


# How long a rank other than 0 waits before it exits on bad input (refuse).
REFUSE_WAIT_S = 10.0


def refuse(tool: str, rank: int, message: str) -> int:
    """Bad input, found alike on every rank: rank 0 says so, and every rank returns exit status 2.
    The others wait first (at most REFUSE_WAIT_S): mpirun ends the job when a rank exits
    non-zero, and a rank 1 that exited first took rank 0 and its message with it (a 2-rank check
    under load); rank 0's exit ends them at once."""
    if rank == 0:
        print(f"{tool}: error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(REFUSE_WAIT_S)
    return 2


def split(text: str) -> list:
    return [x for x in text.split(",") if x]


def model_shapes(args, presets: dict) -> list:
    """[(name, d_model, d_ff, num_layers, num_heads)]: the --model presets, or one custom shape."""
    given = [getattr(args, k) for k in SHAPE_OPTIONS]
    if any(v is not None for v in given):
        if any(v is None for v in given):
            raise ValueError("a custom model needs --d-model --d-ff --num-layers --num-heads")
        return [("custom", *given)]
    unknown = [m for m in split(args.model) if m not in presets]
    if unknown:
        raise ValueError(f"--model {','.join(unknown)}: not a preset ({', '.join(presets)})")
    return [(m, *presets[m]) for m in split(args.model)]


def check_args(args, world_size: int) -> None:
    """Every rank checks the same things before any collective, so every rank stops alike."""
    for name, values, allowed in (("--setup", split(args.setup), SETUPS),
                                  ("--precision", split(args.precision), PRECISIONS),
                                  ("--shard-optimizer", split(args.shard_optimizer), SHARDINGS),
                                  ("--grad-reduce-dtype", split(args.grad_reduce_dtype), REDUCE_DTYPES)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"{name} {','.join(bad)}: must be one of {', '.join(allowed)}")
    for b in args.batch_sizes:
        if b <= 0 or b % world_size:
            raise ValueError(f"--batch-size {b} is the global batch and must be a positive multiple of the "
                             f"{world_size} rank(s)")
    if any(mb is not None and mb <= 0 for mb in args.buckets):
        raise ValueError("--bucket-mb: every bucket size must be greater than 0 MiB")
    if args.single and split(args.shard_optimizer) != ["none"]:
        raise ValueError("--single runs without DDP: --shard-optimizer must be none")
    if args.single and split(args.grad_reduce_dtype) != ["same"]:
        raise ValueError("--single runs without DDP: --grad-reduce-dtype must be same")
    check_timing(args)


def add_timing_options(p) -> None:
    """The options this script and torch_tp.py time their configurations by: warm-up, steps, heating, seed,
    device and the JSON lines file."""
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--heat-s", type=float, default=0,
                   help="as llmhpc's: each configuration's steps untimed for about this many seconds after its "
                        "warm-up (needs --warmup 1 or more), so that every configuration is timed at the clocks a "
                        "power-capped GPU holds under sustained load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--out", required=True, help="JSON lines file rank 0 appends to")


def check_timing(args) -> None:
    """The timing options' checks, the same verdict on every rank."""
    if args.warmup < 0 or args.steps <= 0:
        raise ValueError("--warmup must not be negative and --steps must be positive")
    if args.heat_s < 0 or (args.heat_s > 0 and args.warmup < 1):
        raise ValueError("--heat-s must be seconds >= 0, and counts its steps from the warm-up's: needs --warmup 1 or more")


class Marks:
    """Four marks per step: CUDA events on the current stream, or the clock on CPUs."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda
        self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else [0.0] * 4

    def record(self, i: int) -> None:
        if self.cuda:
            self.marks[i].record()
        else:
            self.marks[i] = time.perf_counter()

    def wait(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, i: int, j: int) -> float:
        return self.marks[i].elapsed_time(self.marks[j]) if self.cuda else 1e3 * (self.marks[j] - self.marks[i])


def make_optimizer(torch, model, sharding: str, cuda: bool):
    """AdamW, fused on GPUs; under "zero" wrapped in PyTorch's ZeRO-1 (state sharded over the ranks). Under
    FSDP2 the model's parameters are already its shards (DTensors), and so is AdamW's state."""
    fused = True if cuda else None
    if sharding == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, fused=fused)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)


def compile_blocks(model) -> None:
    """Each transformer block compiled in place. A function of its own, so that no local name outlives it:
    a block held after its configuration keeps every FSDP2 state of the model alive (they share one context)."""
    for block in model.layers:
        block.compile()


def fully_shard_model(torch, model, mesh, sharding: str, precision: str, reduce_dtype: str):
    """FSDP2: fully_shard on each transformer block, then on the root module (the embedding, final norm
    and LM head), each parameter split along dim 0 over the ranks. reshard_after_forward True (fsdp2,
    ZeRO-3: a block's gathered parameters are freed after its forward and gathered again for its
    backward) or False (fsdp2-noreshard: kept from forward to backward, ZeRO-2-like). Under bf16,
    MixedPrecisionPolicy(param_dtype=bf16): the gathered parameters, and the blocks' floating
    inputs, are cast to bf16; gradients reduce-scattered in fp32 or, with --grad-reduce-dtype bf16,
    in bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                                  reduce_dtype=torch.bfloat16 if reduce_dtype == "bf16" else torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=FSDP2[sharding], mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=FSDP2[sharding], mp_policy=policy)
    return model


def timed_steps(torch, args, device, world: int, heat_s: float, forward, backward, optimizer_step, live, memory: dict,
                losses: list | None = None) -> dict:
    """One configuration's steps on this rank, timed as the module's docstring says: forward() gives the loss,
    backward(loss) frees or zeroes the gradients and runs backward, optimizer_step() updates. --warmup steps
    untimed; with heat_s, untimed steps for about that many seconds (as many on every rank, counted from the
    slowest rank's last warm-up step); --steps timed. Returns {forward_ms, backward_ms, optimizer_ms, step_ms,
    heat_steps (with heat_s), final_loss}, and puts the live bytes (live()) before and after the first optimizer
    step and after the last step into `memory`. With `losses` (a list), each step's loss, detached, is appended
    to it, to read after the last step."""
    out = {k: [] for k in PHASES}
    marks = Marks(torch, device.type == "cuda")
    warm_ms, heat_steps = [], 0
    i = 0
    while i < args.warmup + heat_steps + args.steps:
        if i == args.warmup and heat_s > 0 and warm_ms:  # the heat's count, the same on every rank
            pace = torch.tensor([warm_ms[-1]], device=device)  # the first steps compile and allocate
            if world > 1:
                torch.distributed.all_reduce(pace, op=torch.distributed.ReduceOp.MAX)
            heat_steps = max(1, round(heat_s * 1000 / max(float(pace.item()), 1e-3)))
            out["heat_steps"] = heat_steps
        marks.record(0)
        loss = forward()
        marks.record(1)
        backward(loss)
        marks.record(2)
        if i == 0:
            memory[MEMORY_POINTS[1]] = live()
        optimizer_step()
        marks.record(3)
        if i == 0:
            memory[MEMORY_POINTS[2]] = live()
        marks.wait()
        if losses is not None:
            losses.append(loss.detach())
        if i == args.warmup + heat_steps + args.steps - 1:
            memory[MEMORY_POINTS[3]] = live()
            out["final_loss"] = float(loss.item())
        if i < args.warmup:
            warm_ms.append(marks.ms(0, 3))
        elif i >= args.warmup + heat_steps:
            for k, (a, b) in zip(PHASES, ((0, 1), (1, 2), (2, 3), (0, 3))):
                out[k].append(marks.ms(a, b))
        i += 1
    return out


def run_config(torch, baseline, args, env, shape, ctx, batch, precision, setup, bucket_mb, sharding,
               reduce_dtype, heat_s=0.0) -> dict:
    """This rank's part of one configuration: {status, error?, per-step arrays, peak_memory_bytes}. With
    heat_s, as llmhpc's --heat-s: after the warm-up, untimed steps for about that many seconds, as many on
    every rank (counted from the slowest rank's last warm-up step), before the timed ones."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, world, device = env["rank"], env["world_size"], env["device"]
    cuda = device.type == "cuda"
    name, d, d_ff, layers, heads = shape
    local = batch // world
    fsdp = sharding in FSDP2
    autocast = precision == "bf16" and not fsdp  # FSDP2 computes in bf16 through its policy
    model = ddp = opt = tokens = targets = None
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(args.seed)  # the same weights everywhere; DDP broadcasts rank 0's anyway
        with device:  # initialised where it runs: an xl model made on the CPU takes longer than its steps
            model = baseline.TransformerLM(args.vocab_size, d, d_ff, layers, heads, fused=True)
        if setup == "compiled" and fsdp:  # each block before fully_shard: FSDP2's hooks stay outside the graphs
            compile_blocks(model)
        elif setup == "compiled":
            model.compile()
        if fsdp:
            ddp = fully_shard_model(torch, model, env["mesh"], sharding, precision, reduce_dtype)
        else:
            ddp = model if args.single else DDP(model, device_ids=[device.index] if cuda else None,
                                                bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
        if reduce_dtype == "bf16" and not fsdp:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        opt = make_optimizer(torch, model, sharding, cuda)
        live = torch.cuda.memory_allocated if cuda else (lambda: None)
        memory = {MEMORY_POINTS[0]: live()}
        g = torch.Generator(device=device).manual_seed(args.seed + 1000 * rank + 1)
        tokens = torch.randint(0, args.vocab_size, (local, ctx), device=device, generator=g)
        targets = torch.randint(0, args.vocab_size, (local, ctx), device=device, generator=g)

        def forward():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                return ddp(tokens, targets)

        def backward(loss):
            opt.zero_grad(set_to_none=fsdp)  # DDP: keeps the gradients as views of its buckets
            loss.backward()

        out = timed_steps(torch, args, device, world, heat_s, forward, backward, opt.step, live, memory)
        out.update(memory, status="ok")
    except torch.cuda.OutOfMemoryError as e:
        out = dict(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # e.g. torch.compile's DDPOptimizer refuses buckets smaller than a parameter
        out = dict(status=f"error: {type(e).__name__}: " + (str(e).splitlines() or [""])[0])
    out["peak_memory_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
    out["rank"] = rank
    model = ddp = opt = tokens = targets = None  # freed before the next configuration, and
    torch._dynamo.reset()  # the compiled graphs first: they can hold the last model's tensors
    gc.collect()  # DDP's reducer (or FSDP2's state) with them, while the process group lives (else exit can abort)
    if cuda:
        torch.cuda.empty_cache()
    return out


def merged(parts: list) -> dict:
    """The ranks' parts of one configuration as the record's status, ranks and step_ms_max_over_ranks."""
    failed = [p for p in parts if p["status"] != "ok"]
    rec = dict(status="ok" if not failed else "oom" if any(p["status"] == "oom" for p in failed) else failed[0]["status"],
               ranks=parts)
    if failed:
        rec["error"] = "; ".join(f"rank {p['rank']}: {p.get('error', p['status'])}" for p in failed)
    else:
        rec["step_ms_max_over_ranks"] = [max(steps) for steps in zip(*(p["step_ms"] for p in parts))]
    return rec


def fsdp2_record(sharding: str, precision: str, reduce_dtype: str):
    """What FSDP2 ran with, for the record (None for DDP)."""
    if sharding not in FSDP2:
        return None
    return dict(reshard_after_forward=FSDP2[sharding], param_dtype="bf16" if precision == "bf16" else "fp32",
                reduce_dtype="bf16" if reduce_dtype == "bf16" else "fp32")


def sweep(args) -> list:
    """[(bucket_mb, sharding, reduce dtype)] per model shape, context and batch: every bucket size x sharding x
    reduce dtype, except that FSDP2 has no buckets: its shardings once each (bucket_mb None), at the first
    bucket size's place."""
    return [(None if z in FSDP2 else b, z, r) for i, b in enumerate(args.buckets) for z in split(args.shard_optimizer)
            if i == 0 or z not in FSDP2 for r in split(args.grad_reduce_dtype)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="xl", help="presets of analysis/torch_baseline.py (comma-separated list sweeps)")
    for k in SHAPE_OPTIONS:
        p.add_argument("--" + k.replace("_", "-"), type=int, help="custom shape (all four instead of --model)")
    p.add_argument("--vocab-size", type=int, default=10000)
    p.add_argument("--context-length", default="128", help="(list sweeps)")
    p.add_argument("--batch-size", default="4", help="global batch, B/n sequences per rank (list sweeps)")
    p.add_argument("--precision", default="fp32",
                   help="fp32 | bf16 (autocast; FSDP2: MixedPrecisionPolicy, no autocast) (list sweeps)")
    p.add_argument("--setup", default="eager,compiled", help="eager | compiled (list sweeps)")
    p.add_argument("--bucket-mb", default="25",
                   help="DDP's bucket_cap_mb, MiB (list sweeps); FSDP2 has no buckets and runs once whatever it is")
    p.add_argument("--shard-optimizer", default="none",
                   help="none | zero (ZeroRedundancyOptimizer: AdamW state sharded over the ranks) | fsdp2 "
                        "(fully_shard: parameters, gradients and AdamW state sharded, ZeRO-3) | fsdp2-noreshard "
                        "(parameters kept gathered from forward to backward, ZeRO-2-like) (list sweeps)")
    p.add_argument("--grad-reduce-dtype", default="same",
                   help="same | bf16: DDP's gradients compressed to bf16 around each bucket's all-reduce "
                        "(bf16_compress_hook), FSDP2's reduce-scattered in bf16 (reduce_dtype), as llmhpc's "
                        "--grad-reduce-dtype bf16 (list sweeps)")
    p.add_argument("--single", action="store_true", help="no DDP: every rank alone at the local batch (baseline)")
    add_timing_options(p)
    args = p.parse_args(argv)
    rank, world_size, local_rank = distributed_env()
    try:
        args.batch_sizes = [int(x) for x in split(args.batch_size)]
        args.contexts = [int(x) for x in split(args.context_length)]
        args.buckets = [None] if args.single else [float(x) for x in split(args.bucket_mb)]
        check_args(args, world_size)
    except ValueError as e:
        return refuse("torch_ddp.py", rank, str(e))

    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"torch_ddp.py: error: PyTorch is needed ({e})", file=sys.stderr)
        return 2
    import torch_baseline as baseline
    try:
        shapes = model_shapes(args, baseline.PRESETS)
    except ValueError as e:
        return refuse("torch_ddp.py", rank, str(e))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        if "bf16" in split(args.precision):
            return refuse("torch_ddp.py", rank, "--precision bf16 is a GPU comparison; on the CPU use fp32")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as llmhpc without --tf32
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world_size)
    env = dict(rank=rank, world_size=world_size, device=device, mesh=None)
    if any(z in FSDP2 for z in split(args.shard_optimizer)):  # one mesh of every rank, on the default group
        from torch.distributed.device_mesh import init_device_mesh
        env["mesh"] = init_device_mesh(device.type, (world_size,))
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    try:
        for setup in split(args.setup):
            for precision in split(args.precision):
                for shape in shapes:
                    for ctx in args.contexts:
                        for batch in args.batch_sizes:
                            for bucket_mb, sharding, reduce_dtype in sweep(args):
                                dist.barrier()
                                t0 = time.time()
                                part = run_config(torch, baseline, args, env, shape, ctx, batch, precision, setup,
                                                  bucket_mb, sharding, reduce_dtype, args.heat_s)
                                parts = [None] * world_size if rank == 0 else None
                                dist.gather_object(part, parts, dst=0)
                                if rank != 0:
                                    continue
                                name, d, d_ff, layers, heads = shape
                                rec = dict(tool="pytorch-ddp", model=name, d_model=d, d_ff=d_ff, num_layers=layers,
                                           num_heads=heads, vocab_size=args.vocab_size, context_length=ctx,
                                           batch_size=batch, local_batch_size=batch // world_size,
                                           world_size=world_size, precision=precision, setup=setup,
                                           ddp="none" if args.single else "torch", bucket_mb=bucket_mb,
                                           shard_optimizer=sharding,
                                           grad_reduce_dtype="bf16" if reduce_dtype == "bf16" else "fp32",
                                           gradient_as_bucket_view=not args.single and sharding not in FSDP2,
                                           autocast=precision == "bf16" and sharding not in FSDP2,
                                           fsdp2=fsdp2_record(sharding, precision, reduce_dtype),
                                           warmup=args.warmup, steps=args.steps, torch_version=torch.__version__,
                                           device_name=device_name, backend=dist.get_backend(),
                                           wall_s=time.time() - t0, **merged(parts))
                                with open(args.out, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
                                steps = rec.get("step_ms_max_over_ranks")
                                losses = [p["final_loss"] for p in parts if p.get("final_loss") is not None]
                                print(f"{name} T={ctx} B={batch} {precision} {setup} " +
                                      ("single" if args.single else sharding if sharding in FSDP2 else
                                       f"DDP bucket {bucket_mb:g} MiB") +
                                      f"{' ZeRO-1' if sharding == 'zero' else ''}"
                                      f"{' bf16 gradients' if reduce_dtype == 'bf16' else ''}: " +
                                      (f"slowest-rank step {sum(steps) / len(steps):.2f} ms, final loss "
                                       f"{sum(losses) / len(losses):.6f} (mean over ranks)" if steps else
                                       rec["status"]), flush=True)
    finally:
        env["mesh"] = None  # FSDP2's mesh let go before its group: one left to the exit can abort the process
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Every record is written and closed, and the output flushed: leave without the interpreter's
    # teardown, in which PyTorch's process group (gloo, CPU, mpirun -np 2) once aborted a rank
    # after destroy_process_group ("terminate called without an active exception", SIGABRT).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

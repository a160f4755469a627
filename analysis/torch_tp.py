#!/usr/bin/env python3
"""PyTorch's own tensor parallelism (torch.distributed.tensor.parallel) on the model of
analysis/torch_baseline.py, timed as analysis/torch_ddp.py times DDP and FSDP2, to stand beside
`llmhpc --tp 2` measured in the same GPU job.

    torchrun --standalone --nproc_per_node 2 analysis/torch_tp.py --model 2.7B --context-length 1024 \
        --batch-size 8 --precision bf16 --setup eager,compiled --sequence-parallel off,on --out torch_tp.jsonl
    torchrun --standalone --nproc_per_node 4 analysis/torch_tp.py --tp 2 ...   # TP 2 x FSDP2 over 2
    mpirun -np 2 python3 analysis/torch_tp.py ...     # Open MPI's rank variables are read too
    torchrun --standalone --nproc_per_node 2 analysis/torch_tp.py --device cpu --model tiny --context-length 64 \
        --batch-size 2 --precision fp32 --setup eager --sequence-parallel off,on --warmup 1 --steps 3 \
        --check-against-single --out torch_tp.jsonl   # the sharded model against one unsharded copy

--model takes the presets of analysis/torch_baseline.py (tiny, small, medium, large, xl, 2.7B; xl's
25 heads do not split over 2 ranks) or a custom shape (--d-model --d-ff --num-layers --num-heads).
Per configuration (setups x precisions x models x contexts x batches x --sequence-parallel): the
model (torch_baseline.TransformerLM, SDPA attention, seeded init, the same full weights on every
rank) is split by parallelize_module over a DeviceMesh of the --tp ranks (default: every rank),
then timed. --batch-size is the global batch: every rank of a tensor-parallel group sees the same
sequences (drawn from --seed alike on every rank). With --tp N smaller than the world, the ranks
form a 2-D mesh ("dp", "tp"), the tp dimension innermost (ranks r and r+1 share a layer's
matrices); the dp groups split the global batch (B/dp sequences each) and FSDP2 shards over the
dp dimension as torchtitan does: fully_shard on each block and then the root over the dp submesh,
after the tensor-parallel split, reshard_after_forward=True, gradients reduce-scattered (averaged)
over dp. The world must be a multiple of --tp.

The plan, per transformer block (torchtitan's parallelize_llama on this model's names):
  attn.q_proj, attn.k_proj, attn.v_proj, w1, w3    ColwiseParallel: each rank holds n/tp output
      features (its n_heads/tp heads, or d_ff/tp hidden units), from a replicated input; no
      communication forward
  attn.output_proj, w2                             RowwiseParallel: the matching n/tp input
      features; the partial sums are all-reduced (sequence parallel off: the residual stream is
      replicated) or reduce-scattered along the sequence (on: Shard(1))
  attn                                             PrepareModuleInput: the normed stream, Replicate
      (off) or Shard(1) (on), made one replicated DTensor (all-gathered along the sequence when
      on), so that q, k and v share it: backward sums their three partial input gradients as a
      DTensor and reduces them once (one all-reduce or reduce-scatter per sublayer, as Megatron's
      f/g pair), where a plain tensor into each projection would reduce three times
  ln2 (output)                                     PrepareModuleOutput, the same for the MLP: the
      block has no MLP module of its own (w1, w2, w3 sit on the block, as llmhpc names them), so
      the norm's output is the one place where w1 and w3 can share one gather
  ln1, ln2 (sequence parallel on)                  SequenceParallel: each rank normalises its
      T/tp positions with a replicated gain
The attention runs on local tensors: the column-parallel projections give plain tensors
(use_local_output=True) of d/tp features, which Attention.forward splits into -1 heads of
head_dim (n_heads/tp of them: torchtitan's reshape), so the RoPE tables, plain local tensors built
in TransformerLM.forward, and SDPA never see a DTensor. Outside the blocks: token_embeddings
RowwiseParallel(input_layouts=Replicate()) (vocabulary-parallel: each rank holds V/tp rows, the
looked-up rows all-reduced, or reduce-scattered along the sequence when on), ln_final
SequenceParallel when on, lm_head ColwiseParallel with Shard(-1) logits (use_local_output=False)
and the loss under loss_parallel(): cross-entropy over vocabulary-sharded logits, no rank ever
holding all B x T x V of them; forward and backward both run inside loss_parallel(). The
divisibility asked: n_heads, d_ff and the vocabulary by tp; with sequence parallel, the context by
tp; the batch by dp.

Collectives per step over the tp group (counted with DTensor's CommDebugMode on this plan; L
layers): sequence parallel off, forward 2L + 1 all-reduces of B x T x d (the row-parallel outputs,
the embedding), backward 2L + 1 (the inputs of attn, the MLP and lm_head); on, forward 2L + 1
reduce-scatters and 2L + 1 all-gathers, backward as many; both, 3 all-reduces of B x T values in
the loss. Parameters are DTensors on the tp mesh, except, with sequence parallel off, the norms'
gains: plain tensors, identical on every rank (their inputs and gradients are replicated), kept in
an AdamW parameter group of their own since one multi-tensor kernel cannot take both kinds. With
sequence parallel on, the gains are replicated DTensors whose gradients DTensor leaves partial
(each rank's sum over its T/tp positions): AdamW's step sums them, one all-reduce of d floats per
gain (2L + 1) inside the optimizer phase, before using them. The embedding's gradient comes out of
DTensor's backward replicated (V x d on every rank, of which AdamW reads this rank's rows).

--setup compiled: each block compiled in place (block.compile()) after parallelize_module and before
FSDP2, as torchtitan does, the tensor-parallel hooks and collectives inside the compiled graphs (two
graphs: the first block's input, from the eager embedding, is another tensor type than the
compiled blocks' outputs); eager: not compiled. AdamW (lr 1e-3; fused=True on GPUs, as
torch_ddp.py, foreach on the CPU) over the DTensor parameters: each rank updates its shards.
--precision bf16: autocast (fp32 master weights), as torch_ddp.py's DDP; with a dp dimension,
FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) and no autocast, as
torch_ddp.py's FSDP2.

Every rank times every step as torch_ddp.py does (its timed_steps): forward (with the loss),
backward (zero_grad(set_to_none=True) and backward), optimizer, the whole step; --warmup steps
untimed, --heat-s as there; one synchronize per step; the same four live-byte points. Rank 0
appends one JSON line per configuration to --out: the configuration (tp, dp, sequence_parallel,
loss_parallel, autocast, fsdp2), status ("ok", "oom" if a rank ran out of memory, "error: ..."),
`ranks` (each rank's forward_ms, backward_ms, optimizer_ms, step_ms arrays, the memory points,
peak_memory_bytes and final_loss), step_ms_max_over_ranks (the slowest rank's time of each step),
and from it step_ms_median, step_ms_mean, tokens_per_s (B x T over the median step) and
tokens_per_s_per_gpu (that over the world size), with peak_memory_bytes_max_over_ranks
(torch.cuda.max_memory_allocated).

--check-against-single: every rank also keeps each step's loss; after each configuration rank 0
trains one unsharded TransformerLM (the same seed, hence the same weights; the same global batch,
AdamW and precision; eager) for as many steps and records check = {losses (the sharded run's, the
mean over its dp groups), single_losses, max_rel_loss_diff}. In fp32 the two agree to float
rounding (about 1e-7 on the CPU): the same arithmetic, summed in another order.

Ranks: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, else Open MPI's OMPI_COMM_WORLD_RANK, _SIZE,
_LOCAL_RANK (MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500: one node), else one
process. Backend nccl on GPUs (rank r uses GPU LOCAL_RANK), gloo with --device cpu (fp32 only).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import (MEMORY_POINTS, PRECISIONS, SETUPS, SHAPE_OPTIONS, add_timing_options,  # noqa: E402
                       check_timing, compile_blocks, distributed_env, fully_shard_model, merged, model_shapes, refuse,
                       split, timed_steps)

SEQUENCE_PARALLEL = {"off": False, "on": True}  # --sequence-parallel values


def check_args(args) -> None:
    """What needs no model shape; every rank checks the same things before any collective."""
    for name, values, allowed in (("--setup", split(args.setup), SETUPS),
                                  ("--precision", split(args.precision), PRECISIONS),
                                  ("--sequence-parallel", split(args.sequence_parallel), tuple(SEQUENCE_PARALLEL))):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"{name} {','.join(bad)}: must be one of {', '.join(allowed)}")
    check_timing(args)


def check_split(args, shapes: list, world_size: int) -> tuple:
    """(tp, dp): the tensor-parallel degree and the data-parallel one, once every shape, context and batch
    divides as the split needs."""
    tp = args.tp or world_size
    if tp < 1 or world_size % tp:
        raise ValueError(f"--tp {tp}: the {world_size} rank(s) must be a whole number of tensor-parallel groups")
    dp = world_size // tp
    for name, d, d_ff, layers, heads in shapes:
        for what, n in (("--num-heads", heads), ("--d-ff", d_ff), ("--vocab-size", args.vocab_size)):
            if n % tp:
                raise ValueError(f"{name}: {what} {n} does not split over --tp {tp} ranks")
        if d % heads:
            raise ValueError(f"{name}: --d-model {d} is not a whole number of the {heads} heads")
    if "on" in split(args.sequence_parallel):
        bad = [c for c in args.contexts if c % tp]
        if bad:
            raise ValueError(f"--context-length {','.join(map(str, bad))}: sequence parallel splits the context "
                             f"over --tp {tp} ranks and needs a multiple of {tp}")
    for b in args.batch_sizes:
        if b <= 0 or b % dp:
            raise ValueError(f"--batch-size {b} is the global batch and must be a positive multiple of the {dp} "
                             f"data-parallel group(s)")
    return tp, dp


def parallelize(model, mesh, sequence_parallel: bool):
    """The tensor-parallel plan of the module docstring, applied in place over the 1-D mesh `mesh`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel, parallelize_module)
    stream = Shard(1) if sequence_parallel else Replicate()  # the residual stream between sublayers
    root = {"token_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
            "lm_head": ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False)}
    if sequence_parallel:
        root["ln_final"] = SequenceParallel()
    parallelize_module(model, mesh, root)
    for block in model.layers:
        plan = {"attn": PrepareModuleInput(input_layouts=(stream, None, None),
                                           desired_input_layouts=(Replicate(), None, None)),
                "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
                "attn.output_proj": RowwiseParallel(output_layouts=stream),
                "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel(output_layouts=stream)}
        if sequence_parallel:
            plan.update(ln1=SequenceParallel(), ln2=SequenceParallel())
        parallelize_module(block, mesh, plan)
        # After SequenceParallel's own output hook (registered first, so run first): w1 and w3 share one gather.
        parallelize_module(block.ln2, mesh, PrepareModuleOutput(output_layouts=stream,
                                                                desired_output_layouts=Replicate(),
                                                                use_local_output=False))
    return model


def make_optimizer(torch, params, cuda: bool):
    """AdamW (lr 1e-3), fused on GPUs, foreach on the CPU, one parameter group per kind: the DTensors, and
    the plain tensors (the norms' gains without sequence parallel), since one multi-tensor kernel cannot take
    both ("got mixed torch.Tensor and DTensor")."""
    from torch.distributed.tensor import DTensor
    params = list(params)
    groups = [g for g in ([p for p in params if isinstance(p, DTensor)],
                          [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.AdamW([{"params": g} for g in groups], lr=1e-3, fused=True if cuda else None,
                             foreach=None if cuda else True)


def plain(t):
    """A (replicated) DTensor's local value, else the tensor itself."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def global_batch(torch, args, device, batch: int, ctx: int) -> tuple:
    """(tokens, targets) of the global batch: the same on every rank, drawn from --seed."""
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    tokens = torch.randint(0, args.vocab_size, (batch, ctx), device=device, generator=g)
    targets = torch.randint(0, args.vocab_size, (batch, ctx), device=device, generator=g)
    return tokens, targets


def run_config(torch, baseline, args, env, shape, ctx, batch, precision, setup, sequence_parallel, heat_s=0.0) -> dict:
    """This rank's part of one configuration: {status, error?, per-step arrays, memory points,
    peak_memory_bytes, final_loss, losses (with --check-against-single)}."""
    from torch.distributed.tensor.parallel import loss_parallel
    rank, world, device, tp, dp = env["rank"], env["world_size"], env["device"], env["tp"], env["dp"]
    cuda = device.type == "cuda"
    _, d, d_ff, layers, heads = shape
    local = batch // dp
    autocast = precision == "bf16" and dp == 1  # FSDP2 (dp > 1) computes in bf16 through its policy
    model = opt = tokens = targets = None
    losses = [] if args.check_against_single else None
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(args.seed)  # the same full weights on every rank, before the split
        with device:
            model = baseline.TransformerLM(args.vocab_size, d, d_ff, layers, heads, fused=True)
        parallelize(model, env["tp_mesh"], sequence_parallel)
        if setup == "compiled":
            compile_blocks(model)
        if dp > 1:
            fully_shard_model(torch, model, env["dp_mesh"], "fsdp2", precision, "same")
        opt = make_optimizer(torch, model.parameters(), cuda)
        live = torch.cuda.memory_allocated if cuda else (lambda: None)
        memory = {MEMORY_POINTS[0]: live()}
        tokens, targets = global_batch(torch, args, device, batch, ctx)
        group = rank // tp  # this rank's dp group: its B/dp sequences of the global batch
        tokens, targets = tokens[group * local:(group + 1) * local], targets[group * local:(group + 1) * local]

        def forward():
            with loss_parallel(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                return model(tokens, targets)

        def backward(loss):
            opt.zero_grad(set_to_none=True)
            with loss_parallel():
                loss.backward()

        out = timed_steps(torch, args, device, world, heat_s, forward, backward, opt.step, live, memory, losses)
        out.update(memory, status="ok")
        if losses is not None:
            out["losses"] = [float(plain(x)) for x in losses]
    except torch.cuda.OutOfMemoryError as e:
        out = dict(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001  recorded as the configuration's status, the sweep goes on
        out = dict(status=f"error: {type(e).__name__}: " + (str(e).splitlines() or [""])[0])
    out["peak_memory_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
    out["rank"] = rank
    model = opt = tokens = targets = losses = None  # freed before the next configuration, and
    torch._dynamo.reset()  # the compiled graphs first: they can hold the last model's tensors
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def single_losses(torch, baseline, args, device, shape, ctx, batch, precision, n: int) -> list:
    """The per-step losses of one unsharded model trained n steps on the whole global batch, as the sharded run
    (the same seed, AdamW, autocast under bf16; eager)."""
    _, d, d_ff, layers, heads = shape
    torch.manual_seed(args.seed)
    with device:
        model = baseline.TransformerLM(args.vocab_size, d, d_ff, layers, heads, fused=True)
    opt = make_optimizer(torch, model.parameters(), device.type == "cuda")
    tokens, targets = global_batch(torch, args, device, batch, ctx)
    losses = []
    for _ in range(n):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return losses


def check_record(parts: list, single) -> dict:
    """The check's record: the sharded losses (each step's mean over the ranks, hence over the dp groups, each
    of the same size) beside the unsharded ones, and their largest relative difference."""
    if isinstance(single, str) or any("losses" not in p for p in parts):
        return dict(status=single if isinstance(single, str) else "not run: the sharded run failed")
    sharded = [statistics.fmean(step) for step in zip(*(p["losses"] for p in parts))]
    diff = max(abs(a - b) / abs(b) for a, b in zip(sharded, single))
    return dict(status="ok", losses=sharded, single_losses=single, max_rel_loss_diff=diff)


def summary(rec: dict, batch: int, ctx: int, world: int) -> dict:
    """step_ms_median, step_ms_mean, tokens_per_s, tokens_per_s_per_gpu (from the slowest rank's steps) and
    peak_memory_bytes_max_over_ranks."""
    peaks = [p.get("peak_memory_bytes") for p in rec["ranks"]]
    out = dict(peak_memory_bytes_max_over_ranks=max(peaks) if None not in peaks else None)
    steps = rec.get("step_ms_max_over_ranks")
    if steps:
        mid = statistics.median(steps)
        out.update(step_ms_median=mid, step_ms_mean=statistics.fmean(steps), tokens_per_s=batch * ctx / mid * 1e3,
                   tokens_per_s_per_gpu=batch * ctx / mid * 1e3 / world)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="2.7B",
                   help="presets of analysis/torch_baseline.py (comma-separated list sweeps)")
    for k in SHAPE_OPTIONS:
        p.add_argument("--" + k.replace("_", "-"), type=int, help="custom shape (all four instead of --model)")
    p.add_argument("--vocab-size", type=int, default=10000)
    p.add_argument("--context-length", default="128", help="(list sweeps)")
    p.add_argument("--batch-size", default="4",
                   help="global batch: the same sequences on every rank of a tensor-parallel group, B/dp per "
                        "data-parallel group (list sweeps)")
    p.add_argument("--precision", default="fp32",
                   help="fp32 | bf16 (autocast; with a dp dimension FSDP2's MixedPrecisionPolicy) (list sweeps)")
    p.add_argument("--setup", default="eager,compiled",
                   help="eager | compiled (each block, after the split) (list sweeps)")
    p.add_argument("--sequence-parallel", default="off",
                   help="off | on: the norms and the residual stream split along the sequence (SequenceParallel), "
                        "the row-parallel outputs reduce-scattered (list sweeps)")
    p.add_argument("--tp", type=int, default=0,
                   help="tensor-parallel degree (0: every rank); smaller: a 2-D (dp, tp) mesh, FSDP2 over dp")
    p.add_argument("--check-against-single", action="store_true",
                   help="also train one unsharded model on rank 0 for as many steps and record the largest "
                        "relative difference of the per-step losses")
    add_timing_options(p)
    args = p.parse_args(argv)
    rank, world_size, local_rank = distributed_env()
    try:
        args.batch_sizes = [int(x) for x in split(args.batch_size)]
        args.contexts = [int(x) for x in split(args.context_length)]
        check_args(args)
    except ValueError as e:
        return refuse("torch_tp.py", rank, str(e))
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"torch_tp.py: error: PyTorch is needed ({e})", file=sys.stderr)
        return 2
    import torch_baseline as baseline
    try:
        shapes = model_shapes(args, baseline.PRESETS)
        tp, dp = check_split(args, shapes, world_size)
    except ValueError as e:
        return refuse("torch_tp.py", rank, str(e))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        if "bf16" in split(args.precision):
            return refuse("torch_tp.py", rank, "--precision bf16 is a GPU comparison; on the CPU use fp32")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as llmhpc without --tf32
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world_size)
    from torch.distributed.device_mesh import init_device_mesh
    if dp == 1:  # one tensor-parallel group of every rank
        mesh = init_device_mesh(device.type, (tp,), mesh_dim_names=("tp",))
        env = dict(tp_mesh=mesh, dp_mesh=None)
    else:  # tp innermost: ranks r and r+1 split the same matrices
        mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        env = dict(tp_mesh=mesh["tp"], dp_mesh=mesh["dp"])
    env.update(rank=rank, world_size=world_size, device=device, tp=tp, dp=dp)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    try:
        for setup in split(args.setup):
            for precision in split(args.precision):
                for shape in shapes:
                    for ctx in args.contexts:
                        for batch in args.batch_sizes:
                            for sp in split(args.sequence_parallel):
                                dist.barrier()
                                t0 = time.time()
                                part = run_config(torch, baseline, args, env, shape, ctx, batch, precision, setup,
                                                  SEQUENCE_PARALLEL[sp], args.heat_s)
                                wall_s = time.time() - t0  # the check's unsharded run apart
                                single = None
                                if args.check_against_single and rank == 0 and "losses" in part:
                                    try:
                                        single = single_losses(torch, baseline, args, device, shape, ctx, batch,
                                                               precision, len(part["losses"]))
                                    except Exception as e:  # noqa: BLE001  (OOM included) the check's status
                                        single = f"error: {type(e).__name__}: " + (str(e).splitlines() or [""])[0]
                                parts = [None] * world_size if rank == 0 else None
                                dist.gather_object(part, parts, dst=0)
                                if rank != 0:
                                    continue
                                name, d, d_ff, layers, heads = shape
                                rec = dict(tool="pytorch-tp", model=name, d_model=d, d_ff=d_ff, num_layers=layers,
                                           num_heads=heads, vocab_size=args.vocab_size, context_length=ctx,
                                           batch_size=batch, local_batch_size=batch // dp, world_size=world_size,
                                           tp=tp, dp=dp, precision=precision, setup=setup,
                                           sequence_parallel=SEQUENCE_PARALLEL[sp], loss_parallel=True,
                                           autocast=precision == "bf16" and dp == 1,
                                           fsdp2=dict(reshard_after_forward=True,
                                                      param_dtype="bf16" if precision == "bf16" else "fp32",
                                                      reduce_dtype="fp32") if dp > 1 else None,
                                           warmup=args.warmup, steps=args.steps, torch_version=torch.__version__,
                                           device_name=device_name, backend=dist.get_backend(),
                                           wall_s=wall_s, **merged(parts))
                                rec.update(summary(rec, batch, ctx, world_size))
                                if args.check_against_single:
                                    rec["check"] = check_record(parts, single)
                                    for q in rec["ranks"]:
                                        q.pop("losses", None)  # in the check, once
                                with open(args.out, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
                                losses = [q["final_loss"] for q in parts if q.get("final_loss") is not None]
                                check = rec.get("check", {})
                                print(f"{name} T={ctx} B={batch} {precision} {setup} TP {tp}"
                                      f"{f' x FSDP2 {dp}' if dp > 1 else ''} sequence parallel {sp}: " +
                                      (f"slowest-rank step {rec['step_ms_mean']:.2f} ms (mean), "
                                       f"{rec['tokens_per_s']:.0f} tokens/s, final loss "
                                       f"{sum(losses) / len(losses):.6f} (mean over ranks)"
                                       if rec["status"] == "ok" else rec["status"]) +
                                      (f"; against one unsharded model: max relative loss difference "
                                       f"{check['max_rel_loss_diff']:.2e} over {len(check['losses'])} steps"
                                       if "max_rel_loss_diff" in check else
                                       f"; check {check['status']}" if check else ""), flush=True)
    finally:
        env = mesh = None  # the meshes let go before its group: one left to the exit can abort the process
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The reference reports' back-of-envelope models as a tool (the reference communication study's
communication_accounting (a)-(d) and the reference DDP study's ddp_bucketed (b)), each with the
measured number beside it where llmhpc measured one.

    python3 analysis/accounting.py memory                       # (a) the reference FFN-only XXL model
    python3 analysis/accounting.py memory --model xl --batch 4 --context 128 --ddp results/ddp-...
    python3 analysis/accounting.py fsdp                         # (b) devices for FSDP (95 GB, TPU v5p)
    python3 analysis/accounting.py tp-batch                     # (c) compute-bound batch, (d) what tricks buy
    python3 analysis/accounting.py bucket --comm results/comm-... [--ddp results/ddp-...]   # ddp_bucketed (b)
    python3 analysis/accounting.py tp --single results/one-gpu --train results/tp2 [--train ...] \
        (--comm results/comm-... | --busbw 260e9)     # a tensor-parallel step predicted and measured

memory: parameters P of the model (the reference communication study's blocks of two d_model x d_ff
  matrices, or an llmhpc transformer: --model or --d-model/--d-ff/--num-layers/--vocab-size), the
  fp32 training state: weights 4P, gradients 4P, AdamW's m and v 8P bytes; the activations backward
  keeps, in --act-bytes per value (bf16: 2): blocks x batch x tokens x (d_model + d_ff) (the
  reference communication study's count); the devices of --device-memory needed to hold the state.
  With --ddp DIR (an llmhpc --mode ddp run of that model): the measured bytes of each category
  (memory_after_optimizer_<category>_bytes of the largest rank) beside what the run's first
  configuration keeps per rank between steps under its stage, precision and --share-weights
  (state_split_per_rank); activations, which backward frees, as peak_memory_bytes above that.
fsdp: per device M_state / N + M_act / 2 + M_act / (2N) (the reference communication study's
  split), the least N that fits --device-memory.
tp-batch: FSDP over X devices and tensor parallelism over Y (the reference communication
  study's TPU v5p numbers by default): per block and device compute 4 B d d_ff / Y FLOPs at C FLOP/s against the
  all-gather of the weights M_X (X-1)/X d d_ff / Y x 2 bytes and the activations' all-reduce
  M_Y 2 (Y-1)/Y B d x 2 bytes at W bytes/s; compute-bound from B* on, global batch B* M_X M_Y;
  (d): B* with the weights sent in 1 byte (fp8), with twice the bandwidth, with half the weight
  all-gathers (weights cached).
bucket: o (per collective) and w (bytes/s) from an all-reduce sweep (llmhpc --mode comm, as
  analysis/ddp.py fits them), the optimum b* = sqrt(s o w) for s gradient bytes (--grad-bytes,
  or the ddp run's), and with --ddp the measured bucket sweep beside the model's T_over.
tp: a tensor-parallel train run's step predicted from one GPU's and the collectives: the one-GPU
  step at the same batch per tensor-parallel group (--single, an llmhpc --mode train run on one
  GPU) divided by tp, plus the collectives inside the layers, c o + S / B for the run's c
  collectives and S bus bytes per step (tp_collectives_per_step, tp_bus_bytes_per_step) with o
  and w fitted to an all-reduce sweep on tp ranks (--comm, as bucket fits them; B = w 2 (tp-1)/tp
  its bus bandwidth; a sweep on other ranks is extended to tp as a ring, analysis/scaling.py's
  ring_ms) or S / --busbw; beside the measured median step (steps after the first
  two) of each --train run. The data-parallel reduction across groups (dp > 1) is taken as hidden
  behind backward: its exposed part is what the measured step has beyond the prediction.
state_bytes_per_rank (a function): the model state one rank holds between steps under each
  --shard-optimizer stage (none, broadcast, zero1, zero2, zero3), beside the measured memory in
  analysis/ddp.py's table (h) and in memory --ddp; fsdp_state_per_device: the FSDP model's M_state / N.
Numbers in decimal GB (1e9) as the reference communication study writes them. Files are read
only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table  # noqa: E402
from ddp import allreduce_model, bucket_model_table, bucket_optimum, load, optimum_text, setup_title  # noqa: E402
from llmhpc_h5 import MIB, SchemaError, grad_dtype, label_precision, open_run  # noqa: E402
from scaling import BUS_FACTOR, allreduce_at, at_size, bus_bandwidth  # noqa: E402

GB = 1e9
# llmhpc's presets (src/model/config.cpp): d_model, d_ff, layers, heads.
PRESETS = {"tiny": (512, 1344, 4, 16), "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
           "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}
STATE = (("weights", 4), ("gradients", 4), ("optimizer (AdamW m, v)", 8))  # fp32 bytes per parameter
MEASURED = {"weights": "params", "gradients": "grads", "optimizer (AdamW m, v)": "optimizer"}


def parameters(d_model: int, d_ff: int, layers: int, vocab: int | None) -> int:
    """The reference communication study's FFN-only blocks (vocab None: 2 d d_ff per block) or an llmhpc transformer
    (attention 4 d^2 + SwiGLU 3 d d_ff + 2 norm gains per block, embedding and LM head, final norm)."""
    if vocab is None:
        return layers * 2 * d_model * d_ff
    return layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) + 2 * vocab * d_model + d_model


def fp32_read_parameters(d_model: int, layers: int, vocab: int) -> int:
    """F: the parameters an llmhpc transformer reads in the parameter dtype (fp32) even under
    --precision bf16: the embedding (a lookup, not a product) and the norm gains (two per block and
    the final one). The matrices (attention, SwiGLU, the LM head) are read in bf16."""
    return vocab * d_model + (2 * layers + 1) * d_model


def fsdp_state_per_device(params: int, devices: int) -> float:
    """The reference communication study's FSDP state per device: M_state / N with M_state = 16 P
    (fp32 weights, gradients, AdamW's m and v), the state while the gradients exist."""
    return 16 * params / devices


def state_split_per_rank(params: int, ranks: int, stage: str, precision: str = "fp32",
                         share_weights: str = "master", grad_dtype: str | None = None, fp32_params: int = 0) -> dict:
    """What one rank holds of the model state between steps (after the optimizer, before the next
    forward) under a --shard-optimizer stage: {"params", "grads", "optimizer": bytes, and each's
    "<category>_formula"; "formula": their sum} in P (parameters), n (ranks) and F (fp32_params).
    Padding is not counted: each shard is padded to ranks x 64 elements per lane of each unit, or
    to whole pages where the pages of masters others own are given back, so measured memory is
    above this by a few pages.

    With w the bytes of a master weight (4; 8 under fp64) and G those of a gradient (w, or 2 with
    --grad-dtype bf16):
      none       w P masters + G P gradients + 2w P AdamW m, v; under bf16 also the 2P bf16 copy
                 the model reads.
      broadcast, zero1
                 as none but m, v of 1/n: 2w P / n. With --share-weights master the bf16 copy is
                 not held between steps (each rank casts it again in the next forward). With
                 --share-weights bf16 (bf16 only) the copy travels and is held (2P), and of the
                 masters a rank keeps those it updates (w P / n) and those the model reads in
                 fp32 (F, the embedding and norm gains: w F, as the largest rank, which owns none
                 of them, holds them); the pages of the others are given back. fp32_params = 0
                 approximates this as w P / n.
      zero2      its shard of the masters and of m, v: 3w P / n, and every unit's weights kept
                 gathered in the dtype the model reads them: w P under fp32; under bf16 the
                 matrices in bf16 and the embedding and norm gains in fp32, 2 (P - F) + w F
                 (fp32_params = 0: 2P, a good approximation where the embedding is a small part
                 of the model). Its shard of the gradients lives from backward to the optimizer only.
      zero3      3w P / n: nothing gathered between steps, no gradients.
    Raises ValueError for another stage.
    """
    w = 8 if precision == "fp64" else 4
    g = 2 if grad_dtype == "bf16" else w
    p, n, f = float(params), max(int(ranks), 1), float(min(max(fp32_params, 0), params))
    bf16 = precision == "bf16"
    if stage == "none":
        parts = dict(params=(w * p + 2 * p, f"{w}P + 2P") if bf16 else (w * p, f"{w}P"),
                     grads=(g * p, f"{g}P"), optimizer=(2 * w * p, f"{2 * w}P"))
    elif stage in ("broadcast", "zero1"):
        if bf16 and share_weights == "bf16":
            masters = (min(w * p, w * p / n + w * f), f"2P + {w}P/n" + (f" + {w}F" if f else ""))
            parts = dict(params=(2 * p + masters[0], masters[1]))
        else:
            parts = dict(params=(w * p, f"{w}P"))
        parts.update(grads=(g * p, f"{g}P"), optimizer=(2 * w * p / n, f"{2 * w}P/n"))
    elif stage in ("zero2", "zero3"):
        gathered = {"zero3": (0.0, ""), "zero2": (w * p, f" + {w}P") if not bf16 else
                    (2 * (p - f) + w * f, f" + 2(P-F) + {w}F") if f else (2 * p, " + 2P")}[stage]
        parts = dict(params=(w * p / n + gathered[0], f"{w}P/n{gathered[1]}"), grads=(0.0, "0"),
                     optimizer=(2 * w * p / n, f"{2 * w}P/n"))
    else:
        raise ValueError(f"unknown stage {stage!r} (none, broadcast, zero1, zero2, zero3)")
    out = {cat: value for cat, (value, _) in parts.items()}
    out.update({f"{cat}_formula": text for cat, (_, text) in parts.items()})
    out["formula"] = " + ".join(text for _, text in parts.values() if text != "0")
    return out


def state_bytes_per_rank(params: int, ranks: int, stage: str, precision: str = "fp32", share_weights: str = "master",
                         grad_dtype: str | None = None, fp32_params: int = 0) -> float:
    """The model state one rank holds between steps: params + grads + optimizer of
    state_split_per_rank (which says what each stage holds)."""
    split = state_split_per_rank(params, ranks, stage, precision, share_weights, grad_dtype, fp32_params)
    return split["params"] + split["grads"] + split["optimizer"]


def activation_bytes(args) -> float:
    return args.num_layers * args.batch * args.context * (args.d_model + args.d_ff) * args.act_bytes


def shape(args) -> tuple:
    if args.model:
        args.d_model, args.d_ff, args.num_layers, _ = PRESETS[args.model]
        args.vocab_size = args.vocab_size or 10000
    return parameters(args.d_model, args.d_ff, args.num_layers, args.vocab_size)


def measured_memory(directory: str) -> dict:
    """{category: bytes} after the optimizer (the largest rank), the run's world size and sharding."""
    run = open_run(directory)
    recs = [r for r in run.records("ddp", rank=None) if r.ok]
    if not recs:
        raise SchemaError(f"--ddp {directory}: no ddp record that ran")
    first = recs[0]
    mine = [r for r in recs if r.name == first.name]
    out = {cat: max(r.attrs.get(f"memory_after_optimizer_{cat}_bytes", 0) for r in mine)
           for cat in ("params", "grads", "optimizer")}
    # Backward frees the activations and its scratch, so after the step only the batch is left of
    # them: what a step holds above that point at its peak is what it kept for backward.
    out["activations"] = max(r.attrs.get("peak_memory_bytes", 0) - r.attrs.get("memory_after_optimizer_bytes", 0)
                             + r.attrs.get("memory_after_optimizer_activations_bytes", 0) for r in mine)
    a = first.attrs
    # The ranks that share one copy of the state: every rank, or under zero2 and zero3 --shard-group's.
    return dict(out, num_params=int(a["num_params"]), world_size=run.world_size,
                shape={k: int(a[k]) for k in ("d_model", "d_ff", "num_layers", "vocab_size")},
                shard_group=int(a.get("shard_group", run.world_size)), name=first.name,
                sharding=a.get("shard_optimizer") or "none", precision=label_precision(a),
                model=dict(precision=a["precision"], share_weights=a.get("share_weights", "master"),
                           grad_dtype=grad_dtype(a),
                           fp32_params=fp32_read_parameters(int(a["d_model"]), int(a["num_layers"]),
                                                            int(a["vocab_size"]))))


def gb(value: float) -> str:
    """Decimal GB as the reference communication study writes them: two decimals, four significant digits below 1 GB."""
    return f"{value / GB:.2f}" if value >= GB else f"{value / GB:.4g}"


def memory(args) -> str:
    p = shape(args)
    measured = measured_memory(args.ddp) if args.ddp else None
    if measured:  # the run's model throughout (its activations too), whatever the shape options said
        differs = [f"--{k.replace('_', '-')} {v}" for k, v in measured["shape"].items() if getattr(args, k) != v]
        if differs:
            print(f"accounting.py: note: the model of --ddp {args.ddp} ({', '.join(differs)}) in place of the "
                  "shape options", file=sys.stderr)
        for k, v in measured["shape"].items():
            setattr(args, k, v)
        args.model = None
        p = shape(args)
    if measured and measured["num_params"] != p:
        note = f" (the model's formula gives {p:,}; the run's num_params {measured['num_params']:,} is used)"
        p = measured["num_params"]
    else:
        note = ""
    # Beside a run, what its stage keeps per rank between steps (state_split_per_rank); else fp32 unsharded.
    split = measured and state_split_per_rank(p, measured["shard_group"], measured["sharding"], **measured["model"])
    rows, total = [], 0.0
    for name, per_param in STATE:
        b, formula = (split[MEASURED[name]], split[f"{MEASURED[name]}_formula"]) if split else \
            (per_param * p, f"{per_param} P")
        total += b
        m = measured and measured[MEASURED[name]]
        rows.append([name, formula, gb(b),
                     f"{m / GB:.4g}" if measured else "-", fmt(m / b) if measured and b else "-"])
    act = activation_bytes(args)
    rows.append(["activations", f"{args.act_bytes} B x {args.num_layers} x {args.batch} x {args.context} x "
                 f"(d_model + d_ff)", gb(act),
                 f"{measured['activations'] / GB:.4g}" if measured else "-", "-"])
    rows.append(["state (weights + gradients + optimizer)", split["formula"] if split else "16 P", gb(total), "-",
                 "-"])
    full = 16 * p  # the devices the fp32 state needs, whatever the run's stage
    devices = math.ceil(full / args.device_memory)
    per_batch = args.num_layers * args.context * (args.d_model + args.d_ff) * args.act_bytes / GB
    count = f"{p / 1e9:.2f} billion" if p >= 1e9 else f"{p / 1e6:.2f} million"
    head = (f"### (a) memory: P = {p:,} parameters ({count}){note}; activations {per_batch:.5g} GB per "
            f"sequence in the batch\n\n")
    table = markdown_table(["What", "Model", "Model (GB)", "Measured (GB)", "Measured / model"], rows)
    tail = (f"\n\nThe state alone needs {gb(full)} / {args.device_memory / GB:g} = "
            f"{full / args.device_memory:.2f} -> {devices} devices of {args.device_memory / GB:g} GB.")
    if measured:
        tail += (f"\nMeasured: {args.ddp}, configuration {measured['name']} ({measured['precision']}, "
                 f"{measured['world_size']} ranks, sharding {measured['sharding']}), memory after the optimizer "
                 f"by category, largest rank, beside what that stage keeps per rank between steps "
                 f"(state_bytes_per_rank; n ranks, F the parameters read in fp32 under bf16); activations measured "
                 f"as the peak above that point (backward frees "
                 f"them: what a step holds for backward, its scratch included, above the state).")
    return head + table + tail


def fsdp_devices(state: float, act: float, device_memory: float) -> int:
    """Least N with state / N + act / 2 + act / (2N) <= device_memory (0 if none fits)."""
    free = device_memory - act / 2
    return math.ceil((state + act / 2) / free) if free > 0 else 0


def fsdp(args) -> str:
    p = shape(args)
    state, act = fsdp_state_per_device(p, 1), activation_bytes(args)
    n = fsdp_devices(state, act, args.device_memory)
    verdict = f"N_FSDP >= {n}" if n else "never fits: half the activations alone exceed a device"
    return (f"### (b) FSDP: M_per(N) = M_state / N + M_act / 2 + M_act / (2N)\n\nM_state = 16 P = {state / GB:.2f} GB, "
            f"M_act = {act / GB:.4g} GB (batch {args.batch}), device {args.device_memory / GB:g} GB: {verdict}.")


def critical_batch(d, d_ff, x, y, m_x, m_y, w, c, weight_bytes=2, act_bytes=2, gathers=1.0) -> float:
    comm_x = gathers * m_x * (x - 1) / x * d * d_ff / y * weight_bytes
    per_b_comm = m_y * 2 * (y - 1) / y * d * act_bytes / w
    per_b_comp = 4 * d * d_ff / (y * c)
    return (comm_x / w) / (per_b_comp - per_b_comm) if per_b_comp > per_b_comm else math.inf


def tp_batch(args) -> str:
    base = dict(d=args.d_model, d_ff=args.d_ff, x=args.x, y=args.y, m_x=args.m_x, m_y=args.m_y, w=args.w, c=args.c)
    b = critical_batch(**base)
    rows = [["(c) as given", f"{b:.2f}", f"{b * args.m_x * args.m_y:.0f}"]]
    for label, change in (("(d) weights all-gathered in fp8 (1 byte)", dict(weight_bytes=1)),
                          ("(d) twice the interconnect bandwidth", dict(w=2 * args.w)),
                          ("(d) half the weight all-gathers (weights cached)", dict(gathers=0.5))):
        v = critical_batch(**dict(base, **change))
        rows.append([label, f"{v:.2f}", f"{v * args.m_x * args.m_y:.0f}"])
    return ("### (c) compute-bound batch per device: t_comp = 4 B d d_ff / (Y C) >= t_comm = (comm_X + comm_Y(B)) / W\n\n"
            f"d_model {args.d_model}, d_ff {args.d_ff}, X {args.x}, Y {args.y}, M_X {args.m_x}, M_Y {args.m_y}, "
            f"W {args.w:.3g} B/s, C {args.c:.3g} FLOP/s\n\n"
            + markdown_table(["Setting", "B* per device", f"Global batch (x M_X M_Y = {args.m_x * args.m_y})"], rows))


def median_step_ms(directory: str, dataset: str = "step_ms") -> tuple:
    """(the train record's attributes, the median of `dataset` in ms after the first two steps) of
    rank 0's train record; NaN where the record lacks it (tp_comm_ms: files from before it)."""
    run = open_run(directory)
    records = run.records("train")
    if run.mode != "train" or not records:
        raise SchemaError(f"{directory}: not an llmhpc --mode train run")
    if dataset not in records[0].arrays:
        return records[0].attrs, math.nan
    steps = np.asarray(records[0].arrays[dataset], dtype=float)
    if len(steps) < 3:
        raise SchemaError(f"{directory}: {len(steps)} steps; the median leaves out the first two, so give 3 or more")
    return records[0].attrs, float(np.median(steps[2:]))


def tensor_parallel(args) -> str:
    single, t1 = median_step_ms(args.single)
    if int(single.get("world_size", 1)) != 1:
        raise SchemaError(f"--single {args.single}: a run on {single['world_size']} ranks, not one GPU")
    model = allreduce_model(args.comm) if args.comm else None
    rows = []
    for directory in args.train:
        a, measured = median_step_ms(directory)
        _, waited = median_step_ms(directory, "tp_comm_ms")
        _, busy = median_step_ms(directory, "tp_comm_busy_ms")
        tp, dp = int(a.get("tp", 1)), int(a.get("dp", a.get("world_size", 1)))
        if tp < 2:
            raise SchemaError(f"--train {directory}: no tensor parallelism (tp {tp})")
        if int(a["batch_size"]) // dp != int(single["batch_size"]) or int(a["context_length"]) != int(
                single["context_length"]):
            raise SchemaError(f"--train {directory}: {int(a['batch_size']) // dp} sequences of "
                              f"{a['context_length']} per tensor-parallel group, --single ran "
                              f"{single['batch_size']} of {single['context_length']}: give the same")
        collectives, bus = int(a["tp_collectives_per_step"]), float(a["tp_bus_bytes_per_step"])
        if model:
            # o and B at their size (at_size): all-reduces, under sequence parallelism all-gathers and
            # reduce-scatters (an all-gather's, which the comm run may have measured)
            kind = "allgather" if int(a.get("sequence_parallel", 0)) else "allreduce"
            at = at_size(model, bus / max(collectives, 1) / BUS_FACTOR[kind](tp), kind)
            comm_ms = collectives * allreduce_at(at, tp)[0] + bus / bus_bandwidth(at)
        else:
            comm_ms = bus / args.busbw * 1e3
        predicted = t1 / tp + comm_ms
        label = f"tp {tp} x dp {dp}" + (" sp" if int(a.get("sequence_parallel", 0)) else "") + (
            f" overlap {int(a['tp_overlap'])}" if int(a.get("tp_overlap", 1)) > 1 else "")
        rows.append([label, f"{t1 / tp:.1f}", f"{collectives}", f"{bus / GB:.2f}", f"{comm_ms:.1f}",
                     "-" if math.isnan(busy) else f"{busy:.1f}", "-" if math.isnan(busy) else f"{busy / comm_ms:.2f}",
                     "-" if math.isnan(waited) else f"{waited:.1f}", f"{predicted:.1f}", f"{measured:.1f}",
                     f"{measured / predicted:.3f}", f"{measured - t1 / tp:.1f}"])
    source = model["source"] if model else f"bus bandwidth {args.busbw:.3g} B/s (--busbw)"
    return (f"### Tensor-parallel step: one GPU's {t1:.1f} ms / tp + the collectives inside the layers\n\n"
            f"One GPU: {args.single} (median step {t1:.1f} ms). Collectives: {source}.\n\n"
            + "Collectives' time: their own device time on the communicator's stream, hidden or not "
              "(tp_comm_busy_ms, NCCL only, the median step), beside the predicted. "
              "Waited: what the layers waited for the collectives, measured (tp_comm_ms, the median step). The "
              "prediction counts every collective as waited for; with --tp-overlap (overlap K) forward's hide "
              "under its split products, so the measured step is expected below it.\n\n"
            + markdown_table(["Layout", "One GPU / tp (ms)", "Collectives", "Bus GB", "Predicted comm (ms)",
                              "Collectives' time (ms)", "Time measured / predicted", "Waited (ms)",
                              "Predicted step (ms)", "Measured step (ms)", "Measured / predicted",
                              "Measured - one GPU / tp (ms)"], rows))


def bucket(args) -> str:
    model = allreduce_model(args.comm)
    parts = []
    if args.ddp:
        df, _ = load(args.ddp, None)
        for _, g in df[df.shard_optimizer == "none"].groupby("setup", sort=True):
            title = setup_title(g.iloc[0])
            table = bucket_model_table(g, model, True, title)
            if table:
                parts.append(table)
            b = g[(g.ddp == "bucketed") & (g.status == "ok")]
            if len(b):
                best = b.loc[b.slowest_step_mean.idxmin()]
                ranks = int(best.world_size) // int(best.tp)  # o and w on the gradients' ring, as (e) takes them
                s = float(best.comm_bytes_per_step)
                _, o, w, _ = bucket_optimum(model, s, ranks)
                parts.append(f"Measured: the fastest bucket size is {best.bucket_mb:g} MiB ({best.slowest_step_mean:.2f} "
                             f"ms per step, the slowest rank's); the model's (above): {optimum_text(s, o, w)}.")
    if args.grad_bytes:
        # o and w of the all-reduce run's own ranks, of the line around b*, as (e) takes them.
        s = args.grad_bytes
        _, o, w, _ = bucket_optimum(model, s, int(model["world_size"]))
        parts.append(f"### ddp_bucketed (b): s = {s / MIB:.3f} MiB; at b*: o = {o * 1e3:.2f} us, "
                     f"w = {w * 1e3 / 1e9:.3g} GB/s ({model['source']})\n\n{optimum_text(s, o, w)}")
    if not parts:
        raise SchemaError("bucket needs --grad-bytes N or --ddp DIR, a bucket sweep of bucketed runs that ran (ok) "
                          "on two data-parallel ranks or more" if args.ddp else
                          "bucket needs --ddp DIR (a bucket sweep) or --grad-bytes N")
    return "\n\n".join(parts)


def size(text: str) -> float:
    """'80GB', '95e9', '16GiB' -> bytes, above 0 (argparse's type)."""
    units = {"gib": 2**30, "mib": 2**20, "gb": 1e9, "mb": 1e6, "b": 1}
    t = text.strip().lower()
    unit = next((u for u in units if t.endswith(u)), "")  # gib before b: the longest first
    try:
        value = float(t[:len(t) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': give bytes, e.g. 80GB, 16GiB or 95e9") from None
    return positive(value, text)


def positive(value: float, text: str) -> float:
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"'{text}': must be above 0")
    return value


def positive_int(text: str) -> int:
    """A whole number above 0 (argparse's type): shapes, counts and bytes per value."""
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"'{text}': give a whole number above 0")
    return int(text)


def positive_float(text: str) -> float:
    """A rate above 0 (argparse's type): bytes/s, FLOP/s."""
    try:
        return positive(float(text), text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': give a number above 0, e.g. 1.8e11") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    shapes = argparse.ArgumentParser(add_help=False)
    shapes.add_argument("--model", choices=sorted(PRESETS),
                        help="an llmhpc preset instead of the reference communication study's model")
    shapes.add_argument("--d-model", type=positive_int, default=16384)
    shapes.add_argument("--d-ff", type=positive_int, default=53248)
    shapes.add_argument("--num-layers", type=positive_int, default=126,
                        help="blocks (default: the reference communication study's 126)")
    shapes.add_argument("--vocab-size", type=positive_int, default=None,
                        help="an llmhpc transformer with this vocabulary "
                             "(default: the reference communication study's FFN-only blocks)")
    shapes.add_argument("--batch", type=positive_int, default=1, help="sequences per device for the activations (default 1)")
    shapes.add_argument("--context", type=positive_int, default=1,
                        help="tokens per sequence (default 1, as the reference communication study counts)")
    shapes.add_argument("--act-bytes", type=positive_int, default=2, help="bytes per activation value (default 2, bf16)")
    m = sub.add_parser("memory", parents=[shapes], help="(a) memory and devices needed")
    m.add_argument("--device-memory", type=size, default=80e9, help="per device (default 80GB, an H100)")
    m.add_argument("--ddp", help="an llmhpc --mode ddp run of the model: measured memory beside the model's")
    f = sub.add_parser("fsdp", parents=[shapes], help="(b) devices for FSDP")
    f.add_argument("--device-memory", type=size, default=95e9, help="per device (default 95GB, a TPU v5p)")
    t = sub.add_parser("tp-batch", help="(c) and (d): the compute-bound batch of FSDP x TP")
    t.add_argument("--d-model", type=positive_int, default=16384)
    t.add_argument("--d-ff", type=positive_int, default=53248)
    for name, default in (("--x", 16), ("--y", 4), ("--m-x", 2), ("--m-y", 1)):
        t.add_argument(name, type=positive_int, default=default)
    t.add_argument("--w", type=positive_float, default=2 * 9e10, help="interconnect bytes/s (default 1.8e11)")
    t.add_argument("--c", type=positive_float, default=4.6e14, help="FLOP/s per device (default 4.6e14)")
    b = sub.add_parser("bucket", help="ddp_bucketed (b): o, w from an all-reduce run; b* against a bucket sweep")
    b.add_argument("--comm", required=True, help="an llmhpc --mode comm run with all-reduce at two sizes or more")
    b.add_argument("--ddp", action="append", help="llmhpc --mode ddp runs with bucketed at several --bucket-mb")
    b.add_argument("--grad-bytes", type=size, help="s, the gradient bytes per step (e.g. 4 x parameters)")
    p = sub.add_parser("tp", help="a tensor-parallel train run's step: one GPU's / tp + the collectives, and measured")
    p.add_argument("--single", required=True, help="an llmhpc --mode train run on one GPU at the group's batch")
    p.add_argument("--train", required=True, action="append", help="llmhpc --mode train runs with --tp")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--comm", help="an llmhpc --mode comm all-reduce sweep on tp ranks (o and w fitted)")
    g.add_argument("--busbw", type=positive_float, help="the collectives' bus bandwidth, bytes/s")
    args = parser.parse_args(argv)
    try:
        text = {"memory": memory, "fsdp": fsdp, "tp-batch": tp_batch, "bucket": bucket,
                "tp": tensor_parallel}[args.what](args)
    except SchemaError as e:
        print(f"accounting.py: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

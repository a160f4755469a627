"""Strong and weak scaling of llmhpc --mode ddp runs at several rank counts (jobs/scaling.sh),
with projections to larger clusters from the ring model of each stage's collectives (the reference DDP
study's bucket model, extended to the sharded stages); ddp.report_section calls it.

    report(df, comm_models, out_dir) -> markdown: the study in short (per layout its efficiency and
        tokens/s per GPU at the most ranks measured, the fastest layout there, steps within their
        noise said not to be told apart, each with its standard error (each configuration ran
        once: a close choice is worth a second job),
        and warnings: the model off, ranks that shared cores), every configuration in one table
        (a sharding stage over a data-parallel group of one rank listed with its unsharded twin,
        which computes the same, the pair named once in the choice of layout; tokens/s per GPU
        against one GPU's, MFU and the model FLOP/s it divides, peak memory, exposed
        communication beside the ring model's and the collectives' run it was fitted from, with the
        collectives whose sizes lie outside those that run measured, under tensor parallelism the
        wait for the group's collectives), then each series' table (points where ranks shared cores
        marked); scaling.png (tokens/s per GPU and efficiency against ranks, each measured point's
        nodes, a colour and marker per layout; points where ranks shared cores hollow; projections
        faint and dotted where the model is off or unchecked, or ranks shared cores, at the most ranks
        measured) in out_dir
    On CPU runs the tables and the plot say "per rank" where GPU runs say "per GPU".

A series is one model, context, precision, strategy, bucket size, sharding, tensor parallelism and
transport measured at two or more rank counts n (a sharded series whose every point has one
data-parallel rank is the unsharded series again and is left out: unsharded_twin):
  strong: the same global batch B at every n; speed-up S(n) = T(n0) / T(n) and efficiency
          E(n) = n0 T(n0) / (n T(n)), n0 the fewest ranks measured (1 in scaling.sh);
  weak:   the global batch B = b n at every n, b fixed (under tensor parallelism each group's tp
          GPUs take its tp b sequences together); the scaled speed-up S(n) = (n / n0) T(n0) / T(n)
          (n / n0 times the work in each step) and efficiency E(n) = n0 S(n) / n = T(n0) / T(n).
The tables' batch per data-parallel rank is B / (n / tp): a tensor-parallel group's ranks take the
same sequences. Efficiencies are against the one-rank run, so a layout whose ranks each do their
share faster than one rank did the whole passes 100%; the tables say so where one does.
A sharded or tensor-parallel series' n0 = 1 run is the strategy's unsharded one on one rank.
T is the reference DDP study's step time: the mean over the timed steps of the slowest rank's step.
Per configuration also tokens/s per GPU, B x context / (T n), and the model FLOPs utilisation,
MFU = tokens/s per GPU x F / peak, with one definition of the model's FLOPs per token (llm.c's;
torchtitan and PaLM count the attention whole, 12 L d T), the same as the rank files'
model_flops_fwd_bwd: F = 6 N + 6 L d T, N the parameters the matrix products multiply (every
layer's 4 d^2 + 3 d d_ff and the LM head's V d; the embedding lookup multiplies nothing), and the
attention scores and their product with the values 12 L d T per token, causal counted as half;
peak the GPU's dense rate at the products' arithmetic from PEAK_FLOPS, by the device's name: bf16
and, for fp32 under --tf32, tf32 on the tensor cores, fp32 without them; '-' where the device is not
in it (the CPU) or has no such rate (fp64).
Transport: a run folder whose name ends in "-net" ran with NCCL's network transport forced
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, jobs/scaling.sh NET=1), as the folder name says.

Predictions take the ring model of the collectives from a run of them (llmhpc --mode comm: each
size's back-to-back time per operation, averaged over ranks, fp32 in place) over the same transport
(model_for): one on as many nodes as the configuration ran on (the links it used)
before one on other nodes, then one on its data-parallel ranks, else the most ranks; the study
table names that run, its ranks and nodes, and marks a configuration whose nodes are not the run's
(jobs/scaling.sh measures the collectives at every rank count it trains at, placed as those runs).
Projections (every such row and point labelled "projection") extend a series to more ranks n by
the ring model of the collectives, from a run of them on n0 ranks: o (per
collective) and w (bytes/s, as ddp.allreduce_model measures them) of the line through the two
sizes measured around each collective's (at_size; its own collective where the run measured it,
else the all-reduce moving as many bytes), the bus bandwidth B = w 2(n0-1)/n0 kept on any ring
and o growing with the ring's steps, o(k) = o (k-1)/(n0-1), so
that on a ring of k ranks (ring_ms) an all-reduce whose buffer is S bytes takes o(k) + 2(k-1)/k S / B,
a reduce-scatter or all-gather o(k) + (k-1)/k S / B and a broadcast o(k) + S / B (the bus factors
of nccl-tests, which comm_bus_bytes_per_step counts with). A projected step is the passes
(forward + backward at the most ranks measured, n_m, less the parameters' wait the model puts in
that forward, divided by n / n_m (strong, while the global batch splits into whole sequences per
rank) or kept (weak)), plus the update (the optimizer and what the step spends after it at n_m: kept
unsharded, under zero1-3 times g(n_m) / g(n), the ranks its state is sharded over, in both series),
plus, at n (stage_comm_ms), with s the gradients' bytes in c collectives
(comm_bytes_per_step, buckets) and S_p the parameters' in c_p (param_comm_bytes_per_step,
param_collectives_per_step), g the ranks of a shard group (n, or --shard-group's, kept) and
m = n / g the groups:
  the gradients' collectives left after backward: none and broadcast all-reduce s over n; zero1
    reduce-scatters G = s over g, bucket by bucket, zero2 and zero3 unit by unit (the embedding,
    each layer, the head); with groups (hybrid) each part, G / g, is then all-reduced over m, c more
    collectives (s counts both there: s = G + G / g). Overlapping strategies (overlap, bucketed;
    zero2 and zero3 reduce as bucketed) leave every collective's o and the bytes of the last one:
    1 / c of them (the reference bucket model's equal buckets: unsharded T_over = c o(n) +
    s / (c w(n)), w(n) = B / (2(n-1)/n)); zero2 and zero3, whose backward writes each unit's
    gradients into one of two windows and so ends at most two units ahead of their reductions, the
    last two units' (the first layer's and the embedding's): 2 o(n) and their bytes; never less than
    all of them less backward's time, what cannot hide behind backward, which binds on slow
    networks. naive and flat: all of them, after backward;
  the parameters' wait: broadcast broadcasts S_p (one per owner) before forward reads any, all
    waited for; zero1 and zero2 all-gather S_p within the group after the optimizer, the next
    forward waiting for c_p o and the first (S_p / c_p under zero1, the embedding's under zero2),
    never less than all of them less forward's time; zero3 all-gathers each unit before forward and
    again before backward reads it, one ahead: c_p o and the embedding's, never less than all of them
    less forward's and backward's time.
The projected steps are then scaled by T(n_m) over the model's step at n_m (the factor is in the
Source column), so that a projection starts from the step measured at the most ranks. Where the
exposed communication measured there is off the model's by more than MODEL_TRUSTED allows (measured /
predicted outside [0.67, 1.5], by at least 5% of the step), the study table flags the configuration and the series' projections
say they are not to be trusted: the factor then rescales a model that does not describe the run.
So do the projections of a series whose most ranks measured are one data-parallel rank (tp x 1),
where no gradients' collective ran to check the model (projection_unchecked), and of one whose
most ranks measured shared cores, where the step measures the ranks' contention (projection_shared).
Under tensor parallelism (--tp) n counts the n / tp data-parallel ranks, and the collectives inside
the layers are part of the compute, scaled with it (the study table's TP wait: what the layers
waited for them, inside forward and backward). analysis/ddp.py's table (i) sets the same model
beside what each sharded configuration measured.
"""
from __future__ import annotations

import bisect
import math
import os
import sys
from typing import NamedTuple

import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table, section_script  # noqa: E402

# What two configurations must share to be compared as the same model on the same ranks' hardware.
MODEL_KEYS = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length", "precision", "grad_dtype",
              "attention", "backend", "transport")
SERIES_KEYS = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length", "precision", "grad_dtype",
               "attention", "tp", "sequence_parallel", "tp_overlap", "ddp", "bucket_mb", "shard_optimizer", "backend", "transport")
OVERLAPPING = ("overlap", "bucketed")
# Measured over predicted exposed communication outside these bounds: the ring model is off for that
# configuration, and projections built on it are flagged (a loaded host, ranks sharing cores, a
# transport the collectives' run did not measure).
MODEL_TRUSTED = (0.67, 1.5)
# ... and only where the difference is at least this share of the step: over NVLink the model
# charges every bucket's latency after backward (4.6 ms at xl, 3% of its 135 ms step) where
# 0.5-0.8 ms were measured (docs/results/scaling.md), which moves a projection by that little.
MODEL_NEGLIGIBLE = 0.05
# Two layouts' steps closer than this share of the faster one, or than TIE_SIGMAS standard errors
# of the difference of their means where larger, tie: which is faster is within what the timed
# steps let one tell apart (two standard errors: a difference of equal means exceeds it 5% of the time).
TIE_SHARE = 0.01
TIE_SIGMAS = 2.0
# Dense peak FLOP/s (no 2:4 sparsity) by (device name contains, precision), from the vendors' data
# sheets (SXM parts; sparse rates halved): bf16 and tf32 on the tensor cores (tf32: fp32 products
# under --tf32), fp32 without them. The first name contained wins: GB200 before B200, H200 (and
# GH200) before H20.
PEAK_FLOPS = {("GB200", "bf16"): 2.5e15, ("GB200", "tf32"): 1.25e15, ("GB200", "fp32"): 80e12,
              ("B200", "bf16"): 2.25e15, ("B200", "tf32"): 1.1e15, ("B200", "fp32"): 75e12,
              ("H100", "bf16"): 989.4e12, ("H100", "tf32"): 494.7e12, ("H100", "fp32"): 66.9e12,
              ("H200", "bf16"): 989.4e12, ("H200", "tf32"): 494.7e12, ("H200", "fp32"): 66.9e12,
              ("H800", "bf16"): 989.4e12, ("H800", "tf32"): 494.7e12, ("H800", "fp32"): 66.9e12,
              ("H20", "bf16"): 148e12, ("H20", "tf32"): 74e12, ("H20", "fp32"): 44e12,
              ("L40S", "bf16"): 362.05e12, ("L40S", "tf32"): 183e12, ("L40S", "fp32"): 91.6e12,
              ("A100", "bf16"): 312e12, ("A100", "tf32"): 156e12, ("A100", "fp32"): 19.5e12,
              ("A800", "bf16"): 312e12, ("A800", "tf32"): 156e12, ("A800", "fp32"): 19.5e12}


def flops_per_token(row) -> float:
    """The model FLOPs of one token's forward and backward (see the module doc)."""
    d, f, layers, vocab, t = (float(row[k]) for k in ("d_model", "d_ff", "num_layers", "vocab_size", "context_length"))
    matmul = layers * (4 * d * d + 3 * d * f) + vocab * d
    return 6 * matmul + 6 * layers * d * t


def peak_flops(device_name: str, precision: str) -> float:
    """PEAK_FLOPS' rate of the device at `precision` (bf16, tf32 or fp32); NaN where it has none."""
    for (name, p), peak in PEAK_FLOPS.items():
        if name in str(device_name) and p == precision:
            return peak
    return math.nan


def throughput(row, n: int, batch: int, step_ms: float) -> tuple:
    """(tokens/s per GPU, MFU) of `batch` sequences a step over n ranks at step_ms."""
    per_gpu = batch * float(row["context_length"]) / (step_ms / 1e3) / n
    precision = "tf32" if row["precision"] == "fp32" and bool(row.get("tf32", False)) else row["precision"]
    return per_gpu, per_gpu * flops_per_token(row) / peak_flops(row.get("device_name", ""), precision)


def flops_unit(per: str) -> tuple:
    """The achieved model FLOP/s' unit and scale: TFLOP/s per GPU, GFLOP/s per rank on CPUs."""
    return ("TFLOP/s", 1e12) if per == "GPU" else ("GFLOP/s", 1e9)


def model_flops_cell(row, tokens_per_gpu: float, per: str) -> str:
    """The model FLOP/s one GPU (rank) achieved, in flops_unit(per): what MFU divides by the peak,
    shown where no peak is known (CPUs) too."""
    value = tokens_per_gpu * flops_per_token(row) / flops_unit(per)[1]
    return "-" if math.isnan(value) else f"{value:.3g}"


def transport(directory: str) -> str:
    return "network" if os.path.basename(os.path.normpath(directory)).endswith("-net") else "default"


def unit(df: pd.DataFrame) -> str:
    """What the tables count per: 'GPU', or 'rank' where every run ran on CPUs (no GPU to count)."""
    names = [str(n) for n in df.get("device_name", [])]
    return "rank" if names and all(n.startswith("cpu") for n in names) else "GPU"


def gib(nbytes: float) -> str:
    """Bytes in GiB: 3 decimals from 1 GiB, 3 significant digits below it (a small model's 26 MiB
    reads 0.0254, not 0.000)."""
    if not nbytes >= 0:
        return "-"
    value = nbytes / 2**30
    return f"{value:.3f}" if value >= 1 else f"{value:#.3g}"


def ok_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The configurations that ran, with the transport their run folder names."""
    ok = df[df.status == "ok"]
    return ok.assign(transport=[transport(d) for d in ok.run], gpu_batch=ok.batch_size / ok.world_size)


# What makes two configurations the same but for the optimizer's sharding stage.
TWIN_KEYS = MODEL_KEYS + ("world_size", "batch_size", "tp", "sequence_parallel", "tp_overlap", "ddp", "bucket_mb")


def unsharded_twin(ok: pd.DataFrame, r):
    """Where r shards the optimizer's state over a data-parallel group of one rank (tp x dp 1, or one
    rank), which shards nothing: the index of the same configuration unsharded, which computes the
    same; None where r is no such configuration or that one did not run."""
    if r.shard_optimizer == "none" or int(r.world_size) // int(r.tp) > 1:
        return None
    keys = [k for k in TWIN_KEYS if k in ok.columns]
    same = ok[ok.shard_optimizer == "none"]
    same = same[(same[keys] == pd.Series({k: r[k] for k in keys})).all(axis=1)]
    return None if same.empty else same.index[0]


def twin_pairs(ok: pd.DataFrame) -> list:
    """[(configuration, its unsharded twin)], rows of ok, for every configuration that has one."""
    return [(r, ok.loc[t]) for _, r in ok.iterrows() for t in [unsharded_twin(ok, r)] if t is not None]


def twin_drift(ok: pd.DataFrame) -> float:
    """The most two configurations that compute the same (twin_pairs) differed by in step, over
    the faster's: the stage's own work at one rank (a collective of one rank copies) plus how far
    configurations run in turn drift apart beyond their own steps' noise; 0 where no such pair ran."""
    steps = [(float(r.slowest_step_mean), float(t.slowest_step_mean)) for r, t in twin_pairs(ok)]
    return max((abs(a - b) / min(a, b) for a, b in steps if min(a, b) > 0), default=0.0)


def ran_once_note(order: pd.DataFrame) -> str:
    """The caveat under a choice of layout: each configuration ran once, and (where twins ran) how far
    configurations computing the same differed."""
    drift = twin_drift(order)
    return ("Each configuration ran once, in turn: \"not told apart\" counts its timed steps' noise, not how far the host's speed "
            "drifts between configurations"
            + (f" (configurations computing the same differed by up to {100 * drift:.1f}%)" if drift > TIE_SHARE
               else "")
            + ". Where layouts are close, run again to confirm the choice.")


def model_name(r) -> str:
    """A configuration's model as the tables name it: its size, or 'd64_L2' for a custom shape."""
    return r.model if r.model != "custom" else f"d{r.d_model}_L{r.num_layers}"


def layout(r) -> str:
    """A configuration's parallelism as the tables name it: 'bucketed 25 MiB, zero1, tp 2 sequence parallel'."""
    strategy = r.ddp if r.ddp != "bucketed" else f"bucketed {r.bucket_mb:g} MiB"
    return (strategy + ("" if r.shard_optimizer == "none" else f", {r.shard_optimizer}")
            + ("" if r.tp == 1 else f", tp {r.tp}{' sequence parallel' if r.sequence_parallel else ''}"
               + (f" products in {r.tp_overlap} chunks" if r.tp_overlap > 1 else ""))
            + ("" if r.transport == "default" else ", network transport"))


def one_gpu(ok: pd.DataFrame, r, batch_key: str, batch: int, same_strategy: bool = False):
    """The index of the one-rank run that r's configuration is compared with: the same model, context,
    precision and transport, unsharded, no tensor parallelism, `batch` in batch_key (batch_size, or
    gpu_batch: the global batch over the ranks, what a weak series keeps; r's strategy
    preferred, any other next unless same_strategy: on one rank they differ only by overheads);
    None where there is none."""
    keys = [k for k in MODEL_KEYS if k in ok.columns]
    same = ok[(ok.world_size == 1) & (ok.tp == 1) & (ok.shard_optimizer == "none") & (ok[batch_key] == batch)]
    same = same[(same[keys] == pd.Series({k: r[k] for k in keys})).all(axis=1)]
    if same.empty:
        return None
    mine = same[(same.ddp == r.ddp) & (same.bucket_mb == r.bucket_mb)]
    if mine.empty and same_strategy:
        return None
    return (mine if not mine.empty else same).index[0]


def series(df: pd.DataFrame, per: str = "GPU"):
    """Yields (kind, setup, layout, rows by world size) for every strong and weak series of ok runs
    (setup: the model, context, batch and precision, the batch per `per` under weak scaling; layout:
    the parallelism, layout()). A series
    of a sharding stage or of tensor parallelism starts from the one-rank run of its strategy,
    unsharded (one_gpu): tensor parallelism has no run at one rank, and a sharded one on one rank
    shards nothing (its own overheads would make the efficiency at more ranks look better than it
    is)."""
    ok = ok_runs(df)
    for key, g in ok.groupby(list(SERIES_KEYS), sort=False, dropna=False):
        for kind, batch_key in (("strong", "batch_size"), ("weak", "gpu_batch")):
            for batch, rows in g.groupby(batch_key):
                rows = rows[(rows.world_size > 1) | (rows.shard_optimizer == "none")]
                rows = rows.drop_duplicates("world_size").sort_values("world_size")
                if rows.empty or all(unsharded_twin(ok, r) is not None for _, r in rows.iterrows()):
                    continue  # nothing, or the unsharded series again (sharding one rank shards nothing)
                first = rows.iloc[0]
                if int(first.world_size) > 1 and (int(first.tp) > 1 or first.shard_optimizer != "none"):
                    base = one_gpu(ok, first, batch_key, batch, same_strategy=True)
                    rows = rows if base is None else pd.concat([ok.loc[[base]], rows])
                if rows.world_size.nunique() < 2 or (kind == "weak" and rows.batch_size.nunique() < 2):
                    continue
                r = rows.iloc[-1]
                # Weak: the global batch grows as batch x ranks; "per rank" would contradict a
                # tensor-parallel group, whose ranks all take the group's sequences.
                size = f"global batch {batch:g}" if kind == "strong" else f"global batch {batch:g} x ranks"
                setup = (f"{model_name(r)}, T={r.context_length}, {size}, "
                         f"{r.precision}{' bf16-grads' if r.grad_dtype == 'bf16' else ''}")
                yield kind, setup, layout(r), rows


# nccl-tests' bus factors on a ring of k ranks: what each rank sends per byte of the whole buffer.
BUS_FACTOR = {"allreduce": lambda k: 2 * (k - 1) / k, "reducescatter": lambda k: (k - 1) / k,
              "allgather": lambda k: (k - 1) / k, "broadcast": lambda k: 1.0}


def bus_bandwidth(model: dict) -> float:
    """B, bytes/ms: the bus bandwidth of the all-reduce `model` measured on n0 ranks (ddp.allreduce_model:
    w in bytes/ms, world_size n0), w 2(n0-1)/n0; NaN where n0 < 2 (a one-rank all-reduce measures no link)."""
    n0 = int(model["world_size"])
    return model["w"] * 2 * (n0 - 1) / n0 if n0 >= 2 else math.nan


def line_through(small: tuple, big: tuple) -> tuple:
    """(o, w): the time o + bytes / w through two measured (bytes, time) points, w from their
    difference; w = bytes / time of the larger where it took no longer (noise), and o >= 0."""
    (b1, t1), (b2, t2) = small, big
    w = (b2 - b1) / (t2 - t1) if t2 > t1 and b2 > b1 else b2 / t2
    return max(t1 - b1 / w, 0.0), w


def at_size(model: dict, nbytes: float, collective: str = "allreduce") -> dict:
    """The communication `model` (ddp.allreduce_model) for one `collective` of an nbytes buffer: o
    and w of the line through the two sizes it measured of that collective around nbytes (the two
    smallest below them, the two largest above), so that the model gives the measured time at each
    measured size (small messages pay a latency large ones do not: over NCCL's socket transport
    an all-reduce of 1 MB took 4.5 ms and one of 16 MB 9.0 ms, docs/results/scaling.md); w
    expressed as an all-reduce's (bus_bandwidth then gives the collective's own bus bandwidth). A
    collective the run did not measure takes the all-reduce that moves as many bytes; the model as
    it is where it has no measured sizes (`kinds`)."""
    kinds, n0 = model.get("kinds") or {}, int(model["world_size"])
    measured = collective if len(kinds.get(collective, [])) >= 2 else "allreduce"
    points = kinds.get(measured, [])
    if len(points) < 2 or n0 < 2:
        return model
    factor = BUS_FACTOR[collective](n0) / BUS_FACTOR["allreduce"](n0)
    if measured != collective:
        nbytes *= factor  # the all-reduce moving as much
    i = min(max(bisect.bisect_right([b for b, _ in points], nbytes) - 1, 0), len(points) - 2)
    o, w = line_through(points[i], points[i + 1])
    return dict(model, o=o, w=w * factor if measured == collective else w)


def ring_ms(collective: str, nbytes: float, ranks: int, model: dict, count: float = 1.0,
            size: float | None = None) -> float:
    """The ring model's time, in ms, of `count` collectives of one kind (BUS_FACTOR's) on a ring of
    k = `ranks` ranks moving whole buffers of nbytes in all: count o(k) + f(k) nbytes / B, with
    B the bus bandwidth of the all-reduce `model` measured on n0 ranks (bus_bandwidth; its o in ms),
    o(k) = o (k-1)/(n0-1) and f(k) the bus factor (the bucket model's n_b collectives of which only
    the last one's bytes are left: count n_b, nbytes that one's). o and B are the model's for one
    such collective of `size` bytes (at_size; default nbytes / count). 0 on one rank (nothing
    moves); NaN where n0 < 2 (a one-rank all-reduce measures no link)."""
    n0 = int(model["world_size"])
    if ranks < 2:
        return 0.0
    if n0 < 2:
        return math.nan
    model = at_size(model, nbytes / count if size is None else size, collective)
    return count * model["o"] * (ranks - 1) / (n0 - 1) + BUS_FACTOR[collective](ranks) * nbytes / bus_bandwidth(model)


def allreduce_at(model: dict, ranks: int) -> tuple:
    """(o(k), w(k)): the per-collective cost and bandwidth (bytes / time) of an all-reduce on k =
    `ranks` ranks as ring_ms extends them, what the reference bucket model takes as o and w; the
    model's own o and w where either ring has one rank (nothing to extend from or to)."""
    n0 = int(model["world_size"])
    if min(n0, ranks) < 2:
        return model["o"], model["w"]
    return model["o"] * (ranks - 1) / (n0 - 1), bus_bandwidth(model) / BUS_FACTOR["allreduce"](ranks)


def _attr(row, key: str, default):
    """row[key] (a ddp.load row, or any object with the attributes), default where absent or NaN."""
    value = getattr(row, key, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def embedding_elements(row) -> int:
    """The token embedding's elements a rank holds (zero2 and zero3's first unit): its vocabulary
    rows (under tensor parallelism its part of the vocabulary padded to a multiple of 8 tp) x d_model."""
    tp, vocab = int(_attr(row, "tp", 1)), int(row.vocab_size)
    return (vocab if tp == 1 else -(-vocab // (8 * tp)) * 8) * int(row.d_model)


def layer_elements(row) -> int:
    """One layer's elements on a rank (zero2 and zero3's units between the embedding and the head):
    attention 4 d^2 and SwiGLU 3 d d_ff, split over the tensor-parallel ranks, and two norm gains."""
    tp, d = int(_attr(row, "tp", 1)), int(row.d_model)
    return (4 * d * d + 3 * d * int(row.d_ff)) // tp + 2 * d


def stage_comm_ms(row, model: dict, ranks: int | None = None, share: float = 1.0) -> dict:
    """The ring model's communication of one configuration (a row of ddp.load: its strategy,
    --shard-optimizer, shard_group, buckets and bytes) on `ranks` ranks (default the row's
    world_size; tp of them in each tensor-parallel group), ms a step (the module doc's formulas):
      grad        what the gradients' collectives leave after backward: what grad_comm_mean measures
      grad_all    all of them, end to end
      params      what forward (under zero3 also backward) waits for the parameters' collectives
      params_all  all of them, end to end
      sizes       [(collective, bytes of one)] of each kind of collective priced on two ranks or
                  more (where the model's line is taken: beyond_measured)
    share: the part of the row's forward and backward each rank computes at `ranks` (strong
    scaling: n_m / n), the time the collectives hide behind."""
    tp = int(_attr(row, "tp", 1))
    measured = int(_attr(row, "world_size", ranks)) // tp
    n = ranks // tp if ranks else measured
    out = dict(grad=0.0, grad_all=0.0, params=0.0, params_all=0.0, sizes=[])

    def ring(collective, nbytes, k, count=1.0, size=None):  # ring_ms, noting the size it prices
        if k >= 2:
            out["sizes"].append((collective, nbytes / count if size is None else size))
        return ring_ms(collective, nbytes, k, model, count, size=size)

    if row.ddp == "none" or n < 2:
        return out
    stage = str(_attr(row, "shard_optimizer", "none")).split()[0]  # "zero1 bf16": zero1's collectives
    sharded, units = stage in ("zero1", "zero2", "zero3"), stage in ("zero2", "zero3")
    group = int(_attr(row, "shard_group", measured)) if sharded else measured
    s, c = float(row.comm_bytes_per_step), max(float(row.buckets), 1.0)
    if 0 < group < measured:  # hybrid: comm_bytes_per_step counts the reduce-scatters and each part's all-reduce
        s *= group / (group + 1)
    else:
        group = n  # one group holds every rank, at any n
    fwd, bwd = float(_attr(row, "forward_mean", 0.0)) * share, float(row.backward_mean) * share
    element = 8 if _attr(row, "precision", "fp32") == "fp64" else 4  # of a master weight

    def gradients(part: float, count: float = c) -> float:  # `count` collectives of s / c, `part` of s
        t = ring("reducescatter" if sharded else "allreduce", part * s, group, count, size=s / c)
        return t + ring("allreduce", part * s / group, n // group, count, size=s / group / c)  # 0 w/o groups

    out["grad_all"] = gradients(1.0)
    if row.ddp in OVERLAPPING:
        params = float(_attr(row, "part_params" if tp > 1 else "num_params", 0)) if units else 0.0
        if units and params > 0:  # two gradient windows: backward ends at most two units ahead of them
            tail = gradients((embedding_elements(row) + layer_elements(row)) / params, 2)
        else:
            tail = gradients(1.0 / c)
        out["grad"] = max(tail, out["grad_all"] - bwd)
    else:
        out["grad"] = out["grad_all"]
    p, cp = float(_attr(row, "param_comm_bytes_per_step", 0)), float(_attr(row, "param_collectives_per_step", 0))
    if stage == "broadcast" and p > 0:  # one broadcast per owner, all before forward reads the first range
        out["params"] = out["params_all"] = ring("broadcast", p, n, max(cp * n / measured, 1.0))
    elif sharded and p > 0:
        cp = max(cp, 1.0)
        out["params_all"] = ring("allgather", p, group, cp)
        first = embedding_elements(row) * element if units else p / cp
        hidden = fwd + (bwd if stage == "zero3" else 0.0)
        out["params"] = max(ring("allgather", first, group, cp, size=p / cp), out["params_all"] - hidden)
    return out


def megabytes(nbytes: float) -> str:
    """Bytes as the collectives' runs name their sizes: '1 MB', '0.064 MB', '5.45 MB'."""
    return f"{nbytes / 1e6:.3g} MB"


def beyond_measured(model: dict, sizes: list) -> str:
    """Where the ring model extrapolates: for each (collective, bytes) of `sizes` outside the sizes
    the collectives' run measured of it (at_size's choice: its own, else the all-reduce moving as
    many bytes), 'its all-reduce of 5.2 MB beyond the measured sizes (largest 1 MB)'; '' where every
    one lies among them."""
    kinds, n0, said = model.get("kinds") or {}, int(model["world_size"]), []
    for collective, nbytes in sizes:
        measured = collective if len(kinds.get(collective, [])) >= 2 else "allreduce"
        points = [b for b, _ in kinds.get(measured, [])]
        if len(points) < 2 or n0 < 2:
            continue
        moved = nbytes * (1 if measured == collective else BUS_FACTOR[collective](n0) / BUS_FACTOR["allreduce"](n0))
        name = COLLECTIVE_NAMES.get(collective, collective)
        if moved > max(points) * 1.001:
            said.append(f"its {name} of {megabytes(nbytes)} beyond the measured sizes "
                        f"(largest {megabytes(max(points))})")
        elif moved < min(points) / 1.001:
            said.append(f"its {name} of {megabytes(nbytes)} below the measured sizes "
                        f"(smallest {megabytes(min(points))})")
    return "; ".join(dict.fromkeys(said))


COLLECTIVE_NAMES = {"allreduce": "all-reduce", "reducescatter": "reduce-scatter", "allgather": "all-gather",
                    "broadcast": "broadcast"}


def shard_ranks(row, ranks: int) -> int:
    """The ranks one copy of the optimizer's state is sharded over on `ranks` ranks (tp of them in
    each tensor-parallel group): the data-parallel ranks, or --shard-group's under hybrid sharding;
    1 where the state is not sharded."""
    stage = str(_attr(row, "shard_optimizer", "none")).split()[0]
    if row.ddp == "none" or stage not in ("zero1", "zero2", "zero3"):
        return 1
    dp, measured = max(ranks // int(row.tp), 1), max(int(_attr(row, "world_size", ranks)) // int(row.tp), 1)
    group = int(_attr(row, "shard_group", measured))
    return group if 0 < group < measured else dp  # hybrid keeps its group; else every data-parallel rank


def projected_step(row, n: int, n_m: int, kind: str, model: dict) -> float:
    """The model's step on n ranks from the measured row at n_m ranks (see the module doc)."""
    share = n_m / n if kind == "strong" else 1.0  # of each rank's measured forward and backward
    # The optimizer updates the rank's shard of the state: it shrinks with the shard group, at the
    # same batch or not; unsharded it is the same on any number of ranks. So is what the step spends
    # after it (zero2's cast of the shard for its all-gathers).
    update = (row.optimizer_mean + _attr(row, "param_comm_mean", 0.0)) * shard_ranks(row, n_m) / shard_ranks(row, n)
    passes = row.forward_mean + row.backward_mean
    if row.ddp == "none" or model["world_size"] < 2 or n // int(row.tp) < 2:
        return passes * share + update
    # The forward measured holds the parameters' wait at n_m: the model's at n replaces it.
    there = stage_comm_ms(row, model, n, share)
    passes = max(passes - stage_comm_ms(row, model, n_m)["params"], 0.0) * share
    return passes + update + there["params"] + there["grad"]


class Point(NamedTuple):
    """One rank count of a series, measured or projected."""
    ranks: int
    batch: int
    dp_batch: float  # sequences a step per data-parallel rank: batch / (ranks / tp)
    step_ms: float
    speedup: float
    efficiency: float
    tokens_per_gpu: float
    mfu: float
    source: str
    nodes: int | None = None  # measured: the nodes the run spanned; projected: None
    origin: str | None = None  # projected: the collectives' run its model was fitted from (fitted_from)
    # projected: False where the model is off or unchecked, or ranks shared cores, at the most ranks measured
    trusted: bool = True
    shared: bool = False  # measured where ranks shared cores (contention, not scaling)


def model_for(models: dict, ranks: int, transport_name: str, nodes: int | None = None):
    """The collectives' model a prediction for `ranks` data-parallel ranks of a run on `nodes` nodes
    takes, among those measured on two or more ranks over its transport: one on as many nodes (the
    links the run used; models' `nodes`, as ddp.allreduce_model gives them) before one on others, then one on `ranks`
    ranks, then the most ranks (ring_ms extends o and w to any ring); None where there is none."""
    candidates = [m for (n, t), m in models.items() if t == transport_name and int(m["world_size"]) >= 2]
    if not candidates:
        return None
    return max(candidates, key=lambda m: (nodes is not None and m.get("nodes") == nodes,
                                          int(m["world_size"]) == ranks, int(m["world_size"])))


def nodes_text(nodes) -> str:
    """'1 node', '3 nodes'; '? nodes' where unknown."""
    return "? nodes" if nodes is None else f"{int(nodes)} node{'' if int(nodes) == 1 else 's'}"


def fitted_from(model: dict, nodes: int, whose: str = "this run's") -> str:
    """The collectives' run a prediction was fitted from, its ranks and nodes; marked where its nodes
    are not those of the run predicted, `whose` (its links are others: within a node, not across)."""
    folder = model.get("folder", "the collectives' run")
    where = f"{folder}: {int(model['world_size'])} ranks, {nodes_text(model.get('nodes'))}"
    return where if model.get("nodes") in (None, nodes) else f"{where}, **not {whose} {nodes_text(nodes)}**"


def projection_doubt(last, models: dict) -> str:
    """Where the ring model is off (model_off) for the configuration a series' projections start from,
    `last` (the most ranks measured), with the collectives' model they take: a sentence saying so; else ''."""
    n = int(last.world_size)
    model = model_for(models, n // int(last.tp), last.transport, int(_attr(last, "nodes", 1)))
    predicted = stage_comm_ms(last, model)["grad"] if model is not None else math.nan
    off = model_off(float(last.grad_comm_mean), predicted, float(last.slowest_step_mean))
    if math.isnan(off):
        return ""
    return (f"The projections start from {n} ranks, where exposed comm measured {fmt(last.grad_comm_mean, 3)} ms against "
            f"{fmt(predicted, 3)} ms predicted: {off_text(off)}.")


def cores_were_shared(r) -> str:
    """What a configuration's ranks shared (ddp.cores_shared: "vm: 4 ranks, 4 threads on 2 CPUs"), '' where nothing."""
    return str(_attr(r, "cores_shared", "") or "")


def projection_shared(last) -> str:
    """Where a series' projections start from a configuration whose ranks shared cores: a sentence saying
    so; else ''."""
    what = cores_were_shared(last)
    if not what:
        return ""
    return (f"The projections start from {int(last.world_size)} ranks, where ranks shared cores ({what}): that step "
            "measures the ranks' contention for the cores, so projections built on it are not to be trusted.")


def projection_unchecked(last) -> str:
    """Where a series' projections start from a configuration with one data-parallel rank (tp x 1),
    whose gradients' collectives had no peer: nothing there checked the ring model's prediction for
    them, a sentence saying so; else ''."""
    n, tp = int(last.world_size), int(last.tp)
    if n // tp >= 2 or last.ddp == "none":
        return ""
    return (f"The projections start from {n} ranks, tp {tp} x dp 1: no data-parallel collective ran there to "
            "check the ring model against, so projections built on it are unchecked, not to be trusted.")


def efficiency_rows(kind: str, rows: pd.DataFrame, models: dict) -> list:
    """[Point], measured then projected (see the module doc). Speed-up: T(n0) / T(n) under strong
    scaling, the scaled (n / n0) T(n0) / T(n) under weak, whose n ranks do n / n0 times the work each
    step; efficiency n0 / n of it under both. A projection starts from the step
    measured at the most ranks: the model's step there is scaled to it, and every projected step by
    the same factor (the Source column names it), so that what the model leaves out (the slowest
    rank's lag, overheads) neither vanishes nor jumps at the first projected point."""
    base, last = rows.iloc[0], rows.iloc[-1]
    n0, t0 = int(base.world_size), float(base.slowest_step_mean)

    def point(n, batch, t, source, nodes=None, tp=int(last.tp), origin=None, trusted=True, shared=False):
        speedup = t0 / t * (1 if kind == "strong" else n / n0)
        tokens, mfu = throughput(last, n, batch, t)
        return Point(n, batch, batch / (n // tp), t, speedup, speedup * n0 / n, tokens, mfu, source, nodes, origin,
                     trusted, shared)

    def measured(r):  # the run folder, which a weak series may share with a strong one of its batch
        folder = os.path.basename(os.path.normpath(str(_attr(r, "run", ""))))
        one = "" if layout(r) == layout(last) else f"; one rank: {layout(r)}"
        one += "; **ranks shared cores**" if cores_were_shared(r) else ""
        return f"measured ({folder}{one})" if folder else f"measured{f' ({one[2:]})' if one else ''}"

    out = [point(int(r.world_size), int(r.batch_size), float(r.slowest_step_mean), measured(r),
                 int(_attr(r, "nodes", 1)), int(r.tp), shared=bool(cores_were_shared(r)))
           for _, r in rows.iterrows()]
    n_m, t_m = int(last.world_size), float(last.slowest_step_mean)
    nodes_m = int(_attr(last, "nodes", 1))
    model = model_for(models, n_m // int(last.tp), last.transport, nodes_m)  # its data-parallel ranks, as the table's
    modelled = projected_step(last, n_m, n_m, kind, model) if model is not None else math.nan
    if modelled > 0 and t_m > 0:
        scale = t_m / modelled
        origin = fitted_from(model, nodes_m, f"the {n_m}-rank run's")
        doubt = ("; **model off: not to be trusted**" if projection_doubt(last, models) else
                 "; **model unchecked: not to be trusted**" if projection_unchecked(last) else
                 "; **ranks shared cores: not to be trusted**" if projection_shared(last) else "")
        n = n_m * 2
        # Strong scaling ends where the global batch no longer splits into whole sequences per rank.
        tp = int(last.tp)  # the data-parallel ranks share the batch: n / tp of them
        while n <= max(64, 8 * n_m) and (kind == "weak" or int(last.batch_size) % (n // tp) == 0):
            batch = int(last.batch_size) if kind == "strong" else int(last.local_batch_size) * (n // tp)
            out.append(point(n, batch, projected_step(last, n, n_m, kind, model) * scale,
                             f"projection (ring model, o, w from {origin}; "
                             f"x{scale:.2f} to match the step at {n_m} ranks){doubt}", origin=origin,
                             trusted=not doubt))
            n *= 2
    return out


def study_order(ok: pd.DataFrame) -> pd.DataFrame:
    """ok_runs' configurations with their layout and run folder, in the study table's order."""
    order = ok.assign(layout=[layout(r) for _, r in ok.iterrows()], folder=[os.path.basename(os.path.normpath(d))
                                                                            for d in ok.run])
    return order.sort_values(["transport", "d_model", "num_layers", "context_length", "precision", "tp",
                              "sequence_parallel", "tp_overlap", "order", "bucket_mb", "shard_optimizer",
                              "world_size", "batch_size", "folder"], kind="stable")


def study_table(df: pd.DataFrame, models: dict, per: str = "GPU") -> str:
    """Every configuration measured, one row each: the study at a glance (see study_note); `per`:
    what the throughput is counted per (unit())."""
    ok = ok_runs(df)
    order = study_order(ok)
    cells, flagged, any_tp, above = [], [], bool((order.tp > 1).any()), False
    for _, r in order.iterrows():
        n, tp, batch, step = int(r.world_size), int(r.tp), int(r.batch_size), float(r.slowest_step_mean)
        nodes = int(_attr(r, "nodes", 1))
        tokens, mfu = throughput(r, n, batch, step)
        base, per_gpu = one_gpu(ok, r, "batch_size", batch), ""
        if base is None:  # a weak run: the one-rank run of as many sequences per GPU
            base, per_gpu = one_gpu(ok, r, "gpu_batch", batch / n), "*"
        one = None if base is None else ok.loc[base]
        of_one = math.nan if one is None else tokens / throughput(one, 1, one.batch_size, one.slowest_step_mean)[0]
        above |= of_one > 1.0005
        model = model_for(models, n // tp, r.transport, nodes)
        communicates = model is not None and n // tp > 1 and r.ddp != "none"
        m = stage_comm_ms(r, model) if communicates else dict(grad=math.nan, grad_all=math.nan, params_all=math.nan)
        busy, predicted = float(r.get("comm_busy_mean", math.nan)), m["grad_all"] + m["params_all"]
        off = model_off(r.grad_comm_mean, m["grad"], step)
        if not math.isnan(off):
            flagged.append(f"{r.folder} ({r.layout}, {n} ranks): exposed comm {fmt(r.grad_comm_mean, 3)} ms measured, "
                           f"{fmt(m['grad'], 3)} ms predicted; {off_text(off)}")
        cells.append([r.folder, f"{model_name(r)} T={r.context_length} {r.precision}", r.layout,
                      f"{n}" if tp == 1 else f"{n} ({tp} x {n // tp})", nodes, batch, fmt(step),
                      f"{tokens:,.0f}", "-" if math.isnan(of_one) else f"{of_one:.3f}{per_gpu}",
                      "-" if math.isnan(mfu) else f"{100 * mfu:.1f}%", model_flops_cell(r, tokens, per),
                      gib(r.peak_memory_bytes),
                      f"{fmt(r.grad_comm_mean, 3)} / {fmt(m['grad'], 3)}",
                      ratio_cell(r.grad_comm_mean, m["grad"]) + ("" if math.isnan(off) else " **model off**")]
                     + ([fmt(r.tp_comm_mean, 3) if tp > 1 else "-"] if any_tp else [])
                     + [f"{fmt(busy, 3)} / {fmt(predicted, 3)}", ratio_cell(busy, predicted),
                        predicted_from(model, r, nodes) if communicates else "-"])
    header = (["Run", "Model", "Layout", "Ranks (tp x dp)", "Nodes", "Global batch", "Step (ms)",
               f"Tokens/s per {per}", f"Of one {per}'s", "MFU", f"Model {flops_unit(per)[0]} per {per}",
               "Peak per rank (GiB)",
               "Gradients' exposed comm, measured / predicted (ms)", "Gradients' exposed comm, ratio"]
              + (["TP wait (ms)"] if any_tp else [])
              + ["Comm time, measured / predicted (ms)", "Comm time, ratio",
                 "Predicted from (collectives' run: ranks, nodes)"])
    if len({c[1] for c in cells}) == 1:  # one model: named in every series' title, no column of its own
        header, cells = header[:1] + header[2:], [c[:1] + c[2:] for c in cells]
    table = markdown_table(header, cells)
    if flagged:
        table += (f"\n\n**Model off** (exposed comm measured / predicted outside [{MODEL_TRUSTED[0]}, "
                  f"{MODEL_TRUSTED[1]}], by at least {100 * MODEL_NEGLIGIBLE:.0f}% of the step):\n\n"
                  + "\n".join(f"- {f}" for f in flagged))
    alone = order[(order.world_size // order.tp == 1) & (order.ddp != "none") & (order.comm_mean > 0)]
    if not alone.empty:  # a strategy's collectives with no peer still take time: not a link's
        where = dict.fromkeys(r.folder if r.tp == 1 else f"{r.folder} tp {r.tp}" for _, r in alone.iterrows())
        table += (f"\n\nAt one data-parallel rank ({', '.join(where)}) the gradients' "
                  "collectives have no peer: the exposed comm measured there is the strategy's own work around them "
                  "(the library's call on a group of one rank, which moves nothing over a link, and the passes over "
                  "the gradients), not time on a network.")
    twins = twin_pairs(order)
    if twins:  # the same computation twice
        said = "; ".join(f"{r.folder} {r.layout} {fmt(r.slowest_step_mean)} ms against {fmt(t.slowest_step_mean)} ms "
                         f"unsharded" for r, t in twins)
        table += (f"\n\nSharding over a data-parallel group of one rank shards nothing: those configurations compute "
                  f"the same as the unsharded one ({said}), and the choice of layout below names each such pair "
                  f"once. Their difference, up to {100 * twin_drift(order):.1f}%, is the stage's own work at one "
                  "rank plus how far configurations run in turn drift apart on this host.")
    if above:
        table += f"\n\n{above_one_note(per)}"
    picks = choices(order, per)
    return (f"### Scaling study: every configuration measured\n\n{study_note(per, stage_tables(ok, models), any_tp)}"
            f"\n\n{table}" + ("\n\nWhich layout, where two or more ran at the same ranks and global batch:\n\n"
                              + "\n".join(picks) if picks else ""))


def predicted_from(model: dict, r, nodes: int) -> str:
    """The study table's Predicted from: the collectives' run (fitted_from), and where a collective of
    the configuration lies outside the sizes it measured, so (the model extrapolates there)."""
    beyond = beyond_measured(model, stage_comm_ms(r, model)["sizes"])
    return fitted_from(model, nodes) + (f"; {beyond}" if beyond else "")


def above_one_note(per: str, n0: int = 1) -> str:
    """Why an efficiency (or a share of one GPU's) can pass 100%: what it is measured against, the
    one-rank run or, in a series without one, its first run at n0 ranks."""
    against = ("the one-rank run of the same model, unsharded and without tensor parallelism" if n0 == 1 else
               f"the series' first run, at {n0} ranks (no one-rank run of it ran)")
    return (f"Above 100% (above 1 of one {per}'s): measured against {against}. The ranks stepped faster than "
            f"their number predicts from it: each did its share of the work faster than the {per}s of that run did "
            f"theirs (a smaller part of the model or of the optimizer's state per {per}, e.g. one that fits in "
            "faster memory, or a run that ran slow; the rank files do not say which).")


def group_batch_note(ok: pd.DataFrame, base, last, per: str) -> str:
    """Under weak scaling with tensor parallelism: a group of tp ranks steps the sequences of tp
    ranks, more than the one-rank run the series is measured against (`base`), and a larger batch
    alone runs faster per token: a sentence saying so, with the one-rank run at the group's batch
    where one ran; '' where the batches are the same."""
    tp, one_batch = int(last.tp), int(base.batch_size)
    group = int(last.batch_size) // max(int(last.world_size) // tp, 1)
    if tp == 1 or group == one_batch:
        return ""
    text = (f"Under weak scaling each tensor-parallel group of {tp} ranks steps {group} sequences, where the one-rank "
            f"run the series is measured against stepped {one_batch}: a larger batch alone runs faster per token, so "
            "part of an efficiency above 100% is the batch, not tensor parallelism.")
    same = one_gpu(ok, last, "batch_size", group)
    if same is not None:
        one = ok.loc[same]
        at_group = throughput(one, 1, group, float(one.slowest_step_mean))[0]
        at_base = throughput(base, 1, one_batch, float(base.slowest_step_mean))[0]
        text += (f" One {per} at global batch {group} ({os.path.basename(os.path.normpath(one.run))}) ran "
                 f"{at_group:,.0f} tokens/s, {at_group / at_base:.2f}x its {at_base:,.0f} at {one_batch}.")
    return text


def ratio_cell(measured: float, predicted: float) -> str:
    """measured / predicted to two digits; '-' where either is missing or nothing was predicted."""
    return "-" if not (measured >= 0 and predicted > 0) else f"{measured / predicted:.2f}"


def model_off(measured: float, predicted: float, step: float) -> float:
    """How many times the ring model is off, max(m / p, p / m), where measured / predicted lies
    outside MODEL_TRUSTED and they differ by at least MODEL_NEGLIGIBLE of the step (ms); NaN where
    not, or either is missing or 0."""
    if not (measured > 0 and predicted > 0) or abs(measured - predicted) < MODEL_NEGLIGIBLE * step:
        return math.nan
    r = measured / predicted
    return max(r, 1 / r) if not MODEL_TRUSTED[0] <= r <= MODEL_TRUSTED[1] else math.nan


def off_text(factor: float) -> str:
    """The flag's words: the model is off by that factor, so what is built on it is not to be trusted."""
    return f"the ring model is off by {factor:.1f}x here, so projections built on it are not to be trusted"


def stage_tables(ok: pd.DataFrame, models: dict) -> str:
    """Whether the ddp section's table (i) models the sharded configurations: it takes the
    collectives' run on a setup's own rank count ('all', 'some' of them, or 'none')."""
    sharded = ok[(ok.shard_optimizer != "none") & (ok.ddp != "none") & (ok.world_size // ok.tp > 1)]
    have = [(int(r.world_size), r.transport) in models for _, r in sharded.iterrows()]
    return "all" if have and all(have) else "some" if any(have) else "none"


def step_sem(r) -> float:
    """The standard error of a configuration's step (ms): its slowest-rank step's standard deviation
    over the timed steps / sqrt(their number); the deviation itself where the number is not known."""
    std, n = float(_attr(r, "slowest_step_std", 0.0)), int(_attr(r, "slowest_step_n", 1))
    return std / math.sqrt(max(n, 1))


def ties_with(r, fast) -> bool:
    """Whether configuration r's step is within the noise of the fastest's: their means closer than
    TIE_SIGMAS standard errors of the difference, or than TIE_SHARE of the fastest step."""
    gap = float(r.slowest_step_mean) - float(fast.slowest_step_mean)
    return gap <= max(TIE_SIGMAS * math.hypot(step_sem(r), step_sem(fast)), TIE_SHARE * float(fast.slowest_step_mean))


def choices(order: pd.DataFrame, per: str = "GPU", ranks: int | None = None) -> list:
    """Per model, transport, rank count (two or more; only `ranks` where given) and global batch
    measured under two or more layouts (a sharded one with an unsharded twin counted as that one;
    --ddp none only where it has no data-parallel peer: elsewhere each rank trains alone),
    a line: the fastest layout, or the layouts that tie with it (ties_with), and the ones with the
    least peak memory
    (within 1% of the least: a tie, every one named); "also the least memory" only where one layout
    is both alone."""
    lines = []
    keys = [k for k in MODEL_KEYS if k in order.columns] + ["world_size", "batch_size"]
    for _, g in order.groupby(keys, sort=False, dropna=False):
        g = g[[unsharded_twin(order, r) is None for _, r in g.iterrows()]]  # the same computation, named once
        # --ddp none on several data-parallel ranks trains each rank's own model: a baseline, not a layout.
        g = g[(g.ddp != "none") | (g.world_size // g.tp == 1)]
        if g.layout.nunique() < 2 or int(g.world_size.iloc[0]) < 2:  # on one rank layouts are names only
            continue
        if ranks is not None and int(g.world_size.iloc[0]) != ranks:
            continue
        fast, least = g.loc[g.slowest_step_mean.idxmin()], float(g.peak_memory_bytes.min())
        ties = g[[ties_with(r, fast) for _, r in g.iterrows()]]
        ties = ties.sort_values("slowest_step_mean", kind="stable").drop_duplicates("layout")  # each at its fastest
        n, batch = int(fast.world_size), int(fast.batch_size)

        def said(r, spread=False):
            tokens = throughput(r, n, batch, float(r.slowest_step_mean))[0]
            step = fmt(r.slowest_step_mean) + (f" ± {fmt(step_sem(r))}" if spread else "")
            return (f"**{r.layout}** ({step} ms, {tokens:,.0f} tokens/s per {per}, peak "
                    f"{gib(r.peak_memory_bytes)} GiB)")
        line = (f"- {model_name(fast)} T={fast.context_length} {fast.precision}, {n} ranks, global batch {batch}"
                f"{'' if fast.transport == 'default' else ', network transport'}: ")
        # A gap smaller than the steps' spread says nothing of which is faster: each step with its
        # standard error, so that a large gap between noisy steps reads as what it is.
        line += (f"fastest {said(fast)}" if len(ties) == 1 else
                 f"fastest not told apart (the steps vary more than they differ: means within "
                 f"{TIE_SIGMAS:g} standard errors of their difference, or {100 * TIE_SHARE:g}%; each ± its "
                 f"standard error): " + ", ".join(said(r, spread=True) for _, r in ties.iterrows()))
        small = g[g.peak_memory_bytes <= 1.01 * least].drop_duplicates("layout")
        small = small.sort_values("peak_memory_bytes", kind="stable")
        if len(ties) == 1 and len(small) == 1 and small.layout.iloc[0] == fast.layout:
            line += ", also the least memory"
        else:
            tied = set(ties.layout)
            named = ", ".join(
                f"**{s.layout}** ({gib(s.peak_memory_bytes)} GiB, "
                + ("one of the fastest)" if s.layout in tied and len(tied) > 1 else "the fastest)" if s.layout in tied else
                   f"its step {s.slowest_step_mean / fast.slowest_step_mean:.2f}x the fastest's)")
                for _, s in small.iterrows())
            line += f"; least memory{', a tie within 1%:' if len(small) > 1 else ''} {named}"
        lines.append(line)
    return lines


def study_note(per: str, stage: str = "all", tp: bool = False) -> str:
    """The study table's legend; stage: whether the ddp tables (i) model the sharded runs (stage_tables);
    tp: whether the table has the TP wait column (a configuration with tensor parallelism)."""
    per_stage = {"all": "; table (i) per stage",
                 "some": "; table (i) per stage, where the collectives ran on the setup's own ranks"}.get(stage, "")
    shown = "table (g) shows" if stage == "none" else "tables (g) and (i) show"
    return (f"Step: the mean of the slowest rank's step. Tokens/s per {per}: global batch x context / (step x ranks). "
            f"Of one {per}'s: that over the tokens/s of the one-rank run of the same model and global batch, "
            f"unsharded and without tensor parallelism (*: where none ran, of the same batch per {per}, as weak "
            f"scaling compares). MFU: tokens/s per {per} x the model FLOPs per token (6 x the parameters the matrix "
            "products multiply, plus attention's, causal counted as half) over the GPU's dense peak at the "
            "products' precision (analysis/scaling.py; '-' where the device has none in its table, as CPUs); "
            f"Model {flops_unit(per)[0]} per {per}: the numerator, tokens/s per {per} x the model FLOPs per token, "
            "shown on every device. "
            "Peak per rank: the largest rank's allocator peak. Gradients' exposed comm: what their collectives leave "
            "after backward; under sharding the parameters' wait inside forward is not in it, nor what the step "
            f"spends after the optimizer (the ddp {shown} both); predicted: the ring model's for the same, from a run of the collectives (mode comm: o and w at each collective's size, from the line "
            f"through the two sizes measured around it, each size's in-place back-to-back time per operation"
            f"{per_stage}); "
            f"ratio: measured over predicted, **model off** outside [{MODEL_TRUSTED[0]}, {MODEL_TRUSTED[1]}] "
            f"where they differ by {100 * MODEL_NEGLIGIBLE:.0f}% of the step or more. "
            "Comm time: the device time of the step's data-parallel collectives on their stream, hidden or not "
            "(comm_busy_ms; NCCL only, '-' from the mpi backend); predicted: the ring model's for all of them, "
            "gradients' and parameters', end to end; ratio: measured over predicted. Predicted from: the "
            "collectives' run both predictions take, its ranks and nodes: over the same transport, on as many nodes "
            "as the configuration (its links) where one ran, then on its data-parallel ranks, else the most ranks "
            "(the ring model extends o and w to other ranks); marked where its nodes are not the configuration's, "
            "whose links it then did not measure, and where a collective's size lies outside those it measured "
            "(the model extrapolates there)."
            + (" TP wait: what the layers waited for the tensor-parallel group's collectives (tp_comm_ms, the "
               "mean over every rank's steps), inside the step's forward and backward, not added to the step and "
               "not in exposed comm, nor in the ring model's predictions; '-' without tensor parallelism."
               if tp else ""))


def plot(all_series: list, path: str, per: str = "GPU") -> str:
    """Tokens/s per GPU (per rank on CPUs: `per`) (top) and efficiency (bottom) against ranks, strong
    scaling left, weak right; all_series: [(kind, setup, layout, points)]. One colour and marker per
    layout, the same in every panel, never grey, each layout a little to the side of its rank counts;
    points where ranks shared cores hollow; projections dashed, with small filled markers (faint, thin and
    dotted, in the layout's colour, where the ring model is off or
    unchecked, or the ranks shared cores, at the most ranks measured: not to be trusted), the legend naming the collectives' run whose links they assume;
    where the runs span more than one node, each rank count
    measured with the nodes its runs spanned under it; the legend right of the panels, where it hides
    no line, the figure cut to what it holds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    setups = {kind: sorted({setup for k, setup, _, _ in all_series if k == kind}) for kind in ("strong", "weak")}
    names = list(dict.fromkeys(name(setups, kind, setup, lay) for kind, setup, lay, _ in all_series))
    # Greys left out: grey is the ideal line's.
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"] if len(names) <= 9 else plt.get_cmap("tab20").colors
    colors = [c for c in cycle if len(set(matplotlib.colors.to_rgb(c))) > 1]
    color = {n: colors[i % len(colors)] for i, n in enumerate(names)}
    # A marker each, and each series a little to the side of the rank count (2% of it per place), so
    # that layouts measuring alike do not hide one another.
    shapes = "osD^vP<>hX*"
    marker = {n: shapes[i % len(shapes)] for i, n in enumerate(names)}
    nudge = {n: 2 ** (0.03 * (i - (len(names) - 1) / 2)) for i, n in enumerate(names)}
    nodes_at = {}  # (kind, ranks): the node counts the runs measured there spanned
    for kind, _, _, points in all_series:
        for p in points:
            if p.nodes is not None:
                nodes_at.setdefault((kind, p.ranks), set()).add(p.nodes)
    node_counts = set().union(*nodes_at.values())
    label_nodes = len(node_counts) > 1 or max(node_counts, default=1) > 1

    def tick(n, kind):  # the rank count, with its runs' nodes under it where they vary or pass one
        counts = sorted(nodes_at.get((kind, n), ()))
        if not (label_nodes and counts):
            return str(n)
        return f"{n}\n{','.join(map(str, counts))} node{'s' if counts != [1] else ''}"

    fig, axes = plt.subplots(2, 2, figsize=(10, 8), sharex="col")
    for kind, setup, lay, points in all_series:
        n = name(setups, kind, setup, lay)
        column, c, m, x = (0 if kind == "strong" else 1), color[n], marker[n], nudge[n]
        measured = [p for p in points if p.source.startswith("measured")]
        projected = [measured[-1]] + [p for p in points if not p.source.startswith("measured")]
        shared = [p for p in measured if p.shared]
        for row, field, scale in ((0, "tokens_per_gpu", 1), (1, "efficiency", 100)):  # efficiency in %, as the tables
            ax = axes[row, column]
            ax.plot([x * p.ranks for p in measured], [scale * getattr(p, field) for p in measured], "-", marker=m,
                    color=c)
            if shared:  # contention for the cores, not scaling: hollow
                ax.plot([x * p.ranks for p in shared], [scale * getattr(p, field) for p in shared], ls="none",
                        marker=m, mfc="white", color=c)
            if len(projected) > 1:  # where the model is off at the start: faint, thin and dotted
                trusted = all(p.trusted for p in projected[1:])
                ax.plot([x * p.ranks for p in projected], [scale * getattr(p, field) for p in projected],
                        ls="--" if trusted else (0, (1, 2)), marker=m, ms=4, color=c, alpha=1.0 if trusted else 0.45,
                        lw=None if trusted else 0.9)
    for column, kind in enumerate(("strong", "weak")):
        ns = sorted({p.ranks for k, _, _, points in all_series if k == kind for p in points})
        common = f"\n{setups[kind][0]}" if len(setups[kind]) == 1 else ""
        batch = "fixed global batch" if kind == "strong" else "global batch x ranks"
        axes[0, column].set_title(f"{kind} scaling ({batch}){common}", fontsize="medium")
        for row in (0, 1):
            ax = axes[row, column]
            if ns:
                if row == 1:
                    ax.axhline(100.0, ls=":", color="grey")
                ax.set_xscale("log", base=2)
                ax.set_xticks(ns, [tick(n, kind) for n in ns])
                ax.set_ylim(bottom=0)  # from zero: a drop reads as large as it is
            else:
                ax.text(0.5, 0.5, f"no {kind}-scaling runs", ha="center", va="center", transform=ax.transAxes)
            ax.grid(True, which="both", alpha=0.3)
        axes[1, column].set_xlabel("ranks (measured: the nodes they spanned)" if label_nodes else "ranks")
    for column in (0, 1):
        axes[0, column].set_ylabel(f"tokens/s per {per}")
        axes[1, column].set_ylabel("efficiency (%; 100 = ideal)")
    handles = [Line2D([], [], color=color[n], marker=marker[n], label=n) for n in names]
    origins = list(dict.fromkeys(p.origin for *_, points in all_series for p in points if p.origin))
    if origins:  # what every projection assumes: the links that run measured, at any rank count
        handles.append(Line2D([], [], color="black", ls="--", marker="o", ms=4,
                              label="projection (ring model): assumes the links\nmeasured by "
                              + "\nand ".join(origins)))
    shared = any(p.shared for *_, points in all_series for p in points)
    if any(not p.trusted for *_, points in all_series for p in points):
        handles.append(Line2D([], [], color="black", ls=(0, (1, 2)), lw=0.9, alpha=0.45, marker="o", ms=4,
                              label="projection where the model is off\nor unchecked"
                                    + (" or ranks shared cores" if shared else "") + ":\nnot to be trusted"))
    if shared:
        handles.append(Line2D([], [], color="black", marker="o", mfc="white", ls="none",
                              label="measured where ranks shared cores:\ncontention, not scaling"))
    handles.append(Line2D([], [], color="grey", ls=":", label="ideal"))
    if not label_nodes:  # else each rank count's ticks say it
        handles.append(Line2D([], [], color="black", marker="o",
                              label=f"measured (solid), on {nodes_text(min(node_counts, default=1))}"))
    fig.tight_layout()
    # Right of the panels, the saved figure cut to fit it: as wide as the names need, no more.
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def name(setups: dict, kind: str, setup: str, lay: str) -> str:
    """A series' name in the legend: its layout, after its setup where a panel has several."""
    return lay if len(setups[kind]) == 1 else f"{setup}, {lay}"


def caption(kind: str, n0: int, per: str, tp: int = 1) -> str:
    """A series table's definitions: speed-up and efficiency against the step T(n0) on n0 ranks; the
    batch per data-parallel rank (tp: the series' tensor-parallel size)."""
    t0, over = f"T({n0})", "n" if n0 == 1 else f"(n / {n0})"
    efficiency = "speed-up / n" if n0 == 1 else f"speed-up x {n0} / n"
    batch = (" Batch per data-parallel rank: the global batch over the n / tp data-parallel ranks (a tensor-parallel "
             f"group's {tp} ranks take the same sequences)." if tp > 1 else "")
    if kind == "strong":
        return (f"Speed-up: {t0} / T(n), the step on {'one rank' if n0 == 1 else f'{n0} ranks'} over the step on n; "
                f"efficiency: {efficiency}. T: the mean of the slowest rank's step.{batch}")
    return (f"Speed-up: scaled, {over} {t0} / T(n): n ranks do {over} times the work of "
            f"{'one' if n0 == 1 else n0} in each step (the global batch grows with n), in T(n) against {t0}; "
            f"efficiency: {efficiency} = {t0} / T(n). T: the mean of the slowest rank's step.{batch}")


def shared_cores(ok: pd.DataFrame, models: dict) -> str:
    """A warning where ranks shared cores (ddp.load's and ddp.allreduce_model's cores_shared, from
    what the rank files record): the runs and what each node held; '' where none did."""
    runs = {}
    for _, r in ok.iterrows():
        if cores_were_shared(r):
            runs.setdefault(os.path.basename(os.path.normpath(r.run)), cores_were_shared(r))
    for m in models.values():
        if m.get("cores_shared"):
            runs.setdefault(m.get("folder", "?"), m["cores_shared"])
    if not runs:
        return ""
    return ("**Ranks shared cores** in " + "; ".join(f"{run} ({what})" for run, what in runs.items())
            + ": those points measure the ranks' contention for the cores, not scaling, and the collectives' times "
              "there wait for time slices.")


def summary(found: list, all_series: list, ok: pd.DataFrame, models: dict, per: str) -> str:
    """The study in a few lines: per layout (and model), the efficiency and tokens/s per GPU at the
    most ranks measured, strong and weak; the fastest layout there (choices: ties named as ties);
    where the model is off, where projections start from one data-parallel rank (unchecked), where
    ranks shared cores, and that each configuration ran once (with how far twins differed, above 1%)."""
    lines, by_layout, above = [], {}, set()  # above: the first rank counts of series above 100%
    models_named = len({(model_name(rows.iloc[-1]), int(rows.iloc[-1].context_length), rows.iloc[-1].precision)
                         for *_, rows in found}) > 1
    for (kind, setup, lay, points), (*_, rows) in zip(all_series, found):
        last = [p for p in points if p.source.startswith("measured")][-1]
        if last.efficiency > 1.0005:
            above.add(int(rows.iloc[0].world_size))
        r = rows.iloc[-1]
        name = f"**{lay}**" + (f" ({model_name(r)} T={r.context_length} {r.precision})" if models_named else "")
        size = setup.split(", ")[2]  # "global batch 4", "global batch 2 x ranks"
        by_layout.setdefault(name, []).append(
            f"{kind} ({size}) efficiency {100 * last.efficiency:.1f}% at {last.ranks} ranks, {last.tokens_per_gpu:,.0f} "
            f"tokens/s per {per}")
    lines += [f"- {name}: " + "; ".join(said) for name, said in by_layout.items()]
    if above:
        lines.append(f"- {above_one_note(per, max(above))}")
    order = study_order(ok)
    most = int(order.world_size.max()) if len(order) else 0
    picks = choices(order, per, ranks=most)
    if picks:
        lines.append(f"- At the most ranks measured ({most}):")
        lines += ["  " + p for p in picks]
    off = sum(1 for _, r in order.iterrows() if projection_doubt(r, models)) if models else 0
    if off:
        lines.append(f"- The ring model is off for {off} configuration(s) (**model off** below): projections "
                     "built on it are drawn faint and dotted in scaling.png and are not to be trusted.")
    unchecked = dict.fromkeys(f"**{lay}**" for kind, setup, lay, rows in found if projection_unchecked(rows.iloc[-1]))
    if unchecked:
        lines.append(f"- Projections of {'; '.join(unchecked)} start from one data-parallel rank, where no "
                     "gradients' collective ran to check the ring model: drawn faint and dotted in scaling.png, not to be trusted.")
    shared = shared_cores(ok, models)
    if shared:
        lines.append(f"- {shared} Their points are hollow in scaling.png, and projections from them faint and dotted.")
    if picks:
        lines.append(f"- {ran_once_note(order)}")
    return "### Scaling study: in short\n\n" + "\n".join(lines) if lines else ""


def report(df: pd.DataFrame, models: dict, out_dir: str) -> str:
    """A summary, the study table, the scaling tables and scaling.png; models: {(world_size, transport):
    ddp.allreduce_model(...)}."""
    per = unit(df)
    parts = [study_table(df, models, per)]
    found = list(series(df, per))
    if not found:
        shared = shared_cores(ok_runs(df), models)
        return ((f"{shared}\n\n" if shared else "") + parts[0] + "\n\nNo series: runs at two or more rank counts with "
                f"the same global batch or batch per {per}.")
    all_series = [(kind, setup, lay, efficiency_rows(kind, rows, models)) for kind, setup, lay, rows in found]
    parts.insert(0, summary(found, all_series, ok_runs(df), models, per))
    for (kind, setup, lay, points), (*_, rows) in zip(all_series, found):
        cells = [[p.ranks, "-" if p.nodes is None else p.nodes, p.batch, f"{p.dp_batch:g}", fmt(p.step_ms),
                  fmt(p.speedup), f"{100 * p.efficiency:.1f}%", f"{p.tokens_per_gpu:,.0f}",
                  "-" if math.isnan(p.mfu) else f"{100 * p.mfu:.1f}%",
                  model_flops_cell(rows.iloc[0], p.tokens_per_gpu, per), p.source]
                 for p in points]
        table = markdown_table(["Ranks", "Nodes", "Global batch", "Batch per data-parallel rank", "Step (ms)",
                                "Speed-up", "Efficiency", f"Tokens/s per {per}", "MFU",
                                f"Model {flops_unit(per)[0]} per {per}", "Source"], cells)
        last = rows.iloc[-1]
        projected = any(p.source.startswith("projection") for p in points)
        doubt = projection_doubt(last, models) or projection_unchecked(last) or projection_shared(last)
        notes = [f"**{doubt}**"] if projected and doubt else []
        model = model_for(models, int(last.world_size) // int(last.tp), last.transport, int(_attr(last, "nodes", 1)))
        beyond = beyond_measured(model, stage_comm_ms(last, model)["sizes"]) if projected and model is not None else ""
        if beyond:
            notes.append(f"The projections extrapolate the collectives' run: {beyond}.")
        if any(p.efficiency > 1.0005 for p in points):
            notes.append(above_one_note(per, int(rows.iloc[0].world_size)))
            if kind == "weak":
                notes.append(group_batch_note(ok_runs(df), rows.iloc[0], last, per))
        parts.append(f"### Scaling, {kind}: {setup}, {lay}\n\n{caption(kind, points[0].ranks, per, int(last.tp))}"
                     f"\n\n{table}" + "".join(f"\n\n{n}" for n in notes if n))
    if not models:
        parts.append("No all-reduce run (llmhpc --mode comm) among the results: no projections.")
    plot(all_series, os.path.join(out_dir, "scaling.png"), per)
    origins = list(dict.fromkeys(p.origin for *_, points in all_series for p in points if p.origin))
    faint = any(not p.trusted for *_, points in all_series for p in points)
    shared = any(p.shared for *_, points in all_series for p in points)
    parts.append(f"![scaling: tokens/s per {per} and efficiency against ranks](scaling.png)"
                 + (f"\n\nProjections (dashed) assume at every rank count the links the collectives' run they take "
                    f"measured ({'; '.join(origins)})" + ("; faint and dotted: at the most ranks measured the ring model is off "
                                                          "or nothing checked it"
                                                          + (", or the ranks shared cores" if shared else "")
                                                          + ": not to be trusted." if faint else ".") if origins else ""))
    return "\n\n".join(p for p in parts if p)


if __name__ == "__main__":
    section_script("ddp")

"""Strong and weak scaling of llmhpc --mode ddp runs at several rank counts (jobs/scaling.sh),
with projections to larger clusters from the ring model of each stage's collectives (the reference DDP
study's bucket model, extended to the sharded stages); ddp.report_section calls it.

    report(df, comm_models, out_dir) -> markdown, and scaling.png in out_dir

A series is one model, context, precision, strategy, bucket size, sharding and transport
measured at two or more rank counts n:
  strong: the same global batch B at every n; speed-up S(n) = T(n0) / T(n) and efficiency
          E(n) = n0 T(n0) / (n T(n)), n0 the fewest ranks measured (1 in scaling.sh);
  weak:   the same per-rank batch b at every n; efficiency E(n) = T(n0) / T(n).
T is the reference DDP study's step time: the mean over the timed steps of the slowest rank's step.
Per configuration also tokens/s per GPU, B x context / (T n), and the model FLOPs utilisation,
MFU = tokens/s per GPU x F / peak, with one definition of the model's FLOPs per token (as llm.c and
torchtitan count them): F = 6 N + 6 L d T, N the parameters the matrix products multiply (every
layer's 4 d^2 + 3 d d_ff and the LM head's V d; the embedding lookup multiplies nothing), and the
attention scores and their product with the values 12 L d T per token, causal counted as half;
peak the GPU's dense bf16 (tensor cores) or fp32 (no tensor cores) rate from PEAK_FLOPS, by the
device's name: '-' where the device is not in it (the CPU).
Transport: a run folder whose name ends in "-net" ran with NCCL's network transport forced
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, jobs/scaling.sh NET=1), as the folder name says.

Projections (every such row and point labelled "projection") extend a series to more ranks n by
the ring model of the collectives, from an all-reduce run (llmhpc --mode comm) on n0 ranks: its o
(per collective) and w (bytes/s, as ddp.allreduce_model measures them), its bus bandwidth
B = w 2(n0-1)/n0 kept on any ring and its o growing with the ring's steps, o(k) = o (k-1)/(n0-1), so
that on a ring of k ranks (ring_ms) an all-reduce whose buffer is S bytes takes o(k) + 2(k-1)/k S / B,
a reduce-scatter or all-gather o(k) + (k-1)/k S / B and a broadcast o(k) + S / B (the bus factors
of nccl-tests, which comm_bus_bytes_per_step counts with). A projected step is the compute
(forward + backward + optimizer at the most ranks measured, n_m, less the parameters' wait the model
puts in that forward, divided by n / n_m (strong, while the global batch splits into whole sequences
per rank) or kept (weak)) plus, at n (stage_comm_ms), with s the gradients' bytes in c collectives
(comm_bytes_per_step, buckets) and S_p the parameters' in c_p (param_comm_bytes_per_step,
param_collectives_per_step), g the ranks of a shard group (n, or --shard-group's, kept) and
m = n / g the groups:
  the gradients' collectives left after backward: none and broadcast all-reduce s over n; zero1
    reduce-scatters G = s over g, bucket by bucket, zero2 and zero3 unit by unit (the embedding,
    each layer, the head); with groups (hybrid) each part, G / g, is then all-reduced over m, c more
    collectives (s counts both there: s = G + G / g). Overlapping strategies (overlap, bucketed;
    zero2 and zero3 reduce as bucketed) leave every collective's o and the bytes of the last one:
    1 / c of them (the reference bucket model's equal buckets: unsharded T_over = c o(n) +
    s / (c w(n)), w(n) = B / (2(n-1)/n)), under zero2 and zero3 the embedding's share (the last unit
    backward finishes); never less than all of them less backward's time, what cannot hide behind
    backward, which binds on slow networks. naive and flat: all of them, after backward;
  the parameters' wait: broadcast broadcasts S_p (one per owner) before forward reads any, all
    waited for; zero1 and zero2 all-gather S_p within the group after the optimizer, the next
    forward waiting for c_p o and the first (S_p / c_p under zero1, the embedding's under zero2),
    never less than all of them less forward's time; zero3 all-gathers each unit before forward and
    again before backward reads it, one ahead: c_p o and the embedding's, never less than all of them
    less forward's and backward's time.
Under tensor parallelism (--tp) n counts the n / tp data-parallel ranks, and the collectives inside
the layers are part of the compute, scaled with it. analysis/ddp.py's table (i) sets the same model
beside what each sharded configuration measured.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table  # noqa: E402

SERIES_KEYS = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length", "precision", "grad_dtype",
               "attention", "tp", "sequence_parallel", "tp_overlap", "ddp", "bucket_mb", "shard_optimizer", "backend", "transport")
OVERLAPPING = ("overlap", "bucketed")
# Dense peak FLOP/s by (device name contains, precision), from the vendors' data sheets (SXM parts).
PEAK_FLOPS = {("H100", "bf16"): 989.4e12, ("H100", "fp32"): 66.9e12, ("H200", "bf16"): 989.4e12,
              ("H200", "fp32"): 66.9e12, ("A100", "bf16"): 312e12, ("A100", "fp32"): 19.5e12}


def flops_per_token(row) -> float:
    """The model FLOPs of one token's forward and backward (see the module doc)."""
    d, f, layers, vocab, t = (float(row[k]) for k in ("d_model", "d_ff", "num_layers", "vocab_size", "context_length"))
    matmul = layers * (4 * d * d + 3 * d * f) + vocab * d
    return 6 * matmul + 6 * layers * d * t


def peak_flops(device_name: str, precision: str) -> float:
    for (name, p), peak in PEAK_FLOPS.items():
        if name in str(device_name) and p == precision:
            return peak
    return math.nan


def throughput(row, n: int, batch: int, step_ms: float) -> tuple:
    """(tokens/s per GPU, MFU) of `batch` sequences a step over n ranks at step_ms."""
    per_gpu = batch * float(row["context_length"]) / (step_ms / 1e3) / n
    return per_gpu, per_gpu * flops_per_token(row) / peak_flops(row.get("device_name", ""), row["precision"])


def transport(directory: str) -> str:
    return "network" if os.path.basename(os.path.normpath(directory)).endswith("-net") else "default"


def series(df: pd.DataFrame):
    """Yields (kind, title, rows by world size) for every strong and weak series of ok runs."""
    ok = df[(df.status == "ok")].assign(transport=[transport(d) for d in df[df.status == "ok"].run])
    for key, g in ok.groupby(list(SERIES_KEYS), sort=False, dropna=False):
        for kind, batch_key in (("strong", "batch_size"), ("weak", "local_batch_size")):
            for batch, rows in g.groupby(batch_key):
                rows = rows.drop_duplicates("world_size").sort_values("world_size")
                if rows.world_size.nunique() < 2 or (kind == "weak" and rows.batch_size.nunique() < 2):
                    continue
                r = rows.iloc[0]
                model = r.model if r.model != "custom" else f"d{r.d_model}_L{r.num_layers}"
                strategy = r.ddp if r.ddp != "bucketed" else f"bucketed {r.bucket_mb:g} MiB"
                title = (f"{kind}: {model}, T={r.context_length}, {'global' if kind == 'strong' else 'per-rank'} batch "
                         f"{batch}, {r.precision}{' bf16-grads' if r.grad_dtype == 'bf16' else ''}, {strategy}"
                         + ("" if r.shard_optimizer == "none" else f", {r.shard_optimizer}")
                         + ("" if r.tp == 1 else f", tp {r.tp}{' sequence parallel' if r.sequence_parallel else ''}"
                            + (f" products in {r.tp_overlap} chunks" if r.tp_overlap > 1 else ""))
                         + ("" if r.transport == "default" else ", network transport"))
                yield kind, title, rows


# nccl-tests' bus factors on a ring of k ranks: what each rank sends per byte of the whole buffer.
BUS_FACTOR = {"allreduce": lambda k: 2 * (k - 1) / k, "reducescatter": lambda k: (k - 1) / k,
              "allgather": lambda k: (k - 1) / k, "broadcast": lambda k: 1.0}


def bus_bandwidth(model: dict) -> float:
    """B, bytes/ms: the bus bandwidth of the all-reduce `model` measured on n0 ranks (ddp.allreduce_model:
    w in bytes/ms, world_size n0), w 2(n0-1)/n0; NaN where n0 < 2 (a one-rank all-reduce measures no link)."""
    n0 = int(model["world_size"])
    return model["w"] * 2 * (n0 - 1) / n0 if n0 >= 2 else math.nan


def ring_ms(collective: str, nbytes: float, ranks: int, model: dict, count: float = 1.0) -> float:
    """The ring model's time, in ms, of `count` collectives of one kind (BUS_FACTOR's) on a ring of
    k = `ranks` ranks moving whole buffers of nbytes in all: count o(k) + f(k) nbytes / B, with
    B the bus bandwidth of the all-reduce `model` measured on n0 ranks (bus_bandwidth; its o in ms),
    o(k) = o (k-1)/(n0-1) and f(k) the bus factor (the bucket model's n_b collectives of which only
    the last one's bytes are left: count n_b, nbytes that one's). 0 on one rank (nothing moves); NaN
    where n0 < 2 (a one-rank all-reduce measures no link)."""
    n0 = int(model["world_size"])
    if ranks < 2:
        return 0.0
    if n0 < 2:
        return math.nan
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


def stage_comm_ms(row, model: dict, ranks: int | None = None, share: float = 1.0) -> dict:
    """The ring model's communication of one configuration (a row of ddp.load: its strategy,
    --shard-optimizer, shard_group, buckets and bytes) on `ranks` ranks (default the row's
    world_size; tp of them in each tensor-parallel group), ms a step (the module doc's formulas):
      grad        what the gradients' collectives leave after backward: what comm_mean measures
      grad_all    all of them, end to end
      params      what forward (under zero3 also backward) waits for the parameters' collectives
      params_all  all of them, end to end
    share: the part of the row's forward and backward each rank computes at `ranks` (strong
    scaling: n_m / n), the time the collectives hide behind."""
    tp = int(_attr(row, "tp", 1))
    measured = int(_attr(row, "world_size", ranks)) // tp
    n = ranks // tp if ranks else measured
    out = dict(grad=0.0, grad_all=0.0, params=0.0, params_all=0.0)
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

    def gradients(part: float) -> float:  # c collectives, the bytes of `part` of s
        t = ring_ms("reducescatter" if sharded else "allreduce", part * s, group, model, c)
        return t + ring_ms("allreduce", part * s / group, n // group, model, c)  # 0 without groups

    out["grad_all"] = gradients(1.0)
    if row.ddp in OVERLAPPING:
        params = float(_attr(row, "part_params" if tp > 1 else "num_params", 0)) if units else 0.0
        last = embedding_elements(row) / params if units and params > 0 else 1.0 / c
        out["grad"] = max(gradients(last), out["grad_all"] - bwd)
    else:
        out["grad"] = out["grad_all"]
    p, cp = float(_attr(row, "param_comm_bytes_per_step", 0)), float(_attr(row, "param_collectives_per_step", 0))
    if stage == "broadcast" and p > 0:  # one broadcast per owner, all before forward reads the first range
        out["params"] = out["params_all"] = ring_ms("broadcast", p, n, model, max(cp * n / measured, 1.0))
    elif sharded and p > 0:
        cp = max(cp, 1.0)
        out["params_all"] = ring_ms("allgather", p, group, model, cp)
        first = embedding_elements(row) * element if units else p / cp
        hidden = fwd + (bwd if stage == "zero3" else 0.0)
        out["params"] = max(ring_ms("allgather", first, group, model, cp), out["params_all"] - hidden)
    return out


def projected_step(row, n: int, n_m: int, kind: str, model: dict) -> float:
    """The model's step on n ranks from the measured row at n_m ranks (see the module doc)."""
    share = n_m / n if kind == "strong" else 1.0  # of each rank's measured compute
    compute = row.forward_mean + row.backward_mean + row.optimizer_mean
    if row.ddp == "none" or model["world_size"] < 2 or n // int(row.tp) < 2:
        return compute * share
    # The forward measured holds the parameters' wait at n_m: the model's at n replaces it.
    there = stage_comm_ms(row, model, n, share)
    compute = max(compute - stage_comm_ms(row, model, n_m)["params"], 0.0) * share
    return compute + there["params"] + there["grad"]


def efficiency_rows(kind: str, rows: pd.DataFrame, models: dict) -> list:
    """[(n, global batch, local batch, step ms, speed-up, efficiency, source)], measured then projected."""
    base = rows.iloc[0]
    n0, t0 = int(base.world_size), float(base.slowest_step_mean)

    def entry(n, batch, local, t, source):
        speedup = t0 / t
        eff = speedup * n0 / n if kind == "strong" else speedup
        return (n, batch, local, t, speedup, eff, source)

    out = [entry(int(r.world_size), int(r.batch_size), int(r.local_batch_size), float(r.slowest_step_mean), "measured")
           for _, r in rows.iterrows()]
    last = rows.iloc[-1]
    n_m, mine = int(last.world_size), transport(last.run)
    candidates = {n: m for (n, t), m in models.items() if t == mine}
    model = candidates.get(n_m) or (candidates[max(candidates)] if candidates else None)
    if model is not None:
        n = n_m * 2
        # Strong scaling ends where the global batch no longer splits into whole sequences per rank.
        tp = int(last.tp)  # the data-parallel ranks share the batch: n / tp of them
        while n <= max(64, 8 * n_m) and (kind == "weak" or int(last.batch_size) % (n // tp) == 0):
            local = int(last.local_batch_size) if kind == "weak" else int(last.batch_size) // (n // tp)
            batch = int(last.batch_size) if kind == "strong" else local * (n // tp)
            out.append(entry(n, batch, local, projected_step(last, n, n_m, kind, model),
                             f"projection (ring model, o, w from {model['world_size']} ranks)"))
            n *= 2
    return out


def plot(all_series: list, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (strong_ax, weak_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (kind, title, entries) in enumerate(all_series):
        ax = strong_ax if kind == "strong" else weak_ax
        color = colors[i % len(colors)]
        measured = [e for e in entries if e[6] == "measured"]
        projected = [measured[-1]] + [e for e in entries if e[6] != "measured"]
        y = 4 if kind == "strong" else 5  # speed-up for strong, efficiency for weak
        ax.plot([e[0] for e in measured], [e[y] for e in measured], "o-", color=color, label=title.split(": ", 1)[1])
        if len(projected) > 1:
            ax.plot([e[0] for e in projected], [e[y] for e in projected], "o--", mfc="none", color=color,
                    label="  projection (ring model)")
    for ax, kind in ((strong_ax, "strong"), (weak_ax, "weak")):
        ns = sorted({e[0] for k, _, es in all_series if k == kind for e in es})
        if ns:
            if kind == "strong":
                ax.plot(ns, [n / ns[0] for n in ns], ":", color="grey", label="ideal")
            else:
                ax.axhline(1.0, ls=":", color="grey", label="ideal")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns, [str(n) for n in ns])
            ax.legend(fontsize="x-small")
        else:
            ax.text(0.5, 0.5, f"no {kind}-scaling runs", ha="center", va="center", transform=ax.transAxes)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("ranks")
    strong_ax.set(ylabel="speed-up T(n0) / T(n)", title="strong scaling (fixed global batch)")
    weak_ax.set(ylabel="efficiency T(n0) / T(n)", title="weak scaling (fixed per-rank batch)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(df: pd.DataFrame, models: dict, out_dir: str) -> str:
    """The scaling tables and scaling.png; models: {(world_size, transport): ddp.allreduce_model(...)}."""
    found = list(series(df))
    rows_of = {title: rows.iloc[-1] for _, title, rows in found}
    all_series = [(kind, title, efficiency_rows(kind, rows, models)) for kind, title, rows in found]
    if not all_series:
        return "### Scaling\n\nno series: runs at two or more rank counts with the same global or per-rank batch"
    parts = []
    for kind, title, entries in all_series:
        row = rows_of[title]
        cells = []
        for n, b, lb, t, s, e, src in entries:
            tokens, mfu = throughput(row, n, b, t)
            cells.append([n, b, lb, fmt(t), fmt(s), f"{100 * e:.1f}%", f"{tokens:,.0f}",
                          "-" if math.isnan(mfu) else f"{100 * mfu:.1f}%", src])
        table = markdown_table(["Ranks", "Global batch", "Per-rank batch", "Step (ms)", "Speed-up", "Efficiency",
                                "Tokens/s per GPU", "MFU", "Source"], cells)
        parts.append(f"### Scaling, {title}\n\n{table}")
    if not models:
        parts.append("No all-reduce run (llmhpc --mode comm) among the results: no projections.")
    plot(all_series, os.path.join(out_dir, "scaling.png"))
    parts.append("![strong and weak scaling](scaling.png)")
    return "\n\n".join(parts)


if __name__ == "__main__":  # a section of report.py's, with no command line of its own
    sys.exit("analysis/scaling.py writes report.py's ddp section: python3 analysis/report.py DIR...")

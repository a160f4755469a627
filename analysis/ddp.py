#!/usr/bin/env python3
"""The reference DDP study's tables from llmhpc --mode ddp runs.

    python3 analysis/ddp.py results/ddp-20261122-103000            # aligned text
    python3 analysis/ddp.py DIR --markdown                          # markdown, for reports
    python3 analysis/ddp.py DIR --torch torch_ddp.jsonl             # + PyTorch DDP and FSDP2 (analysis/torch_ddp.py)
    python3 analysis/ddp.py DIR --comm results/comm-20261122-104000 # bucket model from a measured all-reduce

One group of tables per setup (model, context, global batch, precision, attention, ranks):
  (a) strategies: implementation, bucket size, buckets, step mean/std, exposed communication
      mean/std, comm % of step, the slowest rank's step, MiB all-reduced per step, peak memory,
      status (the reference naive/flat/overlap table); where only --ddp none ran (each rank
      alone, e.g. a tensor-parallel sweep's compute), those rows instead;
  (b) bucket sizes: bucketed at each --bucket-mb beside naive, flat and overlap, with the
      speed-ups over naive and overlap (the reference ddp_bucketed table);
  (c) the cost of data parallelism: each strategy's step against `none`, the compute-only
      baseline (the same local batch, no communication);
  (d) with --torch (JSON lines of analysis/torch_ddp.py): PyTorch's DistributedDataParallel
      beside llmhpc's bucketed at the same bucket size, PyTorch without DDP (--single) beside
      `none`; ratio llmhpc / PyTorch;
  (e) the reference bucket model: with s the gradient bytes, w the all-reduce bandwidth and o the
      overhead of one collective, the communication left after backward is
      T_over(n_b) = n_b o + s / (n_b w), least at the bucket size b* = sqrt(s o w). With --comm
      (an llmhpc --mode comm run with all-reduce at two sizes or more) o and w are those of the
      line through the measured times of the two sizes around a bucket's bytes (below the
      smallest size the two smallest, above the largest the two largest): each bucket size's
      prediction takes its own, and b* the line around b* itself (bucket_optimum); without
      --comm, o and w are fitted to the bucketed runs' measured exposed communication (least
      squares, o, w >= 0); a comm run on other ranks than the setup's data-parallel ones is
      extended to them as a ring (analysis/scaling.py). The measured times are mode comm's
      back-to-back time per operation, averaged over ranks, fp32 in place. Predicted against
      measured per bucket size, and b* (with the o and w of the line around it; (i) names
      another o, of the line through the smallest and largest sizes, a summary), and the bucket
      sizes whose all-reduce lies outside the sizes measured;
  (f) with --shard-optimizer runs, or PyTorch records that shard: each strategy x sharding
      (none, broadcast, zero1, zero2, zero3) with its step, exposed communication (gradients, and after a
      sharded optimizer the parameters' collectives) and the largest rank's memory after init,
      before and after the optimizer, its optimizer state and peak (the reference
      optimizer_state_sharding table); with --torch, a row per PyTorch setup x sharding:
      DDP with AdamW (none), with ZeroRedundancyOptimizer (zero), and FSDP2 (torch-fsdp2-*:
      fsdp2, ZeRO-3, and fsdp2-noreshard, ZeRO-2-like; no bucket), from torch_ddp.py
      --shard-optimizer none,zero,fsdp2,fsdp2-noreshard, their live bytes at the same three points;
  (g) with --shard-optimizer runs: where each strategy x sharding's step goes (forward, backward,
      the gradients' exposed communication, optimizer, the parameters' communication after it)
      and its step over the unsharded step of the same strategy and bucket size;
  (h) with --shard-optimizer runs: the model state per rank by stage, each strategy x sharding's
      largest rank's params + grads + optimizer bytes after the optimizer (what training holds
      between steps) beside analysis/accounting.py's state_bytes_per_rank (none: 4P masters + G P
      gradients + 8P m, v, + 2P bf16 copy under bf16; zero1: m, v 8P/n; zero2: 12P/n + the weights
      kept gathered; zero3: 12P/n), Measured / Predicted, and the reference FSDP model's 16 P / N;
  (i) with --shard-optimizer runs: the communication model by stage, (e)'s o and w (the --comm run,
      or the fit) as a ring of bus bandwidth B = w 2(n0-1)/n0 on n0 ranks: on k ranks an all-reduce of
      S bytes takes o(k) + 2(k-1)/k S / B, a reduce-scatter or all-gather o(k) + (k-1)/k S / B, a
      broadcast o(k) + S / B, o(k) = o (k-1)/(n0-1) (analysis/scaling.py's stage_comm_ms). Per
      sharded configuration the exposed communication measured beside what the model predicts for
      it: the gradients' collectives left after backward (broadcast: all-reduces over the n ranks;
      zero1: a reduce-scatter per bucket, zero2 and zero3 per unit, over the g ranks of a shard
      group, and with hybrid groups each part's all-reduce over the n / g groups; overlapped: every
      collective's o and the last one's bytes, as (e), never less than all of them less backward);
      the parameters' collectives after it are waited for in the next forward (zero3: forward and
      backward), so they are predicted beside the forward time, end to end and what is waited for.
      Tables (a)-(e) keep to the unsharded runs.

Times are ms. Step and comm pool the samples of every rank (--rank R: one rank's); "slowest"
is the mean over the timed steps of the slowest rank's step (step_ms_max_over_ranks), the
reference study's measure, which (b), (c) and (d) compare. Exposed communication is what backward did not
hide: from the end of backward until every gradient is reduced. Configurations that ran out of
memory or failed are rows with their status and '-'. Under tensor parallelism (--tp) every table
has TP wait beside the exposed communication: what the layers waited for the tensor-parallel
group's collectives (tp_comm_ms), inside forward and backward, not added to them. report_section
(analysis/report.py) prints the same tables, draws ddp_breakdown.png (each strategy's step: compute
against exposed communication, the tp wait hatched over forward and backward) and, with runs at
several rank counts, the scaling study (analysis/scaling.py); at one rank count, the choice of
layout among those run at the same ranks and global batch (scaling.choices: --ddp none on several
data-parallel ranks never chosen).
Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling  # noqa: E402
from comm import operation_time_us  # noqa: E402
from llmhpc_h5 import (MIB, SchemaError, model_name, open_run, peak_cell, read_json_lines,  # noqa: E402
                       repeated_across_runs, run_directories)
from plotting import legend_above  # noqa: E402

STRATEGIES = ("none", "naive", "flat", "overlap", "bucketed")  # the order of the rows
SETUP_KEYS = ("model", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length", "batch_size",
              "local_batch_size", "world_size", "tp", "sequence_parallel", "tp_overlap", "precision", "grad_dtype",
              "attention", "low_memory")
# Setups in this order: smaller models first, then context, batch, ranks, tensor parallelism, precision.
SETUP_ORDER = ("d_model", "num_layers", "d_ff", "num_heads", "vocab_size", "context_length", "batch_size", "world_size",
               "tp", "sequence_parallel", "tp_overlap", "precision", "grad_dtype", "attention", "low_memory")
# What, beside the setup, makes a row one configuration.
CASE_KEYS = ("ddp", "bucket_mb", "shard_optimizer", "collective_engine", "grad_reduce_dtype")
# The model state table (h) counts (memory categories), and the columns load() adds from them.
STATE_CATEGORIES = ("params", "grads", "optimizer")
STATE_COLUMNS = ("state_after_optimizer_bytes", *(f"state_{c}_bytes" for c in STATE_CATEGORIES))
# What a PyTorch record must share with a setup to be compared with it.
MATCH_KEYS = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length", "batch_size", "world_size",
              "precision")


def fmt(value, decimals: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


def impl(row) -> str:
    """The strategy, with bf16 where fp32 gradients travelled as bf16 (--grad-reduce-dtype; gradients
    made in bf16 say so in the setup's title), and what moved its bytes where it was not NCCL's
    kernels (--collective-engine)."""
    cast = row.get("grad_reduce_dtype") == "bf16" and row.get("grad_dtype", "fp32") != "bf16"
    return (row["ddp"] + (" bf16" if cast else "")
            + (" (copy)" if row.get("collective_engine", "sm") == "copy" else ""))


def bucket_cell(row) -> str:
    return "-" if row["ddp"] != "bucketed" else f"{row['bucket_mb']:g}"


def ratio(a: float, b: float) -> str:
    return "-" if any(x is None or math.isnan(x) for x in (a, b)) or b <= 0 else f"{a / b:.2f}"


# The sharded tables' definition of Param Comm, which their gradients' exposed communication
# (Grad Comm) leaves out.
PARAM_COMM_NOTE = ("Param Comm: what the step spent after the optimizer before the next forward could begin "
                   "(param_comm_ms; under zero2 the cast of each rank's updated shard into its all-gathers' "
                   "buffers, the all-gathers issued; the next forward waits for each range of parameters as it "
                   "reaches it, so what the all-gathers did not hide is in Fwd)")
# The tables' definition of TP wait, the column every table of a tensor-parallel setup has beside
# its exposed communication: a wait inside forward and backward, which the step's exposed
# communication (after backward) does not count.
TP_WAIT_NOTE = ("TP wait: what the layers waited for the tensor-parallel group's collectives (tp_comm_ms, summed "
                "over the step), inside Fwd and Bwd and so in the step, not added to them, and not in the exposed Comm")


def tp_shown(g: pd.DataFrame) -> bool:
    """Whether a setup's tables show TP wait: its layout has tensor-parallel groups."""
    return bool((g.tp > 1).any())


def _numeric(cell: str) -> bool:
    try:
        float(cell.rstrip("%"))
        return True
    except ValueError:
        return cell == "-"


def heading(title: str, markdown: bool) -> str:
    """A table's title as a heading: its first line (the table and the setup); the lines after it,
    what the columns mean, as a paragraph under the heading, not in it."""
    head, _, note = title.partition("\n")
    if not markdown:  # one line, as the text tables' readers take it
        return f"{head} ({note.rstrip('.')})" if note else head
    return f"### {head}" + (f"\n\n{note}" if note else "")


def render(title: str, header: list, rows: list, markdown: bool) -> str:
    """A table with a title (heading()): markdown, or text in aligned columns; numeric columns
    right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    right = [all(_numeric(r[i]) for r in rows) for i in range(len(header))]
    if markdown:
        lines = [heading(title, markdown), "", "| " + " | ".join(header) + " |",
                 "| " + " | ".join("---:" if r else "---" for r in right) + " |"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()
    return "\n".join([heading(title, markdown), line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def setup_title(s: dict) -> str:
    return (f"{model_name(s)}, context {s['context_length']}, global batch {s['batch_size']} "
            f"({s['local_batch_size']} per rank), {s['world_size']} rank{'s' if s['world_size'] != 1 else ''}"
            + (f" (tp {s['tp']} x dp {s['world_size'] // s['tp']}{', sequence parallel' if s['sequence_parallel'] else ''}"
               + (f", products in {s['tp_overlap']} chunks" if s.get("tp_overlap", 1) > 1 else "") + ")"
               if s.get("tp", 1) > 1 else "")
            + f", {s['precision']}"
            + (", bf16 gradients" if s.get("grad_dtype") == "bf16" else "") + f", {s['attention']} attention"
            + (", low memory" if s["low_memory"] else "")
            + (f" [run {os.path.basename(os.path.normpath(s['run']))}]" if s.get("by_run") else ""))


def state_after_optimizer(run, rank) -> dict:
    """{configuration: {STATE_COLUMNS: bytes, shard_group: ranks}}: the model state after the
    optimizer (what training holds between steps) of the rank holding the most of it, params +
    grads + optimizer of memory_after_optimizer_<category>_bytes, and that rank's three (left out
    where the records lack the categories: files from before them, or not run); shard_group, the
    ranks that share one copy of the state (hybrid sharding under zero2 and zero3; files from
    before it: every rank)."""
    out = {}
    for name, recs in run.records_by_name("ddp", rank).items():
        out[name] = dict(shard_group=int(recs[0].attrs.get("shard_group", run.world_size)))
        splits = [[r.attrs[f"memory_after_optimizer_{c}_bytes"] for c in STATE_CATEGORIES] for r in recs
                  if all(f"memory_after_optimizer_{c}_bytes" in r.attrs for c in STATE_CATEGORIES)]
        if splits:
            largest = max(splits, key=sum)
            out[name].update(zip(STATE_COLUMNS, [float(sum(largest)), *map(float, largest)]))
    return out


def cores_shared(run) -> str:
    """Where a node's ranks ran more threads (cpu_threads, 1 where not recorded) than the CPUs any
    of them may run on (node_cpus_allowed, the union of their affinity masks): 'vm: 4 ranks, 4
    threads on 2 CPUs'; '' where none did. Files from before node_cpus_allowed: by cpus_allowed,
    the same on every rank of the node, ranks each allowed one CPU taken as bound to cores of
    their own (Open MPI binds no two ranks to one core unless told to overload); files without
    either as not sharing."""
    said = []
    for host, ranks in run.nodes():
        files = [rf for rf in run.files if rf.rank in ranks]
        threads = sum(int(rf.attrs.get("cpu_threads", 1)) for rf in files)
        union = {int(rf.attrs["node_cpus_allowed"]) for rf in files if "node_cpus_allowed" in rf.attrs}
        if union:
            cpus, shared = max(union), threads > max(union)
        else:
            allowed = {int(rf.attrs.get("cpus_allowed", 0)) for rf in files}
            cpus = allowed.pop() if len(allowed) == 1 else 0
            shared = cpus > 0 and threads > cpus and (cpus >= 2 or len(files) == 1)
        if shared:
            said.append(f"{host}: {len(files)} rank{'s' if len(files) > 1 else ''}, {threads} threads on {cpus} CPUs")
    return "; ".join(said)


def load(directories: list, rank) -> tuple:
    """(every run's ddp_summary in one frame, strategies in STRATEGIES order; a line about each run)."""
    frames, notes = [], []
    for directory in directories:
        run = open_run(directory)
        if run.mode != "ddp":
            raise SchemaError(f"{directory}: a '{run.mode}' run, not a ddp run (llmhpc --mode ddp)")
        frame = run.ddp_summary(rank)
        if frame.empty:
            raise SchemaError(f"{directory}: no ddp records (did the run finish any configuration?)")
        held = state_after_optimizer(run, rank)
        for column in (*STATE_COLUMNS, "shard_group"):
            frame[column] = [held.get(name, {}).get(column, math.nan) for name in frame["name"]]
        a = run.attrs
        frames.append(frame.assign(run=directory, device_name=a.get("device_name", ""), nodes=len(run.nodes()),
                                   tf32=bool(run.config.get("tf32", False)), cores_shared=cores_shared(run)))
        state = "" if run.finished else " (INCOMPLETE: a rank's file says the run did not finish)"
        notes.append(f"llmhpc ddp on {a['device_name']} ({a['hostname']}), {run.describe_ranks()}, backend "
                     f"{a['backend']}; {'every rank pooled' if rank is None else f'rank {rank}'}; git {a['git_sha']}; "
                     f"started {a['start_time']}{state}: {directory}")
    df = pd.concat(frames, ignore_index=True)
    df["order"] = df["ddp"].map({s: i for i, s in enumerate(STRATEGIES)}).fillna(len(STRATEGIES))
    df = df.sort_values([*SETUP_ORDER, "order", "bucket_mb"], kind="stable").reset_index(drop=True)
    # Runs that measured the same configurations: each run's rows a setup of their own, so that
    # no table mixes them (nor compares one run's strategy with another run's baseline).
    df["by_run"] = repeated_across_runs(df, [*SETUP_KEYS, *CASE_KEYS])
    keys = [*SETUP_KEYS, "run"] if df["by_run"].iloc[0] else list(SETUP_KEYS)
    setups = {key: i for i, key in enumerate(dict.fromkeys(df[keys].itertuples(index=False)))}
    df["setup"] = [setups[key] for key in df[keys].itertuples(index=False)]
    return df, notes


def ok(row) -> bool:
    return row["status"] == "ok"


def strategies_table(g: pd.DataFrame, markdown: bool, title: str) -> str:
    """(a): the strategies that communicate; where only --ddp none ran (each rank alone, e.g. a
    tensor-parallel sweep's compute), those rows, so that a setup is never left without a table."""
    rows, tp = [], tp_shown(g)
    alone = not (g.ddp != "none").any()
    for _, r in g[(g.ddp != "none") | alone].iterrows():
        t = ok(r)
        rows.append([impl(r), bucket_cell(r), fmt(r.buckets, 0) if t else "-", fmt(r.step_mean), fmt(r.step_std),
                     fmt(r.comm_mean), fmt(r.comm_std), fmt(r.comm_pct, 1) + "%" if math.isfinite(r.comm_pct) else "-"]
                    + ([fmt(r.tp_comm_mean)] if tp else [])
                    + [fmt(r.comm_busy_mean), fmt(r.slowest_step_mean),
                       fmt(r.comm_mib_per_step, 1) if t else "-", peak_cell(r.status, r.peak_memory_bytes, MIB, 1),
                       r.status])
    if not rows:
        return ""
    heading = "(a) each rank alone (--ddp none): no strategy communicated" if alone else "(a) DDP strategies"
    return render(f"{heading}: {title}\nStep Mean and Std: every rank's steps pooled; Slowest Step: the "
                  f"mean over the timed steps of the slowest rank's step; Comm: exposed, what the step waited for after "
                  f"backward; Coll. time: the collectives' own device time, hidden or not, NCCL only"
                  + (f"; {TP_WAIT_NOTE}" if tp else "") + ".",
                  ["Impl", "Bucket (MiB)", "Buckets", "Step Mean (ms)", "Step Std (ms)", "Comm Mean (ms)",
                   "Comm Std (ms)", "Comm %"] + (["TP wait Mean (ms)"] if tp else [])
                  + ["Coll. Time (ms)", "Slowest Step (ms)", "MiB/step", "Peak (MiB)", "Status"], rows, markdown)


def step_of(g: pd.DataFrame, strategy: str) -> float:
    """The slowest-rank step of the first ok row of `strategy` in g (NaN if none)."""
    rows = g[(g.ddp == strategy) & (g.status == "ok")]
    return float(rows.slowest_step_mean.iloc[0]) if len(rows) else math.nan


def buckets_table(g: pd.DataFrame, markdown: bool, title: str) -> str:
    if not (g.ddp == "bucketed").any():
        return ""
    naive, overlap = step_of(g, "naive"), step_of(g, "overlap")
    rows, tp = [], tp_shown(g)
    for _, r in g[g.ddp != "none"].iterrows():
        step = r.slowest_step_mean if ok(r) else math.nan
        rows.append([impl(r), bucket_cell(r), fmt(r.buckets, 0) if ok(r) else "-",
                     fmt(r.collectives_issued_after_backward, 0) if ok(r) else "-", fmt(step),
                     fmt(r.comm_mean)] + ([fmt(r.tp_comm_mean)] if tp else [])
                    + [ratio(naive, step), ratio(overlap, step), r.status])
    return render(f"(b) bucket sizes: {title}\nSlowest Step: the mean over the timed steps of the slowest rank's "
                  f"step; speed-up against the strategies --ddp naive and overlap = their slowest step / this one"
                  + (f"; {TP_WAIT_NOTE}" if tp else "") + ".",
                  ["Impl", "Bucket (MiB)", "Buckets", "Issued after bwd", "Slowest Step (ms)", "Exposed Comm (ms)"]
                  + (["TP wait (ms)"] if tp else []) + ["vs --ddp naive", "vs --ddp overlap", "Status"], rows, markdown)


def overhead_table(g: pd.DataFrame, markdown: bool, title: str) -> str:
    base = step_of(g, "none")
    if math.isnan(base) or len(g) < 2:
        return ""
    rows, tp = [], tp_shown(g)
    for _, r in g.iterrows():
        step = r.slowest_step_mean if ok(r) else math.nan
        rows.append([impl(r), bucket_cell(r), fmt(step), fmt(base), fmt(step - base),
                     fmt(100.0 * (step / base - 1.0), 1) + "%" if ok(r) else "-", fmt(r.forward_mean),
                     fmt(r.backward_mean), fmt(r.comm_mean)] + ([fmt(r.tp_comm_mean)] if tp else [])
                    + [fmt(r.optimizer_mean), fmt(r.get("sm_clock_mhz_median", math.nan), 0), r.status])
    # The clock says what the step's time alone does not: a power-capped GPU that clocks down as it
    # warms makes the first configuration of a run faster, and its clock swings for a few seconds
    # after each configuration's build (llmhpc --heat-s heats every configuration).
    alone = "each tensor-parallel group alone" if tp else "each rank alone"  # tp: the TP wait is shown
    return render(f"(c) overhead of data parallelism: {title}\nnone: {alone} at the local batch; SM MHz: "
                  f"the lowest rank's median clock" + (f"; {TP_WAIT_NOTE}" if tp else "") + ".",
                  ["Impl", "Bucket (MiB)", "Slowest Step (ms)", "none (ms)", "Overhead (ms)", "Overhead", "Fwd (ms)",
                   "Bwd (ms)", "Comm (ms)"] + (["TP wait (ms)"] if tp else []) + ["Opt (ms)", "SM MHz", "Status"],
                  rows, markdown)


def read_torch(paths: list) -> list:
    """The configurations of analysis/torch_ddp.py's JSON lines files, in order."""
    return [r for path in paths
            for r in read_json_lines(path, (*MATCH_KEYS, "ddp", "setup", "status"), "a torch_ddp.py record")]


def torch_sharding(t: dict) -> str:
    return t.get("shard_optimizer", "none")


def torch_fsdp(t: dict) -> bool:
    """A record of PyTorch's FSDP2 (torch_ddp.py --shard-optimizer fsdp2 or fsdp2-noreshard), not of DDP."""
    return torch_sharding(t).startswith("fsdp")


def torch_sharding_cell(t: dict) -> str:
    return "ZeroRedundancyOptimizer" if torch_sharding(t) == "zero" else torch_sharding(t)


def torch_step(t: dict) -> float:
    return float(np.mean(t["step_ms_max_over_ranks"])) if t["status"] == "ok" else math.nan


def torch_reduce_dtype(t: dict) -> str:
    """What PyTorch's gradients travelled as: bf16 under its bf16_compress_hook (torch_ddp.py
    --grad-reduce-dtype bf16), else the gradients' own dtype."""
    return t.get("grad_reduce_dtype", "fp32")


def torch_table(g: pd.DataFrame, torch_records: list, markdown: bool, title: str) -> tuple:
    """(the table, the PyTorch records it used). A DDP record is put beside bucketed at its bucket
    size whose gradients travelled as PyTorch's did."""
    first = g.iloc[0]
    matching = [t for t in torch_records if all(t[k] == first[k] for k in MATCH_KEYS) and torch_sharding(t) == "none"]
    rows = []
    for t in matching:
        if t["ddp"] == "none":
            ours = g[g.ddp == "none"]
        else:
            ours = g[(g.ddp == "bucketed") & np.isclose(g.bucket_mb, float(t["bucket_mb"]))
                     & ((g.grad_reduce_dtype == "bf16") == (torch_reduce_dtype(t) == "bf16"))]
        r = ours.iloc[0] if len(ours) else None
        step = r.slowest_step_mean if r is not None and ok(r) else math.nan
        rows.append([t["setup"], "single" if t["ddp"] == "none" else
                     "DDP bf16" if torch_reduce_dtype(t) == "bf16" else "DDP", "-" if t["ddp"] == "none" else
                     f"{float(t['bucket_mb']):g}", fmt(torch_step(t)), t["status"],
                     "not run" if r is None else impl(r), fmt(step), ratio(step, torch_step(t))])
    if not rows:
        return "", []
    return render(f"(d) llmhpc vs PyTorch DistributedDataParallel: {title}\nThe slowest rank's step; ratio = "
                  f"llmhpc / PyTorch; single = no DDP, against none.",
                  ["PyTorch setup", "PyTorch", "Bucket (MiB)", "PyTorch Step (ms)", "PyTorch Status", "llmhpc",
                   "llmhpc Step (ms)", "Ratio"], rows, markdown), matching


def allreduce_model(directory: str) -> dict:
    """The communication model of an llmhpc --mode comm run: o (ms) and w (bytes/ms) of its all-reduce, as the
    reference bucket model wants them, the line through its smallest and largest sizes' times; and every size
    measured of each collective, `kinds` {collective: [(bytes, ms)]}, from which scaling.at_size takes the
    line through the two sizes around a collective's; the run's `folder` name and `nodes` (the links
    it measured). Each collective's times are
    those of one dtype and placement: fp32 before the others, in place before out of place."""
    run = open_run(directory)
    if run.mode != "comm":
        raise SchemaError(f"--comm {directory}: a '{run.mode}' run, not a comm run (llmhpc --mode comm)")
    sizes = {}
    for records in run.records_by_name("comm").values():
        a = records[0].attrs
        if a["collective"] in scaling.BUS_FACTOR and all(r.ok for r in records):
            sizes.setdefault((a["collective"], a["dtype"] != "float", a["placement"] != "inplace"), []).append(
                (int(a["bytes"]), operation_time_us(records) / 1e3))
    kinds, taken = {}, set()
    for (collective, other_dtype, out_of_place), points in sorted(sizes.items()):
        if len({b for b, _ in points}) >= 2 and collective not in kinds:
            kinds[collective] = sorted(points)
            taken.add(("fp32" if not other_dtype else "another dtype")
                      + (", in place" if not out_of_place else ", out of place"))
    if "allreduce" not in kinds:
        raise SchemaError(f"--comm {directory}: no all-reduce measured without error at two sizes or more; o and w "
                          f"need two")
    points = kinds["allreduce"]
    o, w = scaling.line_through(points[0], points[-1])
    measured = "; ".join(f"{c}: " + ", ".join(f"{b / 1e6:g} MB {ms * 1e3:.1f} us" for b, ms in p)
                         for c, p in kinds.items())
    return dict(o=o, w=w, world_size=run.world_size, kinds=kinds, cores_shared=cores_shared(run),
                folder=os.path.basename(os.path.normpath(directory)), nodes=len(run.nodes()),
                source=f"from --comm {directory} ({run.attrs['backend']} on {run.world_size} ranks, {measured}; "
                       f"each the back-to-back time per operation averaged over ranks, {' / '.join(sorted(taken))}; "
                       f"o and w of the line through the two sizes around each collective's)")


def fit_model(n: np.ndarray, y: np.ndarray, s: float) -> tuple:
    """(o, w) >= 0 minimising sum (n o + s / (n w) - y)^2: least squares in (o, 1/w), the best of the
    unconstrained fit (when both are >= 0) and the two one-parameter fits. w is inf when 1/w is 0."""
    a = np.column_stack([n, s / n])
    candidates = []
    x = np.linalg.lstsq(a, y, rcond=None)[0]
    if (x >= 0).all():
        candidates.append(x)
    for j in range(2):
        c = a[:, j]
        x = np.zeros(2)
        x[j] = max(float(c @ y) / float(c @ c), 0.0)
        candidates.append(x)
    o, u = min(candidates, key=lambda x: float(np.sum((a @ x - y) ** 2)))
    return float(o), (1.0 / u if u > 0 else math.inf)


def sharding_table(g: pd.DataFrame, torch_records: list, markdown: bool, title: str) -> tuple:
    """(f) The reference optimizer state sharding: per strategy and --shard-optimizer, step, exposed
    communication and the largest rank's memory at the three points, then a row per PyTorch record
    of the setup: DDP with and without ZeroRedundancyOptimizer, and FSDP2. (the table, the PyTorch
    records it used); empty without sharded llmhpc runs or sharded PyTorch records."""
    first = g.iloc[0]
    matching = [t for t in torch_records if all(t[k] == first[k] for k in MATCH_KEYS) and t["ddp"] != "none"]
    if (g.shard_optimizer == "none").all() and all(torch_sharding(t) == "none" for t in matching):
        return "", []
    mib = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt(v / 2**20)
    rows, tp = [], tp_shown(g)
    for _, r in g[g.ddp != "none"].iterrows():
        rows.append([impl(r), bucket_cell(r), r.shard_optimizer, fmt(r.slowest_step_mean), fmt(r.comm_mean)]
                    + ([fmt(r.tp_comm_mean)] if tp else [])
                    + [mib(r.memory_after_init_bytes), mib(r.memory_before_optimizer_bytes),
                       mib(r.memory_after_optimizer_bytes), mib(r.memory_after_optimizer_optimizer_bytes),
                       peak_cell(r.status, r.peak_memory_bytes, MIB, 2), r.status])
    for t in matching:
        ranks = t.get("ranks", [])
        largest = lambda key: max((p[key] for p in ranks if p.get(key) is not None), default=None)
        rows.append([f"torch-{'fsdp2' if torch_fsdp(t) else 'ddp'}-{t['setup']}"
                     + (" bf16" if torch_reduce_dtype(t) == "bf16" else ""),
                     "-" if t.get("bucket_mb") is None else f"{float(t['bucket_mb']):g}",
                     torch_sharding_cell(t), fmt(torch_step(t)), "-"] + (["-"] if tp else []) +
                    [mib(largest("memory_after_init_bytes")), mib(largest("memory_before_optimizer_bytes")),
                     mib(largest("memory_after_optimizer_bytes")), "-", mib(largest("peak_memory_bytes")), t["status"]])
    fsdp = any(torch_fsdp(t) for t in matching)
    return render(f"(f) optimizer state sharding: {title}\nThe slowest rank's step; memory: the largest rank's live "
                  "bytes"
                  + ("; PyTorch FSDP2: fsdp2 shards parameters, gradients and optimizer state (ZeRO-3), "
                     "fsdp2-noreshard keeps a block's parameters gathered from forward to backward (ZeRO-2-like)"
                     if fsdp else "") + (f"; {TP_WAIT_NOTE}" if tp else "") + ".",
                  ["Impl", "Bucket (MiB)", "Sharding", "Slowest Step (ms)", "Exposed Comm (ms)"]
                  + (["TP wait (ms)"] if tp else [])
                  + ["After init (MiB)", "Before opt (MiB)", "After opt (MiB)", "Optimizer state (MiB)", "Peak (MiB)",
                     "Status"], rows, markdown), matching


def sharding_phases_table(g: pd.DataFrame, markdown: bool, title: str) -> str:
    """(g) Where a sharded step goes: per strategy and --shard-optimizer the mean of each phase
    (the gradients' exposed communication, and the parameters' after the optimizer) and the
    slowest-rank step against the unsharded one of the same strategy and bucket size; empty
    without sharded runs."""
    if (g.shard_optimizer == "none").all():
        return ""
    rows, tp = [], tp_shown(g)
    for _, r in g[g.ddp != "none"].iterrows():
        same = g[(g.ddp == r.ddp) & (g.bucket_mb == r.bucket_mb) & (g.collective_engine == r.collective_engine)
                 & (g.grad_reduce_dtype == r.grad_reduce_dtype)
                 & (g.shard_optimizer == "none") & (g.status == "ok")]
        unsharded = float(same.slowest_step_mean.iloc[0]) if len(same) else math.nan
        step = r.slowest_step_mean if ok(r) else math.nan
        vs = "-" if math.isnan(step) or math.isnan(unsharded) else f"{step / unsharded:.3f}x"
        rows.append([impl(r), bucket_cell(r), r.shard_optimizer, fmt(r.forward_mean), fmt(r.backward_mean),
                     fmt(r.grad_comm_mean)] + ([fmt(r.tp_comm_mean)] if tp else [])
                    + [fmt(r.optimizer_mean), fmt(r.param_comm_mean), fmt(step), vs, r.status])
    return render(f"(g) where a sharded step goes: {title}\nPhase means; step: the slowest rank's; Grad Comm: what "
                  f"the gradients' collectives left after backward; {PARAM_COMM_NOTE}"
                  + (f"; {TP_WAIT_NOTE}" if tp else "") + ".",
                  ["Impl", "Bucket (MiB)", "Sharding", "Fwd (ms)", "Bwd (ms)", "Grad Comm (ms)"]
                  + (["TP wait (ms)"] if tp else [])
                  + ["Opt (ms)", "Param Comm (ms)", "Slowest Step (ms)", "vs unsharded", "Status"], rows, markdown)


def stage_of(row) -> tuple:
    """(the --shard-optimizer stage, share_weights) of a row: ddp_summary writes "zero1 bf16" where
    the bf16 copy travelled (--share-weights bf16)."""
    stage, _, shared = str(row["shard_optimizer"]).partition(" ")
    return stage, "bf16" if shared == "bf16" else "master"


def state_table(g: pd.DataFrame, markdown: bool, title: str) -> str:
    """(h) Model state per rank by stage: per strategy and --shard-optimizer, the bytes a rank holds
    between steps as analysis/accounting.py's state_bytes_per_rank predicts them (its formula in P,
    n and F) beside the largest rank's measured params + grads + optimizer after the optimizer,
    their ratio, and the reference FSDP model's 16 P / N; empty without sharded runs."""
    from accounting import fp32_read_parameters, fsdp_state_per_device, state_split_per_rank  # it imports this module
    if (g.shard_optimizer == "none").all():
        return ""
    first = g.iloc[0]
    tp = int(first.tp)
    # Under tensor parallelism a rank holds its part: P its parameters (the vocabulary padded to
    # a multiple of 8 tp), F its rows of the embedding and the norm gains.
    counted = (g.num_params if tp == 1 else g.part_params).dropna()
    p = int(counted.iloc[0]) if len(counted) else None
    vocab = int(first.vocab_size) if tp == 1 else -(-int(first.vocab_size) // (8 * tp)) * 8
    f = fp32_read_parameters(int(first.d_model), int(first.num_layers), vocab)
    mib = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt(v / MIB, 3)
    rows = []
    for _, r in g[g.ddp != "none"].iterrows():
        stage, share = stage_of(r)
        n = int(r.shard_group) if r.shard_group > 0 else int(r.world_size)  # the ranks the state is cut among
        try:
            model = state_split_per_rank(p, n, stage, r.precision, share, r.grad_dtype, f) if p else None
        except ValueError:  # a stage this model does not know
            model = None
        predicted = model["params"] + model["grads"] + model["optimizer"] if model else math.nan
        measured = r.state_after_optimizer_bytes
        split = " / ".join(mib(r[f"state_{c}_bytes"]) for c in STATE_CATEGORIES)
        rows.append([impl(r), bucket_cell(r), r.shard_optimizer, n, model["formula"] if model else "-", mib(predicted),
                     mib(measured), split if not math.isnan(measured) else "-",
                     "-" if math.isnan(measured) or not predicted > 0 else f"{measured / predicted:.3f}",
                     mib(fsdp_state_per_device(p, n)) if p else "-", r.status])
    part = " of a rank's tensor-parallel part" if tp > 1 else ""
    where = (f"P = {p:,} parameters{part}, " if p else "") + "n the ranks that share one copy of the state (all " \
        + ("the data-parallel ranks, those holding the same part" if tp > 1 else "of them") \
        + ", or --shard-group's under zero2 and zero3)"
    if first.precision == "bf16":
        where += f", F = {f:,} read in fp32 under bf16 (the embedding and norm gains)"
    return render(f"(h) model state per rank by stage: {title}\nMiB held between steps: the largest rank's params + "
                  f"grads + optimizer after the optimizer, beside analysis/accounting.py's state_bytes_per_rank; "
                  f"{where}; shards are padded to ranks x 64 elements per unit lane, or to whole pages under "
                  f"--share-weights bf16, so a small model measures a few pages more; FSDP 16P/N: the reference FSDP "
                  f"model's M_state / N, the state while the gradients exist.",
                  ["Impl", "Bucket (MiB)", "Sharding", "n", "Model", "Predicted (MiB)", "Measured (MiB)",
                   "Params / Grads / Opt (MiB)", "Measured / Predicted", "FSDP 16P/N (MiB)", "Status"], rows, markdown)


def ring_model(g: pd.DataFrame, comm_model) -> tuple:
    """(the all-reduce model of a setup's rows g: o (ms), w (bytes/ms), world_size and source, or None;
    why none). comm_model's (a --mode comm run, noted where its ranks are not the setup's
    data-parallel ranks: scaling.ring_ms extends it to them), else o and w fitted to the exposed
    communication of g's unsharded bucketed runs at two or more bucket counts (least squares)."""
    ranks = int(g.world_size.iloc[0]) // int(g.tp.iloc[0])  # the gradients' ring: the data-parallel ranks
    if comm_model is not None:
        source = comm_model["source"]
        if comm_model["world_size"] != ranks:
            source += (f"; NOTE: that run had {comm_model['world_size']} ranks, these {ranks} data-parallel "
                       f"ranks: o and w extended to them as a ring (analysis/scaling.py)")
        return dict(comm_model, source=source), ""
    b = g[(g.ddp == "bucketed") & (g.status == "ok") & (g.shard_optimizer == "none")]
    n = b.buckets.to_numpy(dtype=float)
    if len(set(n)) < 2:
        return None, "needs bucketed runs at two or more bucket counts, or --comm with an all-reduce run"
    o, w = fit_model(n, b.comm_mean.to_numpy(dtype=float), float(b.comm_bytes_per_step.iloc[0]))
    source = f"fitted to the measured exposed comm of {len(b)} bucketed run(s) (least squares, no --comm run)"
    if len(set(n)) == 2:  # two unknowns, two points
        source += ("; with two bucket counts the fit passes through both, so Measured / Predicted is 1 by "
                   "construction: a third bucket size, or --comm, tests the model")
    return dict(o=o, w=w, world_size=ranks, source=source), ""


def bucket_model_table(g: pd.DataFrame, comm_model, markdown: bool, title: str) -> str:
    b = g[(g.ddp == "bucketed") & (g.status == "ok")]
    ranks = int(g.world_size.iloc[0]) // int(g.tp.iloc[0])
    if b.empty or ranks < 2:  # one data-parallel rank: no all-reduce to model
        return ""
    s = float(b.comm_bytes_per_step.iloc[0])
    head = (f"(e) bucket model T_over(n_b) = n_b o + s / (n_b w): {title}\nComm time: the device time of all the "
            f"step's all-reduces on their stream, hidden or not (comm_busy_ms, NCCL only), beside n_b o + s / w.")
    model, why = ring_model(g, comm_model)
    if model is None:
        return f"{heading(head, markdown)}\n\n{why}"
    b_star, o, w, pair = bucket_optimum(model, s, ranks)
    # Every bucket's o and the last one's bytes: n_b all-reduces of s / n_b each (scaling.ring_ms).
    predicted = [scaling.ring_ms("allreduce", s / max(r.buckets, 1), ranks, model, max(r.buckets, 1),
                                 size=s / max(r.buckets, 1)) for _, r in b.iterrows()]
    # All of them end to end, what the collectives' device time (comm_busy_ms) measures.
    whole = [scaling.ring_ms("allreduce", s, ranks, model, max(r.buckets, 1)) for _, r in b.iterrows()]
    rows = [[f"{r.bucket_mb:g}", fmt(r.buckets, 0), fmt(r.comm_mean, 3), fmt(p, 3), ratio(r.comm_mean, p),
             fmt(r.comm_busy_mean, 3), fmt(t, 3), ratio(r.comm_busy_mean, t)]
            for (_, r), p, t in zip(b.iterrows(), predicted, whole)]
    table = render(head, ["Bucket (MiB)", "Buckets n_b", "Measured Comm (ms)", "Predicted T_over (ms)",
                          "Measured / Predicted", "Comm time (ms)", "Predicted n_b o + s / w (ms)",
                          "Time measured / predicted"], rows, markdown)
    # Which line o and w are of: (i) gives another o, that of the line through the smallest and largest sizes.
    line = (f" (the line through the all-reduce's {scaling.megabytes(pair[0])} and {scaling.megabytes(pair[1])}, "
            f"around b*; each bucket size's prediction takes the line around its own bytes)" if pair else "")
    beyond = [f"{r.bucket_mb:g} MiB: {said}" for _, r in b.iterrows()
              if (said := scaling.beyond_measured(model, [("allreduce", s / max(r.buckets, 1))]))]
    return (f"{table}\n\ns = {s / MIB:.3f} MiB of gradients per step; at b*: o = {o * 1e3:.2f} us, "
            f"w = {w * 1e3 / 1e9:.3g} GB/s{line}, {model['source']}."
            + (f"\nThe model extrapolates the collectives' run for bucket {'; '.join(beyond)}." if beyond else "")
            + f"\n{optimum_text(s, o, w)}.")


def optimum_text(s: float, o: float, w: float) -> str:
    """The bucket model's optimum for s gradient bytes at o and w, or why there is none: b* =
    sqrt(s o w) is finite and above 0 only for o > 0 and 0 < w < inf."""
    if o > 0 and 0 < w < math.inf:
        return (f"b* = sqrt(s o w) = {math.sqrt(s * o * w) / MIB:.3g} MiB (n_b* = sqrt(s / (o w)) = "
                f"{math.sqrt(s / (o * w)):.3g}), T_over(b*) = 2 sqrt(s o / w) = {2 * math.sqrt(s * o / w):.3f} ms")
    if o <= 0:
        return "no finite optimum: o = 0, smaller buckets always predict less"
    if w <= 0:
        return "no finite optimum: w = 0, the model moves no bytes"
    return "no finite optimum: 1/w = 0, fewer buckets always predict less"


def bucket_optimum(model: dict, s: float, ranks: int) -> tuple:
    """(b*, o, w, line): the bucket model's optimum b* = sqrt(s o w) for s gradient bytes all-reduced
    on `ranks` ranks, with o and w those of the measured line around b* itself (scaling.at_size,
    extended to the ranks by scaling.allreduce_at): each line between two measured sizes gives a b*,
    and the first that falls among its own line's sizes is kept (the first line's reach down to 0,
    the last's up from the largest size); the first line's where none does; `line`: the two
    all-reduce sizes (bytes) it is drawn through. A model without measured sizes (fitted to the
    bucket sweep) is one line, `line` None."""
    sizes = [b for b, _ in (model.get("kinds") or {}).get("allreduce", [])]
    found = []
    for i in range(max(len(sizes) - 1, 1)):
        line = scaling.at_size(model, (sizes[i] + sizes[i + 1]) / 2) if len(sizes) > 1 else model
        o, w = scaling.allreduce_at(line, ranks)
        b = math.sqrt(s * o * w) if math.isfinite(w) else math.nan  # o = 0: b* = 0, no cost per bucket
        inside = (i == 0 or b >= sizes[i]) and (i >= len(sizes) - 2 or b < sizes[i + 1])
        found.append((not inside, b, o, w, (sizes[i], sizes[i + 1]) if len(sizes) > 1 else None))
    _, b, o, w, pair = min(found, key=lambda f: f[0])  # min is stable: the first line that holds its b*
    return b, o, w, pair


def stage_model_table(g: pd.DataFrame, comm_model, markdown: bool, title: str) -> str:
    """(i) The communication model by stage: per sharded configuration (broadcast, zero1, zero2,
    zero3, hybrid groups) the gradients' exposed communication the rank files measure (grad_comm_mean) beside what
    the ring model predicts for it from the all-reduce's o and B (scaling.stage_comm_ms, its formulas
    written under the table), and the parameters' collectives it predicts, whose wait is in the
    forward (zero3: and backward) time; empty without sharded runs."""
    sharded = g[(g.shard_optimizer != "none") & (g.ddp != "none")]
    if sharded.empty:
        return ""
    head = (f"(i) communication model by stage: {title}\nComm: what the gradients' collectives left after "
            f"backward, measured (the exposed communication less Param Comm) and predicted; {PARAM_COMM_NOTE}, "
            f"zero3's forward and backward waiting for each unit's; Params: the parameters' collectives end to end, and the part Fwd (and Bwd) waits "
            f"for, predicted; Comm time: the device time of all the step's collectives on their stream, hidden or "
            f"not (comm_busy_ms, NCCL only), beside the ring model's for all of them, gradients' and parameters'"
            + (f"; {TP_WAIT_NOTE}, nor in the ring model" if tp_shown(g) else "") + ".")
    model, why = ring_model(g, comm_model)
    if model is None:
        return f"{heading(head, markdown)}\n\n{why}"
    rows, tp = [], tp_shown(g)
    for _, r in sharded.iterrows():
        dp = int(r.world_size) // int(r.tp)
        group = int(r.shard_group) if 0 < r.shard_group < dp and stage_of(r)[0] != "broadcast" else dp
        ranks = f"{group}" if group == dp else f"{group} x {dp // group}"
        if not ok(r):
            rows.append([impl(r), bucket_cell(r), r.shard_optimizer, ranks] + ["-"] * (14 if tp else 13) + [r.status])
            continue
        m, busy = scaling.stage_comm_ms(r, model), r.get("comm_busy_mean", math.nan)
        rows.append([impl(r), bucket_cell(r), r.shard_optimizer, ranks, fmt(r.buckets, 0),
                     fmt(r.comm_bytes_per_step / MIB, 3), fmt(r.grad_comm_mean, 3), fmt(m["grad"], 3),
                     ratio(r.grad_comm_mean, m["grad"]), fmt(r.param_comm_mean, 3), fmt(r.forward_mean, 3),
                     fmt(r.backward_mean, 3)] + ([fmt(r.tp_comm_mean, 3)] if tp else [])
                    + [fmt(m["params_all"], 3), fmt(m["params"], 3), fmt(busy, 3),
                       fmt(m["grad_all"] + m["params_all"], 3), ratio(busy, m["grad_all"] + m["params_all"]), r.status])
    table = render(head, ["Impl", "Bucket (MiB)", "Sharding", "Ranks (group x groups)", "Buckets c",
                          "Grad MiB/step", "Grad Comm measured (ms)", "Grad Comm predicted (ms)", "Measured / Predicted",
                          "Param Comm (ms)", "Fwd (ms)", "Bwd (ms)"] + (["TP wait (ms)"] if tp else [])
                   + ["Params predicted (ms)", "Of them waited, predicted (ms)", "Comm time (ms)",
                      "Predicted time (ms)", "Time measured / predicted", "Status"], rows, markdown)
    n0, bus = int(model["world_size"]), scaling.bus_bandwidth(model)
    # Not the o any prediction takes where sizes were measured: named so, beside (e)'s at b*.
    points = (model.get("kinds") or {}).get("allreduce", [])
    whole = (f"; as one line, through the all-reduce's smallest and largest sizes ({scaling.megabytes(points[0][0])} "
             f"and {scaling.megabytes(points[-1][0])}, a summary, not what the predictions take)"
             if len(points) >= 2 else "; here one line for every size")
    beyond = [f"{impl(r)} {r.shard_optimizer}: {said}" for _, r in sharded.iterrows()
              if ok(r) and (said := scaling.beyond_measured(model, scaling.stage_comm_ms(r, model)["sizes"]))]
    return (f"{table}\n\nThe ring model: on k ranks an all-reduce whose buffer is S bytes takes o(k) + 2(k-1)/k S / B, "
            f"a reduce-scatter or all-gather o(k) + (k-1)/k S / B, a broadcast o(k) + S / B, with o(k) = "
            f"o (k-1)/(n0-1). Gradients (s bytes in c collectives): broadcast all-reduces s over the n "
            f"data-parallel ranks; zero1 reduce-scatters it bucket by bucket over the g ranks of a group, zero2 and "
            f"zero3 unit by unit (c units: the embedding, each layer, the head); groups (hybrid, g x n/g) then "
            f"all-reduce each rank's part, 1/g of what was reduce-scattered, over the n/g groups (Grad MiB counts "
            f"both). Overlapped (overlap, "
            f"bucketed): c o and the last collective's bytes, s / c (equal buckets, as (e)); zero2 and zero3, "
            f"whose backward writes into two gradient windows and so ends at most two units ahead of their "
            f"reductions: the last two units' (the first layer's and the embedding's), 2 o and their bytes; never "
            f"less than all of them less Bwd; naive and flat: all of them. Parameters (param_comm_bytes_per_step in "
            f"param_collectives_per_step): broadcast broadcasts them before forward reads any (all waited for); "
            f"zero1 and zero2 all-gather them within the group after the optimizer, forward waiting for every o "
            f"and the first (zero1: S_p / c_p; zero2: the embedding's), never less than all of them less Fwd; "
            f"zero3 all-gathers each unit before forward and again before backward reads it: every o and the "
            f"embedding's, never less than all of them less Fwd and Bwd (zero1 bf16's broadcasts of the "
            f"fp32 masters counted as all-gathers). Each collective of S bytes takes o and w of the line through "
            f"the two sizes of it measured around S{whole}, o = {model['o'] * 1e3:.2f} us "
            f"and B = w 2(n0-1)/n0 = {bus * 1e3 / 1e9:.3g} GB/s (n0 = {n0}), {model['source']}."
            + (f"\nThe model extrapolates the collectives' run for {'; '.join(beyond)}." if beyond else ""))


def all_tables(df: pd.DataFrame, torch_records: list, comm_model_for, markdown: bool) -> tuple:
    """(every setup's tables (a)-(i), the ids of the PyTorch records matched); comm_model_for(rows of a setup)
    gives the all-reduce model (o, w) for (e) and (i), or None."""
    sections, used = [], set()
    for _, setup in df.groupby("setup", sort=True):
        title = setup_title(setup.iloc[0])
        g = setup[setup.shard_optimizer == "none"]  # the reference DDP tables compare unsharded strategies
        if not g.empty:  # (a)-(e), then the sharded stages' (f)-(i)
            torch_part, matched = torch_table(g, torch_records, markdown, title) if torch_records else ("", [])
            used |= {id(t) for t in matched}
            sections += [strategies_table(g, markdown, title), buckets_table(g, markdown, title),
                         overhead_table(g, markdown, title), torch_part,
                         bucket_model_table(g, comm_model_for(g), markdown, title)]
        shard_part, shard_matched = sharding_table(setup, torch_records, markdown, title)
        sections += [shard_part, sharding_phases_table(setup, markdown, title), state_table(setup, markdown, title),
                     stage_model_table(setup, comm_model_for(setup), markdown, title)]
        used |= {id(t) for t in shard_matched}
    return [s for s in sections if s], used


def strategy_label(row) -> str:
    label = impl(row)
    if row["ddp"] == "bucketed":
        label = label.replace("bucketed", f"bucketed {row['bucket_mb']:g} MiB")
    return label if row["shard_optimizer"] == "none" else f"{label}, {row['shard_optimizer']}"


def plot_breakdown(df: pd.DataFrame, path: str) -> str:
    """The step of each strategy as a stacked bar: forward, backward, optimizer (compute) and the
    exposed communication; one panel per setup (model, batch, ranks). Mean ms, every rank pooled;
    a black tick at the tables' step (the slowest rank's, mean), which the phases need not add up to.
    Under tensor parallelism the wait for the group's collectives is hatched over the bar's start:
    it is inside forward and backward (which begin the bar), not a segment of its own."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    setups = [(key, g[g.status == "ok"]) for key, g in df.groupby("setup", sort=True)]
    setups = [(key, g) for key, g in setups if not g.empty]
    if not setups:
        return ""
    height = max(len(g) for _, g in setups)
    fig, axes = plt.subplots(len(setups), 1, figsize=(8, 0.45 * height * len(setups) + 1.4 * len(setups)),
                             squeeze=False)
    parts = (("forward_mean", "forward", "#9ecae1"), ("backward_mean", "backward", "#4292c6"),
             ("optimizer_mean", "optimizer", "#08519c"), ("comm_mean", "exposed communication", "#e6550d"))
    for ax, (_, g) in zip(axes[:, 0], setups):
        labels = [strategy_label(r) for _, r in g.iterrows()]
        left = np.zeros(len(g))
        for column, name, color in parts:
            values = g[column].fillna(0).to_numpy(dtype=float)
            ax.barh(labels, values, left=left, color=color, label=name)
            left += values
        if tp_shown(g):
            ax.barh(labels, g["tp_comm_mean"].fillna(0).to_numpy(dtype=float), fill=False, hatch="//",
                    edgecolor="black", linewidth=0, label="tp wait (in forward + backward)")
        # The tables' step is the slowest rank's: past the bar, what the phases leave out (waiting
        # for that rank, and what runs between them).
        ax.plot(g["slowest_step_mean"].to_numpy(dtype=float), labels, "|", color="black", ms=16, mew=2,
                label="step (the slowest rank's, as the tables)")
        ax.invert_yaxis()
        ax.set(xlabel="ms per step (mean)", title=setup_title(g.iloc[0]))
        ax.title.set_fontsize("small")
        ax.grid(True, axis="x", alpha=0.3)
    # One time axis for every panel, so that bars compare at a glance, unless one setup's steps are
    # ten times another's: that one's bars would be slivers.
    ends = [ax.get_xlim()[1] for ax in axes[:, 0]]
    if max(ends) <= 10 * min(ends):
        for ax in axes[:, 0]:
            ax.set_xlim(0, max(ends))
    legend_above(fig, axes, fontsize="small")  # inside an axis it would hide the longest bars
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def comm_models(all_runs: list) -> dict:
    """{(world_size, transport): allreduce_model} of the comm runs with an all-reduce at two sizes
    or more (the first such run of each; transport as analysis/scaling.py names it)."""
    models = {}
    for run in all_runs or []:
        key = (run.world_size, scaling.transport(run.directory))
        if run.mode == "comm" and key not in models:
            try:
                models[key] = allreduce_model(run.directory)
            except SchemaError:
                pass  # not an all-reduce sweep: no model from it
    return models


def report_section(runs: list, out_dir: str, all_runs=None) -> str:
    """report.py's ddp section: tables (a)-(i) per setup, o and w of (e) and (i) from a comm run of the same
    rank count among all_runs (else fitted), ddp_breakdown.png, and before them, with several rank
    counts the scaling study (analysis/scaling.py), with one the choice of layout (scaling.choices)."""
    df, _ = load([run.directory for run in runs], None)
    models = comm_models(all_runs)
    # Several rank counts make a scaling study: its tables first, each setup's after.
    sections = [scaling.report(df, models, out_dir)] if df.world_size.nunique() > 1 else []
    if not sections:  # one rank count: no scaling study, but the choice of layout among what ran
        order = scaling.study_order(scaling.ok_runs(df))
        picks = scaling.choices(order, scaling.unit(df))
        if picks:
            sections.append("### Which layout, where two or more ran at the same ranks and global batch\n\n"
                            + "\n".join(picks) + f"\n\n{scaling.ran_once_note(order)}")
    tables, _ = all_tables(df, [], lambda g: models.get((int(g.world_size.iloc[0]),
                                                          scaling.transport(g.run.iloc[0]))), True)
    sections += tables
    if plot_breakdown(df, os.path.join(out_dir, "ddp_breakdown.png")):
        sections.append("![DDP step: compute against exposed communication](ddp_breakdown.png)"
                        + (f"\n\nHatched: {TP_WAIT_NOTE[len('TP wait: '):]}." if tp_shown(df) else ""))
    return "\n\n".join(sections)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="DIR", help="llmhpc --mode ddp output directories")
    parser.add_argument("--torch", action="append", default=[], metavar="JSONL",
                        help="JSON lines of analysis/torch_ddp.py to put beside llmhpc (repeatable)")
    parser.add_argument("--comm", metavar="COMM_DIR",
                        help="an llmhpc --mode comm run with all-reduce at several sizes: o and w of the bucket model")
    parser.add_argument("--rank", type=int, default=None, help="one rank's samples (default: every rank pooled)")
    parser.add_argument("--markdown", action="store_true", help="markdown tables instead of aligned text")
    args = parser.parse_args(argv)
    try:  # everything read and built first, so an error leaves no half-printed report
        df, notes = load(run_directories(*args.runs, mode="ddp"), args.rank)
        torch_records = read_torch(args.torch)
        comm_model = allreduce_model(args.comm) if args.comm else None
        sections, used = all_tables(df, torch_records, lambda rows: comm_model, args.markdown)
    except SchemaError as e:
        print(f"ddp.py: error: {e}", file=sys.stderr)
        return 2
    if torch_records and len(used) < len(torch_records):
        notes.append(f"{len(torch_records) - len(used)} of {len(torch_records)} PyTorch record(s) match no llmhpc setup "
                     f"(model shape, context, global batch, ranks, precision)")
    print("\n".join(notes) + "\n\n" + "\n\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())

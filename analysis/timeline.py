#!/usr/bin/env python3
"""Where a data-parallel step's communication ran: the step timeline of modes ddp and train.

    python3 analysis/timeline.py results/ddp-1234                    # per configuration and rank: what hid it
    python3 analysis/timeline.py DIR --trace timeline.json           # every rank's steps for ui.perfetto.dev
    python3 analysis/timeline.py DIR --png timeline.png [--label L]  # one configuration's steps, rank by rank

On the nccl backend mode ddp records, on every rank, each configuration's last timed steps (4),
and mode train its data-parallel run's last 4 steps: the compute stream's phases (forward,
backward, the gradient wait, the optimizer, the parameter wait) and every data-parallel
collective's span on its communicator's stream, from when the stream reached it to its end
(under --tp the tensor-parallel group's collectives too), on the rank's GPU clock (the
timeline_* datasets, docs/hdf5-schema.md). That is what Nsight Systems draws for the two
streams, for the steps the record's times come from.

The table gives, for the data-parallel collectives, per step (the mean over the recorded steps
whose next step is recorded too, since a sharded step's parameter all-gathers run into the next
step's forward): the collectives,
their time (the union of their spans), and how much of it ran beside forward, backward and the
optimizer, during the compute stream's waits for them (exposed: comm_ms's part that the
collectives were running), and with the compute stream idle (between steps: the host's gap).
Under zero1-3 forward waits for each unit's all-gathered weights inside it, so part of what ran
beside forward is forward waiting.
Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table  # noqa: E402
from ddp import SETUP_ORDER, STRATEGIES  # noqa: E402
from llmhpc_h5 import SchemaError, open_run, sweep_key  # noqa: E402
from plotting import legend_above  # noqa: E402

# Compute phases a collective can run beside ("forward and backward": train's micro-batches, one phase).
HIDING = ("forward", "backward", "forward and backward", "optimizer")
WAITS = ("gradient wait", "parameter wait")        # the compute stream waiting for the collectives
TIMED_MODES = ("ddp", "train")                    # the modes that record a step timeline
DATA_PARALLEL = ("communication", "replicas")       # the data-parallel group's and hybrid sharding's
STREAMS = ("compute", *DATA_PARALLEL, "tensor parallel")  # one trace track each, in this order
COLUMNS = ("timeline_step", "timeline_stream", "timeline_name", "timeline_bytes", "timeline_start_ms",
           "timeline_end_ms")


def spans(rec) -> list:
    """A record's timeline as dicts (step, stream, name, bytes, start, end), ms; [] without one."""
    if "timeline_step" not in rec.arrays:
        return []
    a = {c: rec.arrays[c] for c in COLUMNS}
    return [dict(step=int(s), stream=str(st), name=str(n), bytes=int(b), start=float(t0), end=float(t1))
            for s, st, n, b, t0, t1 in zip(*(a[c] for c in COLUMNS))]


def union(intervals: list) -> list:
    """Sorted disjoint intervals covering `intervals` [(start, end)]."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [tuple(i) for i in out]


def overlap(a: list, b: list) -> float:
    """The length of the intersection of two lists of disjoint intervals."""
    total = 0.0
    for start, end in a:
        for s, e in b:
            total += max(0.0, min(end, e) - max(start, s))
    return total


def overlap_summary(rows: list) -> dict | None:
    """Per step, over the steps whose next step is recorded too (every step where only one is):
    steps, step_ms (from a step's start to the next's), collectives, comm_ms (the union of the
    data-parallel collectives' spans) and that time split into beside_<phase> for each of HIDING, waiting (the
    compute stream's waits), idle (no compute phase: between steps), and beside_pct (beside
    compute, of comm_ms); None
    without collectives."""
    steps = sorted({r["step"] for r in rows})
    counted = steps[:-1] if len(steps) > 1 else steps
    comm = [r for r in rows if r["stream"] in DATA_PARALLEL and r["step"] in counted]
    if not comm:
        return None
    compute = [r for r in rows if r["stream"] == "compute"]
    busy = union([(r["start"], r["end"]) for r in comm])
    total = sum(e - s for s, e in busy)
    out = dict(steps=len(counted), collectives=len(comm) / len(counted), comm_ms=total / len(counted))
    for phase in HIDING:
        out[f"beside_{phase}"] = overlap(busy, union([(r["start"], r["end"]) for r in compute if r["name"] == phase]))
    out["waiting"] = overlap(busy, union([(r["start"], r["end"]) for r in compute if r["name"] in WAITS]))
    out["idle"] = total - sum(out[f"beside_{p}"] for p in HIDING) - out["waiting"]
    for key in (*(f"beside_{p}" for p in HIDING), "waiting", "idle"):
        out[key] /= len(counted)
    out["beside_pct"] = 100 * sum(out[f"beside_{p}"] for p in HIDING) / out["comm_ms"] if out["comm_ms"] > 0 else 0.0
    starts = {s: min(r["start"] for r in compute if r["step"] == s) for s in {r["step"] for r in compute}}
    periods = [starts[s + 1] - starts[s] for s in counted if s in starts and s + 1 in starts]
    out["step_ms"] = (float(np.mean(periods)) if periods else
                      max(r["end"] for r in compute) - min(r["start"] for r in compute) if compute else math.nan)
    return out


def timeline_records(run, label: str | None = None) -> list:
    """[(name, [record of each rank])] of the ddp or train records with a timeline, in sweep order."""
    groups = run.records_by_name(run.mode, rank=None)
    out = [(name, sorted(recs, key=lambda r: r.rank)) for name, recs in groups.items()
           if any("timeline_step" in r.arrays for r in recs) and (label is None or name == label)]
    def order(item):
        attrs = item[1][0].attrs
        strategy = STRATEGIES.index(attrs.get("ddp")) if attrs.get("ddp") in STRATEGIES else len(STRATEGIES)
        return sweep_key(attrs, SETUP_ORDER), strategy, sweep_key(attrs, ("bucket_mb", "shard_optimizer")), item[0]
    return sorted(out, key=order)


def overlap_table(run, label: str | None = None) -> str:
    """The per-rank table of what hid each configuration's collectives; '' without timelines."""
    timelines = [(name, rec.rank, spans(rec)) for name, recs in timeline_records(run, label) for rec in recs]
    summaries = [(name, rank, o) for name, rank, rows in timelines if (o := overlap_summary(rows)) is not None]
    if not summaries:
        return ""
    # The micro-batches' phase only where a record has it (train --grad-accum).
    merged = any(r["name"] == "forward and backward" for _, _, rows in timelines for r in rows)
    phases = [p for p in HIDING if p != "forward and backward" or merged]
    short = {"forward": "fwd", "backward": "bwd", "forward and backward": "fwd+bwd", "optimizer": "optimizer"}
    rows = [[name, str(rank), str(o["steps"]), fmt(o["step_ms"]), fmt(o["collectives"], 0), fmt(o["comm_ms"]),
             *(fmt(o[f"beside_{p}"]) for p in phases), fmt(o["waiting"]), fmt(o["idle"]), fmt(o["beside_pct"], 1)]
            for name, rank, o in summaries]
    header = ["Configuration", "Rank", "Steps", "Step (ms)", "Collectives", "Comm (ms)",
              *(f"Beside {short[p]} (ms)" for p in phases), "Exposed (ms)", "Between steps (ms)", "Beside compute %"]
    return ("### Where the collectives ran (per step: the data-parallel collectives' device time, split by what the "
            "compute stream did meanwhile)\n\n" + markdown_table(header, rows) +
            "\n\nExposed: while the compute stream waited for them (the gradient and parameter waits). Under zero1-3 "
            "forward itself waits for each unit's all-gathered weights, so part of \"beside fwd\" is forward waiting: "
            "compare its forward time with the unsharded configuration's.")


def chrome_trace(run, label: str | None = None) -> dict:
    """Every rank's timeline of each configuration as a Chrome trace: a process per configuration
    and rank, a thread per stream, times in microseconds from the first recorded step's start."""
    events = []
    for index, (name, recs) in enumerate(timeline_records(run, label)):
        for rec in recs:
            pid = index * 100000 + rec.rank + 1
            events.append(dict(ph="M", pid=pid, name="process_name", args=dict(name=f"{name} (rank {rec.rank})")))
            events.append(dict(ph="M", pid=pid, name="process_sort_index", args=dict(sort_index=pid)))
            for tid, stream in enumerate(STREAMS, start=1):
                events.append(dict(ph="M", pid=pid, tid=tid, name="thread_name", args=dict(name=stream)))
            for r in spans(rec):
                args = dict(step=r["step"]) | (dict(bytes=r["bytes"]) if r["bytes"] else {})
                events.append(dict(ph="X", pid=pid, tid=STREAMS.index(r["stream"]) + 1, name=r["name"],
                                   cat=r["stream"], ts=r["start"] * 1e3, dur=(r["end"] - r["start"]) * 1e3,
                                   args=args))
    return dict(traceEvents=events, displayTimeUnit="ms")


def plot(run, label: str | None, path: str) -> str:
    """One configuration's recorded steps, two lanes a rank (compute above its collectives); the
    configuration drawn."""
    import matplotlib.pyplot as plt  # plotting set the Agg backend
    records = timeline_records(run, label)
    if not records:
        raise SchemaError(f"no {run.mode} record with a timeline" + (f" named {label}" if label else ""))
    name, recs = records[0]
    colors = {"forward": "tab:blue", "backward": "tab:green", "forward and backward": "tab:cyan", "optimizer": "tab:purple", "gradient wait": "tab:gray",
              "parameter wait": "silver", "allreduce": "tab:orange", "reducescatter": "tab:red",
              "allgather": "tab:brown", "broadcast": "tab:pink", "alltoall": "gold", "stream work": "tab:olive"}
    lanes = [("compute", ("compute",)), ("collectives", DATA_PARALLEL)]
    if any(r["stream"] == "tensor parallel" for rec in recs for r in spans(rec)):
        lanes.append(("tensor parallel", ("tensor parallel",)))
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.3 * len(lanes) * len(recs)))
    ticks, labels, seen = [], [], set()
    for i, rec in enumerate(recs):
        for lane, (title, streams) in enumerate(lanes):
            y = ((len(recs) - 1 - i) * (len(lanes) + 0.6) + len(lanes) - 1 - lane) * 1.2
            ticks.append(y + 0.5)
            labels.append(f"rank {rec.rank} {title}")
            mine = [r for r in spans(rec) if r["stream"] in streams]
            edge = 0.2 if len(mine) < 100 else 0  # hundreds of short spans: outlines would hide their colours
            for r in mine:
                kind = r["name"] if lane == 0 else re.sub(r" x\d+$", "", r["name"]).split("+")[0]
                ax.broken_barh([(r["start"], r["end"] - r["start"])], (y, 1), color=colors.get(kind, "tab:cyan"),
                               label=None if kind in seen else kind, edgecolor="black", linewidth=edge)
                seen.add(kind)
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("ms from the first recorded step's start (each rank's GPU clock)")
    ax.set_title(name, fontsize="medium")
    legend_above(fig, [ax], fontsize="small")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return name


def report_section(runs: list, out_dir: str) -> str:
    """analysis/report.py's "Step timeline" section: each ddp or train run's table, and a plot of its first
    configuration with a timeline; '' where no run has one."""
    parts = []
    for index, run in enumerate(runs):
        if run.mode not in TIMED_MODES:
            continue
        table = overlap_table(run)
        if not table:
            continue
        # The run's folder name, and its place among the runs: two runs' folders may share a name.
        png = os.path.join(out_dir, f"timeline_{index}_{os.path.basename(os.path.normpath(run.directory))}.png")
        name = plot(run, None, png)
        parts.append(f"`{run.directory}`:\n\n{table}\n\n![{name}]({os.path.basename(png)})\n\n"
                     f"{name}'s steps on each rank (`analysis/timeline.py {run.directory} --png FILE --label LABEL` "
                     "for another configuration, `--trace FILE.json` for ui.perfetto.dev).")
    return "\n\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", metavar="DIR", help="run directory of mode ddp or train (llmhpc --out)")
    parser.add_argument("--label", help="one configuration (a /ddp/<label> name): the table's, the trace's or the plot's")
    parser.add_argument("--trace", metavar="FILE.json", help="write every rank's timelines as a Chrome trace")
    parser.add_argument("--png", metavar="FILE.png", help="plot one configuration (--label, else the first)")
    args = parser.parse_args(argv)
    try:
        run = open_run(args.dir)
        if run.mode not in TIMED_MODES:
            raise SchemaError(f"{args.dir} is a run of mode {run.mode}; the step timeline is mode ddp's and train's")
        if not timeline_records(run, args.label):
            raise SchemaError(f"no {run.mode} record with a timeline" + (f" named {args.label}" if args.label else "")
                              + ": it is recorded on the nccl backend (--backend nccl on GPUs)"
                              + (", with data parallelism (--ddp)" if run.mode == "train" else ""))
        print(overlap_table(run, args.label) or "no data-parallel collectives in the recorded steps "
              "(the plot and the trace show the tensor-parallel ones)")
        if args.trace:
            with open(args.trace + ".tmp", "w") as f:
                json.dump(chrome_trace(run, args.label), f)
            os.replace(args.trace + ".tmp", args.trace)
            print(f"\ntrace: {args.trace} (ui.perfetto.dev or chrome://tracing)")
        if args.png:
            name = plot(run, args.label, args.png)
            print(f"plot of {name}: {args.png}")
    except (SchemaError, OSError) as e:
        print(f"timeline.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

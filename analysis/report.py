#!/usr/bin/env python3
"""Prints the seeds' benchmark table, in markdown, from an llmhpc run directory.

    python3 analysis/report.py results/bench-20261122-103000            # rank 0's numbers
    python3 analysis/report.py DIR --all-ranks                           # every rank's samples pooled
    python3 analysis/report.py DIR1 DIR2 ...                             # rows of several runs in one table

One row per bench configuration: Model size, d_model, d_ff, num_layers, num_heads, then
Context / Batch / Precision / Attention / Phase / Warm-up columns when they vary between rows,
Fwd Mean, Fwd Std, Bwd Mean, Bwd Std (and Opt Mean, Opt Std when the optimizer step was
timed), Total; all in milliseconds. Std is the sample standard deviation (n-1) of the raw
per-step times. Total is the mean time of a whole timed step (everything the --phase ran:
forward, + backward, + optimizer). Configurations that ran out of memory or failed are rows
with their status and '-' for the times. A train run gets its per-step loss table instead.

Reads the files only through analysis/llmhpc_h5.py (docs/hdf5-schema.md).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import SchemaError, open_run  # noqa: E402

# Columns that appear only when their value differs between rows: (summary column, header).
VARYING_COLUMNS = (("context_length", "Context"), ("batch_size", "Batch"), ("precision", "Precision"),
                   ("attention", "Attention"), ("phase", "Phase"), ("warmup", "Warm-up"), ("steps", "Steps"))


def fmt(value, decimals: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


def markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def bench_table(summary, decimals: int) -> str:
    """summary: rows of Run.bench_summary() (possibly of several runs concatenated)."""
    varying = [(key, title) for key, title in VARYING_COLUMNS if summary[key].nunique(dropna=False) > 1]
    show_status = (summary["status"] != "ok").any()
    # Bwd columns are always there, as in the seeds' table ('-' where only forward was timed);
    # Opt columns only when some configuration timed the optimizer step.
    show_opt = summary["optimizer_n"].fillna(0).gt(0).any()
    phases = ["forward", "backward"] + (["optimizer"] if show_opt else [])

    header = ["Model size", "d_model", "d_ff", "num_layers", "num_heads"] + [title for _, title in varying]
    if show_status:
        header.append("Status")
    short = {"forward": "Fwd", "backward": "Bwd", "optimizer": "Opt"}
    for phase in phases:
        header += [f"{short[phase]} Mean (ms)", f"{short[phase]} Std (ms)"]
    header.append("Total (ms)")

    rows = []
    for _, r in summary.iterrows():
        row = [r["model"], r["d_model"], r["d_ff"], r["num_layers"], r["num_heads"]] + [r[key] for key, _ in varying]
        if show_status:
            row.append(r["status"])
        for phase in phases:
            row += [fmt(r[f"{phase}_mean"], decimals), fmt(r[f"{phase}_std"], decimals)]
        row.append(fmt(r["step_mean"], decimals))
        rows.append(row)
    return markdown_table(header, rows)


def train_table(run, rank: int, decimals: int) -> str:
    steps = run.train_steps(rank)
    header = ["Step", "Loss", "Step (ms)"]
    rows = [[int(s.step), f"{s.loss:.6f}", fmt(s.step_ms, decimals)] for s in steps.itertuples()]
    return markdown_table(header, rows)


def describe(run, rank_label: str) -> str:
    a = run.attrs
    state = "" if run.complete else " (INCOMPLETE: a rank's file says the run did not finish)"
    return (f"llmhpc {a['mode']} on {a['device_name']} ({a['hostname']}), {run.world_size} rank(s), "
            f"{rank_label}; git {a['git_sha']}; started {a['start_time']}{state}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (llmhpc --out)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, help="report this rank's samples (default 0)")
    which.add_argument("--all-ranks", action="store_true", help="pool the samples of every rank")
    parser.add_argument("--decimals", type=int, default=2, help="decimals of the times (default 2)")
    parser.add_argument("--table-only", action="store_true", help="print the table without the line about the run")
    args = parser.parse_args(argv)

    try:
        runs = [open_run(d) for d in args.dirs]
        rank = None if args.all_ranks else args.rank
        rank_label = "samples of all ranks pooled" if args.all_ranks else f"rank {args.rank}"
        # Build everything first, so an error leaves no half-printed report.
        out, summaries = [], []
        for run in runs:
            if not args.table_only:
                out.append(describe(run, rank_label) + "\n")
            if run.records("bench", rank if rank is not None else run.ranks[0]):
                summaries.append(run.bench_summary(rank))
            elif run.records("train", run.ranks[0]):
                out.append(train_table(run, args.rank, args.decimals) + "\n")
            else:
                raise SchemaError(f"{run.directory}: no bench or train records (mode '{run.mode}')")
        if summaries:
            out.append(bench_table(pd.concat(summaries, ignore_index=True), args.decimals))
        print("\n".join(out))
    except SchemaError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Plots bench times against model size and against context length, as a PNG.

    python3 analysis/plot_bench.py DIR [DIR ...] -o bench.png [--rank R | --all-ranks]

Left panel: mean time per phase (forward, backward, optimizer, whole step) against the
number of parameters, one line per context length (log-log). Right panel: whole-step time
against context length, one line per model. Error bars are the sample standard deviation
of the raw per-step times. Configurations that did not run (oom, error) are left out and
listed in the title. Reads the files only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import BENCH_PHASES, SchemaError, open_run  # noqa: E402

PHASE_STYLE = {"forward": "o--", "backward": "s:", "optimizer": "^-.", "step": "D-"}
# Besides the x axis, what tells two series apart when it varies between rows.
SERIES_KEYS = ("phase", "batch_size", "precision", "attention")


def model_label(row) -> str:
    shape = f"d{row['d_model']}/L{row['num_layers']}"
    return shape if row["model"] in ("custom", "checkpoint") else f"{row['model']} ({shape})"


def human_count(n) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def series(frame: pd.DataFrame, first_key: str, first_title):
    """Groups rows into lines: by `first_key`, plus every SERIES_KEYS column that varies."""
    keys = [first_key] + [k for k in SERIES_KEYS if frame[k].nunique() > 1]
    for values, rows in frame.groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join([first_title(values[0])] + [f"{k}={v}" for k, v in zip(keys[1:], values[1:])])
        yield label, rows


def plot(summary: pd.DataFrame, title: str, path: str) -> None:
    ok = summary[summary["status"] == "ok"].assign(label=lambda f: f.apply(model_label, axis=1))
    failed = summary[summary["status"] != "ok"]
    fig, (by_size, by_context) = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    # Left: every timed phase against parameters; colour = series, line style = phase.
    for i, (label, rows) in enumerate(series(ok, "context_length", lambda t: f"T={t}")):
        rows = rows.sort_values("num_params")
        for phase in BENCH_PHASES:
            if rows[f"{phase}_n"].sum() == 0 or (phase == "step" and rows["phase"].eq("forward").all()):
                continue  # not timed; a forward-only step is the forward line again
            by_size.errorbar(rows["num_params"], rows[f"{phase}_mean"], yerr=rows[f"{phase}_std"],
                             fmt=PHASE_STYLE[phase], color=colors[i % len(colors)], capsize=3,
                             label=f"{phase}, {label}")
    by_size.set(xscale="log", yscale="log", xlabel="parameters", ylabel="time per step (ms)",
                title="time vs model size (line style: phase)")

    # Right: the whole step against context length, one line per model.
    for i, (label, rows) in enumerate(series(ok, "label", str)):
        rows = rows.sort_values("context_length")
        by_context.errorbar(rows["context_length"], rows["step_mean"], yerr=rows["step_std"], fmt="o-",
                            color=colors[i % len(colors)], capsize=3, label=label)
    by_context.set(xscale="log", yscale="log", xlabel="context length", ylabel="whole step (ms)",
                   title="time vs context length")

    # Ticks at the measured values: a sweep rarely spans the decades a log axis labels.
    sizes, contexts = sorted(ok["num_params"].unique()), sorted(ok["context_length"].unique())
    by_size.set_xticks(sizes, [human_count(n) for n in sizes])
    by_context.set_xticks(contexts, [str(t) for t in contexts])
    for ax in (by_size, by_context):
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    if len(failed):
        title += "\nnot run: " + ", ".join(f"{model_label(r)} T={r['context_length']} ({r['status']})"
                                           for _, r in failed.iterrows())
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR")
    parser.add_argument("-o", "--output", default="bench.png", help="PNG to write (default bench.png)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0)
    which.add_argument("--all-ranks", action="store_true")
    args = parser.parse_args(argv)
    try:
        runs = [open_run(d) for d in args.dirs]
        rank = None if args.all_ranks else args.rank
        summary = pd.concat([run.bench_summary(rank) for run in runs], ignore_index=True)
        if summary.empty:
            raise SchemaError(f"no bench records in {', '.join(args.dirs)}")
    except SchemaError as e:
        print(f"plot_bench.py: error: {e}", file=sys.stderr)
        return 2
    first = runs[0].attrs
    who = "all ranks pooled" if args.all_ranks else f"rank {args.rank}"
    plot(summary, f"llmhpc bench on {first['device_name']}, {who}, batch "
                  f"{', '.join(map(str, sorted(summary['batch_size'].unique())))}", args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

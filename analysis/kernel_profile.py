#!/usr/bin/env python3
"""The reference nsys study's tables, in markdown, and a PNG, from an llmhpc --mode profile run.

    python3 analysis/kernel_profile.py results/profile-20261123-101500            # rank 0, top 10 per phase
    python3 analysis/kernel_profile.py DIR --rank 1 --top 20 --out plots/

Writes profile_rank<R>.md (the tables, also printed) and profile_rank<R>.png into DIR, or into
--out; never into the working directory. report_section(runs, out_dir) gives the same tables
as one markdown section, for analysis/report.py.

First an overview, one row per configuration: the step untraced and traced (the overhead), the
drift (the untraced steps run after the traced ones against those run before: how far the step
time moved by itself; an overhead within it is not resolved by the run), the activities per
step, the share of matrix products in the step's kernel time (as (d)), dropped records, and how busy the
device was (kernel time over the traced step: below about 90% the host's launches
set the pace, and the overhead shows).
Then for every configuration that ran (/profile/<label> with its activities in
/profile_kernels/<label>, docs/hdf5-schema.md), from the raw activities of the traced steps:
  (a) per phase, the event timing of the traced steps (the bench measurement), the profiler's
      span of the phase's ranges on the device and its activities' own time, ms per step, and
      the steps' time untraced (the profiler's overhead);
  (b, c) per phase, a kernel summary like Nsight Systems' (Time %, Total Time, Instances, Avg,
      Med, Min, Max, StdDev, Category, Name), the top --top names by total time;
  (d) per phase, the time by category (ms per step) and the share of matrix products (category
      matmul: attention's own products count in it only as cuBLAS products, naive attention on a
      GPU; flash's kernels and the CPU's attention op are category attention);
  (e) attention's parts per phase: naive attention's scores / softmax / value_matmul phases,
      flash's kernels, the CPU's attention ops; for naive, the FLOPs of each part beside its time
      (matrix products exactly, 2 per multiply-add; softmax estimated at 5 FLOPs per score
      forward, 4 backward). Where attention is not split into those parts (the CPU's one op,
      flash's fused kernels), a line under the table says so.
Phases: an activity counts in the phase under the outermost one ("forward", "backward",
"optimizer") and in the outermost ("step"); outside every phase, in "(no phase)". The PNG has
one panel per phase and one bar per configuration, stacked by category (% of the phase's kernel
time, its ms per step above the bar).
Activity categories are the profiler's (kernels/profiler.cpp). Reads the files only through
analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table  # noqa: E402
from llmhpc_h5 import PROFILE_CATEGORIES, SchemaError, model_name, open_run  # noqa: E402
from outputs import unwritable  # noqa: E402

# The phases kernels/cuda/cuda_ops.cu opens inside naive attention.
NAIVE_PARTS = ("scores", "softmax", "value_matmul")
MATMUL_SHARE_NOTE = ("Matmul share: category matmul's time over all kernel time. Attention's own products (scores, "
                     "value) count in it only where they run as cuBLAS products (naive attention on a GPU); flash's "
                     "kernels and the CPU's attention op are category attention, so there the share leaves them out.")


def groups_of(path: str) -> list:
    """The phases an activity of phase `path` counts in: the one under the outermost, then the outermost."""
    if not path:
        return ["(no phase)"]
    parts = path.split("/")
    return ([parts[1]] if len(parts) > 1 else []) + [parts[0]]


def attention_part(path: str, name: str, category: str) -> str:
    """kernels/profiler.cpp's attention_part: the naive phase, else the kernel or op, else ''."""
    leaf = path.split("/")[-1]
    if leaf in NAIVE_PARTS:
        return leaf
    if leaf.startswith("flash_attention") or leaf == "attention" or category == "attention":
        return name
    return ""


def median_steps(rec) -> tuple:
    """The median untraced and traced step, ms: the overhead's terms, as the mode's report has them."""
    return float(np.median(rec.arrays["step_ms"])), float(np.median(rec.arrays["traced_step_ms"]))


def drift_pct(rec) -> float:
    """How far the untraced step moved by itself, %: the median of the untraced steps run after the
    traced ones (the last floor(n/2)) against those run before them (the first ceil(n/2))."""
    u = np.asarray(rec.arrays["step_ms"], dtype=float)
    k = (len(u) + 1) // 2
    return 100.0 * (float(np.median(u[k:])) / float(np.median(u[:k])) - 1.0) if len(u) >= 2 else math.nan


def signed_pct(x: float) -> str:
    """+1.2%, or - where there is no number (a drift needs untraced steps on both sides)."""
    return "-" if math.isnan(x) else f"{x:+.1f}%"


def duration(ns: float) -> str:
    """Nsight Systems' way: 66.765 ms, 307.671 μs, 589 ns."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3f} μs"
    return f"{ns:.0f} ns"


def with_groups(acts: pd.DataFrame) -> pd.DataFrame:
    """`acts` with one row per (activity, phase it counts in): column `group`."""
    groups = acts["phase"].map(groups_of)
    return acts.assign(group=groups).explode("group", ignore_index=True)


def group_order(ranges: pd.DataFrame, acts: pd.DataFrame) -> list:
    """Phases in the order they first opened, the outermost last."""
    inner, outer = [], []
    for path in list(ranges["phase"]) + list(acts["phase"]):
        found = groups_of(path)
        for g, into in zip(found, ([inner, outer] if len(found) == 2 else [outer])):
            if g not in into:
                into.append(g)
    return inner + outer


def kernel_table(acts: pd.DataFrame, group: str, top: int) -> str:
    rows = acts[acts["group"] == group]
    stats = rows.groupby("name").agg(total=("duration_ns", "sum"), n=("duration_ns", "size"),
                                     avg=("duration_ns", "mean"), med=("duration_ns", "median"),
                                     low=("duration_ns", "min"), high=("duration_ns", "max"),
                                     std=("duration_ns", lambda d: d.std(ddof=1) if len(d) > 1 else 0.0),
                                     category=("category", "first"))
    stats = stats.reset_index().sort_values(["total", "name"], ascending=[False, True]).head(top)
    total = rows["duration_ns"].sum()
    body = [[f"{100.0 * r.total / total:.1f}%", duration(r.total), r.n, duration(r.avg), duration(r.med),
             duration(r.low), duration(r.high), duration(r.std), r.category, f"`{r.name}`"]
            for r in stats.itertuples()]
    return markdown_table(["Time", "Total Time", "Instances", "Avg", "Med", "Min", "Max", "StdDev", "Category", "Name"],
                          body)


def category_frame(acts: pd.DataFrame, groups: list, steps: int) -> pd.DataFrame:
    """ms per step by phase (rows, in `groups` order) and category (columns)."""
    table = acts.pivot_table(index="group", columns="category", values="duration_ns", aggfunc="sum", fill_value=0)
    table = table.reindex(index=groups, columns=list(PROFILE_CATEGORIES), fill_value=0) / 1e6 / steps
    return table


def naive_flops(attrs: dict, group: str, part: str) -> float:
    """FLOPs per step of naive attention's `part` in phase `group` (all layers) on this rank, which
    under tensor parallelism computes num_heads / tp heads; NaN where not defined."""
    b, h, t = attrs["batch_size"], attrs["num_heads"], attrs["context_length"]
    d, layers = attrs["d_model"] // h, attrs["num_layers"]
    h //= int(attrs.get("tp", 1))
    per_score = {("forward", "scores"): 2 * d, ("forward", "value_matmul"): 2 * d, ("forward", "softmax"): 5,
                 ("backward", "scores"): 4 * d, ("backward", "value_matmul"): 4 * d, ("backward", "softmax"): 4}
    if (group, part) not in per_score:
        return math.nan
    return float(per_score[(group, part)]) * b * h * t * t * layers


def configuration_report(run, rec, rank: int, top: int) -> tuple:
    """The markdown of one configuration, and its category frame for the plot."""
    name, attrs, steps = rec.name, rec.attrs, int(rec.attrs["steps"])
    acts = with_groups(run.profile_activities(name, rank))
    ranges = run.profile_ranges(name, rank)
    groups = group_order(ranges, acts)
    out = [f"### {name} (rank {rank}): {attrs['profiler']}" + (f" ({attrs['profiler_note']})"
                                                                 if attrs.get("profiler_note") else ""),
           f"{steps} traced steps, {attrs['activities']} activities, {attrs['dropped_records']} dropped, "
           f"{attrs['unattributed_activities']} outside every phase.", ""]

    # (a) the profiler against the event timing of the same steps, and the overhead.
    rows = []
    for g in groups:
        paths = [p for p in ranges["phase"].unique() if p.count("/") <= 1 and p.split("/")[-1] == g]
        span = ranges.loc[ranges["phase"].isin(paths), "device_ms"].sum() / steps
        kernel = acts.loc[acts["group"] == g, "duration_ns"].sum() / 1e6 / steps
        events = float(np.mean(rec.arrays[f"traced_{g}_ms"])) if f"traced_{g}_ms" in rec.arrays else math.nan
        rows.append([g, fmt(events, 3), fmt(span, 3), fmt(kernel, 3) if len(acts) else "-", fmt(span / events, 3)])
    out += ["(a) Phases, ms per step: events (as bench times them) against the profiler's span and kernel time", "",
            markdown_table(["Phase", "Events", "Profiler span", "Kernel time", "Span / events"], rows), ""]
    untraced, traced = median_steps(rec)
    out += [f"Overhead: median {untraced:.3f} ms per step untraced, {traced:.3f} ms traced "
            f"({100.0 * (traced / untraced - 1.0):+.1f}%); drift of the untraced steps {signed_pct(drift_pct(rec))}.", ""]
    if acts.empty:
        out += ["No activities: the profiler timed phases only.", ""]
        return "\n".join(out), None

    # (b, c) kernel summaries.
    for g in groups:
        if (acts["group"] == g).any():
            out += [f"(b, c) {g}: the top {top} names by total time (over the {steps} traced steps)", "",
                    kernel_table(acts, g, top), ""]

    # (d) categories and the share of matrix products.
    cats = category_frame(acts, groups, steps)
    rows = [[g] + [fmt(cats.loc[g].sum(), 3)] + [fmt(cats.loc[g, c], 3) for c in PROFILE_CATEGORIES] +
            [fmt(100.0 * cats.loc[g, "matmul"] / cats.loc[g].sum(), 1) + "%" if cats.loc[g].sum() > 0 else "-"]
            for g in groups]
    out += ["(d) Time by category, ms per step, and the share of matrix products", "",
            markdown_table(["Phase", "Total"] + list(PROFILE_CATEGORIES) + ["Matmul share"], rows), ""]

    # (e) attention's parts.
    parts = acts.assign(part=[attention_part(p, n, c) for p, n, c in
                              zip(acts["phase"], acts["name"], acts["category"])])
    parts = parts[parts["part"] != ""]
    rows = []
    parts = parts.assign(order=parts["group"].map(groups.index)).sort_values(["order", "part"], kind="stable")
    for (g, part), chunk in parts.groupby(["group", "part"], sort=False):
        ms = chunk["duration_ns"].sum() / 1e6 / steps
        whole = parts.loc[parts["group"] == g, "duration_ns"].sum() / 1e6 / steps
        flops = naive_flops(attrs, g, part) if attrs.get("attention") == "naive" else math.nan
        rows.append([g, f"`{part}`", fmt(len(chunk) / steps, 1), fmt(ms, 3), fmt(100.0 * ms / whole, 1) + "%",
                     fmt(flops / 1e9, 3), fmt(flops / (ms * 1e-3) / 1e12, 2) if ms > 0 else "-"])
    out += ["(e) Attention's parts, per step (FLOPs for naive attention; softmax's an estimate)", "",
            markdown_table(["Phase", "Part", "Activities", "ms", "Share", "GFLOP", "TFLOP/s"], rows), "",
            unsplit_note(parts, attrs), ""]
    return "\n".join(out), cats


def unsplit_note(parts: pd.DataFrame, attrs: dict) -> str:
    """Why (e) has no scores / softmax / value rows (and no FLOPs) where it has none; '' where
    naive attention's parts were timed apart."""
    if parts.empty:
        return "No attention activities in the traced steps."
    if parts["part"].isin(NAIVE_PARTS).any():
        return ""
    if str(attrs.get("attention_kernel", "")).startswith("cpu"):
        return ("Not split into scores, softmax and value product: on the CPU attention is one op per layer and "
                "direction (attention_forward, attention_backward), timed whole, so the matrix products and the "
                "softmax have no times of their own, and no FLOP rate.")
    if attrs.get("attention") == "flash":
        return ("Not split into scores, softmax and value product: flash attention fuses them into its kernels, "
                "timed whole; --attention naive times them apart.")
    return ""


def plot(frames: dict, path: str) -> None:
    """One panel per phase, one stacked bar per configuration: the share of each category in the
    phase's kernel time, its ms per step written above the bar (sizes differ a hundredfold)."""
    phases = list(dict.fromkeys(g for cats in frames.values() for g in cats.index))
    names = list(frames)
    width = max(9.0, 0.28 * len(names) + 3.5)
    fig, axes = plt.subplots(len(phases), 1, figsize=(width, 2.6 * len(phases) + 1.5), squeeze=False)
    for ax, phase in zip(axes[:, 0], phases):
        ms = pd.DataFrame([frames[n].loc[phase] if phase in frames[n].index else pd.Series(dtype=float)
                           for n in names]).reindex(columns=list(PROFILE_CATEGORIES)).fillna(0.0)
        totals = ms.sum(axis=1).to_numpy()
        share = 100.0 * ms.div(np.where(totals > 0, totals, 1.0), axis=0)
        bottoms = np.zeros(len(names))
        for category in PROFILE_CATEGORIES:
            ax.bar(range(len(names)), share[category], bottom=bottoms, label=category)
            bottoms += share[category].to_numpy()
        for x, total in enumerate(totals):
            ax.text(x, 101, f"{total:.3g} ms", ha="center", va="bottom", fontsize=7, rotation=90 if len(names) > 8 else 0)
        ax.set_ylim(0, 125 if len(names) > 8 else 112)  # room for the labels above the bars
        ax.set_ylabel(f"{phase}: % of kernel time")
        ax.set_xticks(range(len(names)), names if phase == phases[-1] else [""] * len(names), fontsize=7,
                      rotation=90 if len(names) > 3 else 0)
    fig.suptitle("Kernel time per phase by category (above each bar: ms per step)", fontsize=10)
    # Beside the panels, top down as the bars stack bottom up: inside, it hid the bars' tops.
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(0.86, 0.95))
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend's longest name (communication) whole
    plt.close(fig)


def overview(run, records: list, rank: int) -> str:
    """One row per configuration of `run` on `rank`: the overhead, activities, the step's matmul share."""
    rows = []
    for rec in records:
        a = rec.attrs
        row = [model_name(a), a.get("context_length", "-"), a.get("batch_size", "-"),
               a.get("precision", "-"), a.get("attention", "-"), a.get("phase", "-")]
        if not rec.ok:
            rows.append(row + [rec.status] + ["-"] * 8)
            continue
        untraced, traced = median_steps(rec)
        acts = run.profile_activities(rec.name, rank)
        total = acts["duration_ns"].sum()
        share = 100.0 * acts.loc[acts["category"] == "matmul", "duration_ns"].sum() / total if total > 0 else math.nan
        steps = int(a["steps"])
        busy = 100.0 * total / 1e6 / steps / traced if total > 0 and traced > 0 else math.nan
        rows.append(row + ["ok", fmt(untraced, 3), fmt(traced, 3), f"{100.0 * (traced / untraced - 1.0):+.1f}%",
                           signed_pct(drift_pct(rec)), fmt(len(acts) / steps, 1), fmt(share, 1) + "%" if total > 0 else "-",
                           a.get("dropped_records", "-"), fmt(busy, 1) + "%" if total > 0 else "-"])
    return markdown_table(["Model", "Context", "Batch", "Precision", "Attention", "Phase", "Status",
                           "Untraced ms (median)", "Traced ms (median)", "Overhead", "Drift", "Activities/step",
                           "Matmul share", "Dropped", "Device busy"], rows)


def run_report(run, rank: int, top: int, png: str) -> str:
    """The markdown of one run on `rank` (overview, then each configuration), and its plot into `png`;
    '' when the run has no /profile records."""
    records = run.records("profile", rank)
    if not records:
        return ""
    parts, frames = [f"Profile of {run.directory}, rank {rank} ({run.attrs.get('device_name', '?')})", "",
                     overview(run, records, rank), "", MATMUL_SHARE_NOTE, ""], {}
    for rec in records:
        if not rec.ok:
            parts += [f"### {rec.name} (rank {rank}): {rec.status}", ""]
            continue
        text, cats = configuration_report(run, rec, rank, top)
        parts.append(text)
        if cats is not None:
            frames[rec.name] = cats
    if frames:
        plot(frames, png)
        parts += [f"![time per phase by kernel category]({os.path.basename(png)})", ""]
    return "\n".join(parts)


def report_section(runs: list, out_dir: str, rank: int = 0, top: int = 10) -> str:
    """For analysis/report.py: the markdown of every run in `runs` (Run objects or directories) that
    has profile records, its PNGs written into `out_dir`; '' when none has."""
    from llmhpc_h5 import Run
    sections = []
    for k, run in enumerate(runs):
        run = run if isinstance(run, Run) else open_run(run)
        png = os.path.join(out_dir, f"profile_{k}_rank{rank}.png" if len(runs) > 1 else f"profile_rank{rank}.png")
        text = run_report(run, rank, top, png)
        if text:
            sections.append(text)
    return "\n".join(sections)  # report.py heads it "## profile"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", metavar="DIR")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--top", type=int, default=10, help="names per kernel table (default 10)")
    parser.add_argument("--out", metavar="OUT_DIR", help="where profile_rank<R>.md and .png go (default DIR)")
    args = parser.parse_args()
    if args.top < 1:
        parser.error("--top must be at least 1")
    out_dir = args.out or args.dir
    try:
        run = open_run(args.dir)
        if not run.records("profile", args.rank):
            raise SchemaError(f"{args.dir}: rank {args.rank} has no /profile records (mode is '{run.mode}')")
        why = unwritable(out_dir)
        if why:
            raise SchemaError(f"{why}: give --out a folder to write the tables and plot into")
        text = run_report(run, args.rank, args.top, os.path.join(out_dir, f"profile_rank{args.rank}.png"))
    except SchemaError as e:
        print(f"kernel_profile.py: {e}", file=sys.stderr)
        return 2
    md = os.path.join(out_dir, f"profile_rank{args.rank}.md")
    with open(md, "w") as f:
        f.write(text + "\n")
    print(text)
    print(f"Written: {md}" + (f", {os.path.join(out_dir, f'profile_rank{args.rank}.png')}" if "![" in text else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

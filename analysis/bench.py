"""The reference end-to-end benchmark's tables and plots from llmhpc --mode bench runs (report.py's bench section).

    report_section(runs, out_dir)   markdown: the benchmark table (one per warm-up setting when
                                    runs differ in warm-up, as its warm-up study), fp32
                                    against bf16 with speed-ups, peak memory; writes bench.png
                                    (and bench_speedup.png) into out_dir

Times are ms: the mean and sample std (n-1) of the raw per-step arrays of rank 0 (or of the rank
asked for; rank=None pools every rank). Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import BENCH_PHASES, label_precision, repeated_across_runs  # noqa: E402
from plotting import plain_log_y, ticks_at  # noqa: E402

# Columns that appear only when their value differs between rows: (summary column, header).
VARYING_COLUMNS = (("context_length", "Context"), ("batch_size", "Batch"), ("precision", "Precision"),
                   ("attention", "Attention"), ("phase", "Phase"), ("cuda_graph", "CUDA graph"), ("warmup", "Warm-up"),
                   ("steps", "Steps"))
SHAPE_KEYS = ("model", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
CONFIG_KEYS = (*SHAPE_KEYS, "context_length", "batch_size", "precision", "attention", "phase", "cuda_graph", "warmup",
               "steps")  # what makes a row one configuration
SHORT = {"forward": "Fwd", "backward": "Bwd", "optimizer": "Opt", "step": "Total"}
GIB = float(1 << 30)


def fmt(value, decimals: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


def section_script(section: str):
    """The command line of a script that only writes one of report.py's sections: where to go, on
    stderr; exit 0 for --help, 2 for anything else (it reads no run directories itself)."""
    script = os.path.basename(sys.argv[0])
    print(f"analysis/{script} writes report.py's {section} section: python3 analysis/report.py DIR...",
          file=sys.stderr)
    sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)


def markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def bench_table(summary: pd.DataFrame, decimals: int = 2) -> str:
    """The reference end-to-end benchmark's table: one row per configuration of Run.bench_summary()
    rows (several runs concatenated)."""
    varying = [(key, title) for key, title in VARYING_COLUMNS if summary[key].nunique(dropna=False) > 1]
    if repeated_across_runs(summary, CONFIG_KEYS):
        varying.insert(0, ("run", "Run"))
    show_status = (summary["status"] != "ok").any()
    # Bwd columns are always there, as in the reference table ('-' where only forward was timed);
    # Opt columns only when some configuration timed the optimizer step.
    show_opt = summary["optimizer_n"].fillna(0).gt(0).any()
    phases = ["forward", "backward"] + (["optimizer"] if show_opt else [])

    header = ["Model size", "d_model", "d_ff", "num_layers", "num_heads"] + [title for _, title in varying]
    if show_status:
        header.append("Status")
    for phase in phases:
        header += [f"{SHORT[phase]} Mean (ms)", f"{SHORT[phase]} Std (ms)"]
    header += ["Total (ms)", "Peak (MiB)"]
    # The GPU's clock where a busy GPU slowed it in some configuration (its power cap, heat):
    # those times include the slower clock.
    show_clock = "slowdowns" in summary and summary["slowdowns"].isin(["", "none"]).eq(False).any()
    if show_clock:
        header += ["SM clock min / median (MHz)", "Slowdowns"]

    rows = []
    for _, r in summary.iterrows():
        row = [r["model"], r["d_model"], r["d_ff"], r["num_layers"], r["num_heads"]] + [r[key] for key, _ in varying]
        if show_status:
            row.append(r["status"])
        for phase in phases:
            row += [fmt(r[f"{phase}_mean"], decimals), fmt(r[f"{phase}_std"], decimals)]
        peak = r["peak_memory_bytes"]  # 0 where a configuration was interrupted before it ran
        row += [fmt(r["step_mean"], decimals), fmt(peak / (1 << 20), 1) if peak > 0 else "-"]
        if show_clock:
            row += [f"{fmt(r['sm_clock_mhz_min'], 0)} / {fmt(r['sm_clock_mhz_median'], 0)}", r["slowdowns"] or "-"]
        rows.append(row)
    return markdown_table(header, rows)


def other_precisions(summary: pd.DataFrame) -> list:
    """Precisions measured besides fp32 (bf16 on GPUs; fp64 runs on the CPU too), fp32 being the reference."""
    ok = summary[summary["status"] == "ok"]
    present = set(ok["precision"])
    return sorted(present - {"fp32"}) if "fp32" in present else []


def speedup_table(summary: pd.DataFrame, other: str = "bf16", decimals: int = 2) -> str:
    """fp32 against `other` for every configuration measured in both (the reference
    mixed-precision study's table): mean ms of each timed phase and the speed-up fp32 / other."""
    keys = [k for k in CONFIG_KEYS if k != "precision"]
    ok = summary[summary["status"] == "ok"]
    by_run = repeated_across_runs(ok, keys + ["precision"])
    if by_run:  # the same configuration in several runs: each run's fp32 against its own bf16
        keys.append("run")
    fp32 = {tuple(r[k] for k in keys): r for _, r in ok[ok.precision == "fp32"].iterrows()}
    bf16 = {tuple(r[k] for k in keys): r for _, r in ok[ok.precision == other].iterrows()}
    common = [k for k in fp32 if k in bf16]
    if not common:
        return ""
    phases = [p for p in BENCH_PHASES if any(fp32[k][f"{p}_n"] > 0 for k in common)]
    show_warmup = len({fp32[k]["warmup"] for k in common}) > 1
    show_attention = len({fp32[k]["attention"] for k in common}) > 1
    header = (["Run"] if by_run else []) + ["Model size", "Context", "Batch", "Phase"] + \
        (["Attention"] if show_attention else []) + (["Warm-up"] if show_warmup else [])
    for p in phases:
        header += [f"{SHORT[p]} FP32 (ms)", f"{SHORT[p]} {other.upper()} (ms)", f"{SHORT[p]} Speedup"]
    rows = []
    for k in common:
        a, b = fp32[k], bf16[k]
        row = ([a["run"]] if by_run else []) + [a["model"], a["context_length"], a["batch_size"], a["phase"]] + \
            ([a["attention"]] if show_attention else []) + ([a["warmup"]] if show_warmup else [])
        for p in phases:
            x, y = a[f"{p}_mean"], b[f"{p}_mean"]
            row += [fmt(x, decimals), fmt(y, decimals), f"{x / y:.2f}x" if y > 0 else "-"]
        rows.append(row)
    return markdown_table(header, rows)


def memory_table(summary: pd.DataFrame) -> str:
    """Peak memory (GiB, or MiB when all are smaller) per model and context (and attention, where
    runs differ in it), one column per phase and precision (the reference memory study's table)."""
    cols = sorted({(r["phase"], r["precision"]) for _, r in summary.iterrows()})
    unit, scale = ("GiB", GIB) if summary["peak_memory_bytes"].max() >= GIB else ("MiB", float(1 << 20))
    show_attention = summary["attention"].nunique() > 1
    by_run = repeated_across_runs(summary, CONFIG_KEYS)
    rows = {}
    for _, r in summary.iterrows():
        key = ((r["run"],) if by_run else ()) + (r["model"], r["d_model"], r["num_layers"], r["context_length"],
                                                 r["batch_size"])
        row = rows.setdefault(key + ((r["attention"],) if show_attention else ()), {})
        peak = r["peak_memory_bytes"]  # an oom's is what it held when it failed; 0 if it never ran
        row[(r["phase"], r["precision"])] = (fmt(peak / scale, 2) if r["status"] == "ok" else
                                             f"{r['status']} (>{peak / scale:.2f})" if peak > 0 else r["status"])
    header = (["Run"] if by_run else []) + ["Model size", "d_model", "num_layers", "Context", "Batch"] + \
        (["Attention"] if show_attention else []) + \
        [f"{ph} {pr} peak ({unit})" for ph, pr in cols]
    return markdown_table(header, [[*key] + [cells.get(c, "-") for c in cols] for key, cells in rows.items()])


def model_label(row) -> str:
    shape = f"d{row['d_model']}/L{row['num_layers']}"
    return shape if row["model"] in ("custom", "checkpoint") else f"{row['model']} ({shape})"


def human_count(n) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def steady_state(rows: pd.DataFrame, keys=("model", "num_params", "context_length", "batch_size", "precision",
                                           "attention", "phase")) -> pd.DataFrame:
    """Of each configuration (`keys`) run with several warm-up settings (a warm-up study), the
    largest: its steady state. Per configuration, so that a sweep run with fewer warm-up steps
    beside the study keeps its rows."""
    keys = [k for k in keys if k in rows]
    if rows.empty:
        return rows
    largest = rows.groupby(keys, dropna=False)["warmup"].transform("max")
    return rows[rows["warmup"] == largest]


def plot_times(summary: pd.DataFrame, title: str, path: str) -> str:
    """Facets: one row per precision, one column per timed phase; time against parameters (log-log),
    one line per context length (a sweep of one model: against context length, one line) and
    attention (where runs differ in it), the sample std as error bars; a panel nothing was
    measured for is left empty. With several warm-up settings, the largest (the steady state).
    Returns the path, or "" when nothing ran."""
    ok = steady_state(summary[summary["status"] == "ok"])
    if ok.empty:
        return ""
    by_size = ok["num_params"].nunique() > 1
    x_key, line_key, x_label = (("num_params", "context_length", "parameters") if by_size else
                                ("context_length", "num_params", "context length"))
    phases = [p for p in BENCH_PHASES if ok[f"{p}_n"].fillna(0).gt(0).any()]
    precisions = sorted(ok["precision"].unique())
    fig, axes = plt.subplots(len(precisions), len(phases), figsize=(3.6 * len(phases), 3.2 * len(precisions)),
                             squeeze=False)
    xs = sorted(set(ok[x_key]))
    attentions = sorted(ok["attention"].unique())
    for i, precision in enumerate(precisions):
        for j, phase in enumerate(phases):
            ax = axes[i][j]
            ax.set_title(f"{phase}, {precision}")
            measured = ok[(ok.precision == precision) & ok[f"{phase}_n"].fillna(0).gt(0)]
            if measured.empty:  # e.g. runs of one precision timed forward only
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                ax.set(xticks=[], yticks=[])
                continue
            for (value, attention), g in measured.groupby([line_key, "attention"]):
                g = g.groupby(x_key, as_index=False).first().sort_values(x_key)
                label = f"T={value}" if by_size else human_count(value) + " params"
                if len(attentions) > 1:
                    label += f", {attention}"
                ax.errorbar(g[x_key], g[f"{phase}_mean"], yerr=g[f"{phase}_std"], fmt="o-", capsize=3, label=label)
            if len(xs) > 1:
                ax.set(xscale="log", yscale="log")
                ticks_at(ax, xs, [human_count(n) for n in xs] if by_size else None)
                plain_log_y(ax)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(precisions) - 1:
                ax.set_xlabel(x_label)
            if j == 0:
                ax.set_ylabel("ms per step")
    drawn = [ax for row in axes for ax in row if ax.get_legend_handles_labels()[0]]
    drawn[0].legend(fontsize="small")
    failed = summary[summary["status"] != "ok"]
    if len(failed):
        title += "\nnot run: " + ", ".join(f"{model_label(r)} T={r['context_length']} {r['precision']} ({r['status']})"
                                           for _, r in failed.iterrows())
    warmups = sorted(set(ok["warmup"]))
    fig.suptitle(f"{title}; warm-up " + (f"{warmups[0]}" if len(warmups) == 1 else
                                           f"{warmups[0]}-{warmups[-1]} (each configuration's largest)"),
                 fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup(summary: pd.DataFrame, path: str, other: str = "bf16") -> str:
    """`other`'s speed-up of the whole step (fp32 / other) against parameters, one line per context length."""
    ok = summary[summary["status"] == "ok"]
    keys = ["num_params", "context_length", "batch_size", "phase", "attention", "warmup"]
    both = ok[ok.precision == "fp32"].merge(ok[ok.precision == other], on=keys, suffixes=("_32", "_16"))
    if both.empty:
        return ""
    both = steady_state(both, keys[:-1])
    by_size = both["num_params"].nunique() > 1
    x_key, line_key = ("num_params", "context_length") if by_size else ("context_length", "num_params")
    fig, ax = plt.subplots(figsize=(6, 4))
    for value, g in both.groupby(line_key):
        g = g.sort_values(x_key)
        label = f"T={value}" if by_size else human_count(value) + " params"
        ax.plot(g[x_key], g["step_mean_32"] / g["step_mean_16"], "o-", label=label)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set(xlabel="parameters" if by_size else "context length", ylabel=f"speed-up fp32 / {other} (whole step)",
           title=f"{other} speed-up (above 1: {other} faster)")
    xs = sorted(set(both[x_key]))
    if len(xs) > 1:
        ax.set_xscale("log")
        ticks_at(ax, xs, [human_count(n) for n in xs] if by_size else None)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", title="context" if by_size else "model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summaries(runs: list, rank) -> pd.DataFrame:
    """The runs' bench_summary rows; bf16 with bf16 gradients (--grad-dtype bf16) is the precision
    "bf16 bf16-grads", a column and a plot of its own beside plain bf16."""
    frames = [run.bench_summary(rank).assign(run=run.directory) for run in runs]
    frames = [f for f in frames if not f.empty]
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not summary.empty:
        summary["precision"] = [label_precision(r) for _, r in summary.iterrows()]
    return summary


def report_section(runs: list, out_dir: str, rank=0, decimals: int = 2) -> str:
    summary = summaries(runs, rank)
    if summary.empty:
        return "no bench records"
    parts = []
    if summary["warmup"].nunique() > 1:  # the reference warm-up study: one table per warm-up setting
        for w, g in summary.groupby("warmup", sort=True):
            parts.append(f"### Benchmark (warm-up steps: {w})\n\n{bench_table(g, decimals)}")
    else:
        parts.append(f"### Benchmark (warm-up steps: {summary['warmup'].iloc[0]})\n\n{bench_table(summary, decimals)}")
    for other in other_precisions(summary):
        speedups = speedup_table(summary, other, decimals)
        if speedups:
            parts.append(f"### Mixed precision: fp32 against {other} (mean ms; speed-up = fp32 / {other})\n\n{speedups}")
    parts.append(f"### Peak memory (the allocator's peak of each configuration)\n\n{memory_table(summary)}")
    who = "all ranks pooled" if rank is None else f"rank {rank}"
    pngs = [("time per step", plot_times(summary, f"llmhpc bench, {who}", os.path.join(out_dir, "bench.png")))]
    pngs += [(f"{other} speed-up", plot_speedup(summary, os.path.join(out_dir, f"bench_speedup_{other}.png"), other))
             for other in other_precisions(summary)]
    parts += [f"![{name}]({os.path.basename(png)})" for name, png in pngs if png]
    return "\n\n".join(parts)


if __name__ == "__main__":
    section_script("bench")

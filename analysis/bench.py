"""The reference end-to-end benchmark's tables and plots from llmhpc --mode bench runs (report.py's bench section).

    report_section(runs, out_dir)   markdown: the benchmark table (one per warm-up setting when
                                    runs differ in warm-up, as its warm-up study), each timed
                                    pass's min, max, mean and std (one table, a row per
                                    configuration and pass), fp32 against bf16 with speed-ups,
                                    peak memory; writes bench.png (and bench_speedup_bf16.png)
                                    into out_dir

Rows in sweep order: models by parameter count, then precision (fp32 first), attention, context
length, batch size. Times are ms: the mean and sample std (n-1) of the raw per-step arrays of rank 0
(or of the rank asked for; rank=None pools every rank), and the whole step's min and max; the
pass table adds each pass's min and max (the reference warm-up study's table). Without
--separate-optimizer AdamW runs inside backward: that column is then Bwd+AdamW. A configuration
that ran out of memory shows the peak it had reached when it failed, marked: oom (>7.61). Files
are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import math
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import (BENCH_PHASES, MIB, label_precision, model_name, on_cpu, peak_cell,  # noqa: E402
                       repeated_across_runs, status_word, sweep_key, unit_of)
from plotting import plain_log_y, ticks_at  # noqa: E402

# Columns that appear only when their value differs between rows: (summary column, header).
VARYING_COLUMNS = (("context_length", "Context"), ("batch_size", "Batch"), ("precision", "Precision"),
                   ("attention", "Attention"), ("phase", "Phase"), ("adamw", "AdamW"), ("cuda_graph", "CUDA graph"),
                   ("warmup", "Warm-up"), ("steps", "Steps"))
SHAPE_KEYS = ("model", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
CONFIG_KEYS = (*SHAPE_KEYS, "context_length", "batch_size", "precision", "attention", "phase", "adamw", "cuda_graph",
               "warmup", "steps")  # what makes a row one configuration
# The sweep's nesting (docs/hdf5-schema.md, /bench): sizes (by parameter count), precisions,
# attentions, context lengths, batch sizes.
SWEEP_KEYS = ("num_params", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "precision", "attention",
              "context_length", "batch_size", "phase", "adamw", "cuda_graph", "warmup", "steps")
SHORT = {"forward": "Fwd", "backward": "Bwd", "optimizer": "Opt", "step": "Total"}
CPU_BF16_NOTE = ("On the CPU, bf16 is computed in fp32 on values stored as bf16 (for checking, not for speed): "
                 "these times say nothing of bf16 hardware.")
MAX_NAMED = 8  # configurations a plot's title names; the tables list them all


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


def adamw_place(row) -> str:
    """Where a configuration's AdamW ran: 'in Bwd' (phase train-step without --separate-optimizer:
    each layer's update as backward finishes it, inside backward_ms), 'separate' (optimizer_ms), or
    '-' (a phase without an optimizer step)."""
    if row["phase"] != "train-step":
        return "-"
    return "separate" if row["separate_optimizer"] else "in Bwd"


def backward_title(rows: pd.DataFrame) -> str:
    """'Bwd+AdamW' where every row whose phase has a backward ran AdamW inside it, else 'Bwd'."""
    places = rows.loc[rows["phase"] != "forward", "adamw"]
    return "Bwd+AdamW" if len(places) and places.eq("in Bwd").all() else "Bwd"


def adamw_note(rows: pd.DataFrame) -> str:
    """The line under a table some of whose backward times include AdamW ('' where none does)."""
    if not rows["adamw"].eq("in Bwd").any():
        return ""
    which = "Bwd+AdamW" if backward_title(rows) == "Bwd+AdamW" else "Bwd of the rows whose AdamW is 'in Bwd'"
    return (f"{which}: without --separate-optimizer AdamW updates each layer as backward finishes it, so "
            "backward's time includes it; --separate-optimizer times it on its own (Opt).")


def with_notes(table: str, *notes: str) -> str:
    return "\n\n".join([table, *(n for n in notes if n)])


def bench_table(summary: pd.DataFrame, decimals: int = 2) -> str:
    """The reference end-to-end benchmark's table: one row per configuration of summaries() rows
    (several runs concatenated), and the note on AdamW where backward includes it."""
    varying = [(key, title) for key, title in VARYING_COLUMNS if summary[key].nunique(dropna=False) > 1]
    if repeated_across_runs(summary, CONFIG_KEYS):
        varying.insert(0, ("run", "Run"))
    show_status = (summary["status"] != "ok").any()
    # Bwd columns are always there, as in the reference table ('-' where only forward was timed);
    # Opt columns only when some configuration timed the optimizer step.
    show_opt = summary["optimizer_n"].fillna(0).gt(0).any()
    phases = ["forward", "backward"] + (["optimizer"] if show_opt else [])
    names = dict(SHORT, backward=backward_title(summary))

    header = ["Model size", "d_model", "d_ff", "num_layers", "num_heads"] + [title for _, title in varying]
    if show_status:
        header.append("Status")
    for phase in phases:
        header += [f"{names[phase]} Mean (ms)", f"{names[phase]} Std (ms)"]
    header += ["Total (ms)", "Total Min (ms)", "Total Max (ms)", "Peak (MiB)"]
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
        row += [fmt(r[f"step_{stat}"], decimals) for stat in ("mean", "min", "max")]
        row.append(peak_cell(r["status"], r["peak_memory_bytes"], MIB, 1))
        if show_clock:
            row += [f"{fmt(r['sm_clock_mhz_min'], 0)} / {fmt(r['sm_clock_mhz_median'], 0)}", r["slowdowns"] or "-"]
        rows.append(row)
    return with_notes(markdown_table(header, rows), adamw_note(summary))


PASS_NAMES = {"forward": "Forward", "backward": "Backward", "optimizer": "Optimizer"}


def pass_table(summary: pd.DataFrame, decimals: int = 2) -> str:
    """Each timed pass's (forward, backward, optimizer) min, max, mean and sample std (ms), one row
    per configuration and pass (the reference warm-up study's table, with the warm-up setting
    where runs differ in it), configurations in the benchmark table's order. A backward whose
    AdamW ran inside it is 'Backward+AdamW' (the benchmark table's note says why); configurations
    that did not run are left out (the benchmark table marks them). '' when none ran."""
    ok = summary[summary["status"] == "ok"]
    if ok.empty:
        return ""
    varying = [(key, title) for key, title in VARYING_COLUMNS if summary[key].nunique(dropna=False) > 1]
    if repeated_across_runs(summary, CONFIG_KEYS):
        varying.insert(0, ("run", "Run"))
    header = ["Model size"] + [title for _, title in varying] + \
        ["Pass", "Min (ms)", "Max (ms)", "Mean (ms)", "Std (ms)"]
    rows = []
    for _, r in ok.iterrows():
        for phase in ("forward", "backward", "optimizer"):
            if not r[f"{phase}_n"] > 0:
                continue
            name = PASS_NAMES[phase] + ("+AdamW" if phase == "backward" and r["adamw"] == "in Bwd" else "")
            rows.append([r["model"]] + [r[key] for key, _ in varying] + [name] +
                        [fmt(r[f"{phase}_{stat}"], decimals) for stat in ("min", "max", "mean", "std")])
    return markdown_table(header, rows)


def precision_key(precision: str) -> tuple:
    return sweep_key({"precision": precision}, ["precision"])


def other_precisions(summary: pd.DataFrame) -> list:
    """Precisions measured besides fp32 (bf16 on GPUs; fp64 runs on the CPU too), fp32 being the
    reference; whether they ran or not (fp32 out of memory where bf16 fits is a result)."""
    present = set(summary["precision"])
    return sorted(present - {"fp32"}, key=precision_key) if "fp32" in present else []


def speedup_table(summary: pd.DataFrame, other: str = "bf16", decimals: int = 2) -> str:
    """fp32 against `other` for every configuration measured in both where at least one ran (the
    reference mixed-precision study's table): mean ms of each timed phase and the speed-up fp32 /
    other; a side that did not run shows its status (oom) and no speed-up. Notes under it: AdamW
    inside backward, and bf16 on the CPU."""
    keys = [k for k in CONFIG_KEYS if k != "precision"]
    by_run = repeated_across_runs(summary, keys + ["precision"])
    if by_run:  # the same configuration in several runs: each run's fp32 against its own bf16
        keys.append("run")
    fp32 = {tuple(r[k] for k in keys): r for _, r in summary[summary.precision == "fp32"].iterrows()}
    theirs = {tuple(r[k] for k in keys): r for _, r in summary[summary.precision == other].iterrows()}
    pairs = [(fp32[k], theirs[k]) for k in fp32 if k in theirs and "ok" in (fp32[k]["status"], theirs[k]["status"])]
    if not pairs:
        return ""
    both = pd.DataFrame([r for pair in pairs for r in pair])
    phases = [p for p in BENCH_PHASES if both[f"{p}_n"].gt(0).any()]
    shown = [(key, title) for key, title in (("attention", "Attention"), ("adamw", "AdamW"), ("warmup", "Warm-up"))
             if both[key].nunique() > 1]
    names = dict(SHORT, backward=backward_title(both))
    header = (["Run"] if by_run else []) + ["Model size", "Context", "Batch", "Phase"] + [t for _, t in shown]
    for p in phases:
        header += [f"{names[p]} FP32 (ms)", f"{names[p]} {other.upper()} (ms)", f"{names[p]} Speedup"]
    rows = []
    for a, b in pairs:
        row = ([a["run"]] if by_run else []) + [a["model"], a["context_length"], a["batch_size"], a["phase"]] + \
            [a[key] for key, _ in shown]
        for p in phases:
            x, y = (r[f"{p}_mean"] if r["status"] == "ok" else math.nan for r in (a, b))
            row += [time_cell(a, p, decimals), time_cell(b, p, decimals), f"{x / y:.2f}x" if x > 0 and y > 0 else "-"]
        rows.append(row)
    cpu = CPU_BF16_NOTE if other.startswith("bf16") and both["cpu"].any() else ""
    return with_notes(markdown_table(header, rows), adamw_note(both), cpu)


def time_cell(row, phase: str, decimals: int) -> str:
    """A phase's mean ms, or the status of a configuration that did not run ('oom')."""
    return fmt(row[f"{phase}_mean"], decimals) if row["status"] == "ok" else status_word(row["status"])


def memory_table(summary: pd.DataFrame) -> str:
    """Peak memory (GiB, or MiB when all are smaller) per model and context (and attention, where
    runs differ in it), one column per phase (AdamW separate or not) and precision (the reference
    memory study's table)."""
    def column(r):
        return r["phase"] + (", AdamW separate" if r["adamw"] == "separate" else ""), r["precision"]
    ordered = sorted((r for _, r in summary.iterrows()), key=lambda r: sweep_key(r, ("phase", "adamw", "precision")))
    cols = list(dict.fromkeys(column(r) for r in ordered))
    unit, scale = unit_of(summary["peak_memory_bytes"])
    show_attention = summary["attention"].nunique() > 1
    by_run = repeated_across_runs(summary, CONFIG_KEYS)
    rows = {}
    for _, r in summary.iterrows():
        key = ((r["run"],) if by_run else ()) + (r["model"], r["d_model"], r["num_layers"], r["context_length"],
                                                 r["batch_size"])
        row = rows.setdefault(key + ((r["attention"],) if show_attention else ()), {})
        row[column(r)] = peak_cell(r["status"], r["peak_memory_bytes"], scale, 2)
    header = (["Run"] if by_run else []) + ["Model size", "d_model", "num_layers", "Context", "Batch"] + \
        (["Attention"] if show_attention else []) + \
        [f"{ph} {pr} peak ({unit})" for ph, pr in cols]
    return markdown_table(header, [[*key] + [cells.get(c, "-") for c in cols] for key, cells in rows.items()])


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


def not_run_title(failed: pd.DataFrame, width: int) -> str:
    """'2 configurations out of memory: small T=2048 B=4 fp32, ...', a line per status (the first
    MAX_NAMED named), wrapped at `width` characters: a plot's title within its figure."""
    lines = []
    for word, g in failed.groupby(failed["status"].map(status_word), sort=False):
        names = [f"{r['model']} T={r['context_length']} B={r['batch_size']} {r['precision']}" for _, r in g.iterrows()]
        if len(names) > MAX_NAMED:
            names = names[:MAX_NAMED] + [f"{len(names) - MAX_NAMED} more (the tables list them)"]
        what = "out of memory" if word == "oom" else f"not run ({word})"
        lines.append(textwrap.fill(f"{len(g)} configuration{'s' if len(g) > 1 else ''} {what}: {', '.join(names)}",
                                   width))
    return "\n".join(lines)


def plot_times(summary: pd.DataFrame, title: str, path: str) -> str:
    """Facets: one row per precision, one column per timed phase; time against parameters (log-log),
    one line per context length (a sweep of one model: against context length, one line),
    attention and batch size (where runs differ in them), the sample std as error bars; a panel nothing was
    measured for is left empty. With several warm-up settings, the largest (the steady state).
    Configurations that did not run are counted and named under the title.
    Returns the path, or "" when nothing ran."""
    ok = steady_state(summary[summary["status"] == "ok"])
    if ok.empty:
        return ""
    by_size = ok["num_params"].nunique() > 1
    x_key, line_key, x_label = (("num_params", "context_length", "parameters") if by_size else
                                ("context_length", "num_params", "context length"))
    phases = [p for p in BENCH_PHASES if ok[f"{p}_n"].fillna(0).gt(0).any()]
    precisions = sorted(ok["precision"].unique(), key=precision_key)
    fig, axes = plt.subplots(len(precisions), len(phases), figsize=(3.6 * len(phases), 3.2 * len(precisions)),
                             squeeze=False)
    xs = sorted(set(ok[x_key]))
    attentions = sorted(ok["attention"].unique())
    batches = ok["batch_size"].nunique() > 1  # then a line per batch size too
    for i, precision in enumerate(precisions):
        for j, phase in enumerate(phases):
            ax = axes[i][j]
            measured = ok[(ok.precision == precision) & ok[f"{phase}_n"].fillna(0).gt(0)]
            inside = phase == "backward" and backward_title(measured) == "Bwd+AdamW"
            ax.set_title(f"{'backward+AdamW' if inside else phase}, {precision}")
            if measured.empty:  # e.g. runs of one precision timed forward only
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                ax.set(xticks=[], yticks=[])
                continue
            for key, g in measured.groupby([line_key, "attention", "batch_size"]):
                value, attention, batch = key
                g = g.groupby(x_key, as_index=False).first().sort_values(x_key)
                label = f"T={value}" if by_size else human_count(value) + " params"
                if len(attentions) > 1:
                    label += f", {attention}"
                if batches:
                    label += f", B={batch}"
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
    warmups = sorted(set(ok["warmup"]))
    title += "; warm-up " + (f"{warmups[0]}" if len(warmups) == 1 else
                             f"{warmups[0]}-{warmups[-1]} (each configuration's largest)")
    failed = summary[summary["status"] != "ok"]
    if len(failed):  # about 12 characters of the title's font to an inch of figure
        title += "\n" + not_run_title(failed, int(12 * fig.get_figwidth()))
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup(summary: pd.DataFrame, path: str, other: str = "bf16") -> str:
    """`other`'s speed-up of the whole step (fp32 / other) against parameters, one line per context
    length (and batch size, where they differ); on the CPU, bf16's caveat under the title."""
    ok = summary[summary["status"] == "ok"]
    keys = ["num_params", "context_length", "batch_size", "phase", "adamw", "attention", "warmup"]
    both = ok[ok.precision == "fp32"].merge(ok[ok.precision == other], on=keys, suffixes=("_32", "_16"))
    if both.empty:
        return ""
    both = steady_state(both, keys[:-1])
    by_size = both["num_params"].nunique() > 1
    x_key, line_key = ("num_params", "context_length") if by_size else ("context_length", "num_params")
    fig, ax = plt.subplots(figsize=(6, 4))
    batches = both["batch_size"].nunique() > 1  # then a line per batch size too
    for (value, batch), g in both.groupby([line_key, "batch_size"]):
        g = g.sort_values(x_key)
        label = (f"T={value}" if by_size else human_count(value) + " params") + (f", B={batch}" if batches else "")
        ax.plot(g[x_key], g["step_mean_32"] / g["step_mean_16"], "o-", label=label)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    title = f"{other} speed-up (above 1: {other} faster)"
    if other.startswith("bf16") and (both["cpu_32"] | both["cpu_16"]).any():
        title += "\non the CPU: bf16 computed in fp32, not bf16 hardware"
    ax.set(xlabel="parameters" if by_size else "context length", ylabel=f"speed-up fp32 / {other} (whole step)",
           title=title)
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
    """The runs' bench_summary rows in sweep order (SWEEP_KEYS), with the run's directory (run),
    whether it ran on the CPU (cpu), the model by name (model_name: custom shapes by their shape)
    and where AdamW ran (adamw); bf16 with bf16 gradients (--grad-dtype bf16) is the precision
    "bf16 bf16-grads", a column and a plot of its own beside plain bf16."""
    frames = [run.bench_summary(rank).assign(run=run.directory, cpu=on_cpu(run.attrs)) for run in runs]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    summary = pd.concat(frames, ignore_index=True)
    for column, label in (("precision", label_precision), ("model", model_name), ("adamw", adamw_place)):
        summary[column] = [label(r) for _, r in summary.iterrows()]
    order = sorted(range(len(summary)), key=lambda i: sweep_key(summary.iloc[i], SWEEP_KEYS))
    return summary.iloc[order].reset_index(drop=True)


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
    passes = pass_table(summary, decimals)
    if passes:
        parts.append(f"### Each pass: min, max, mean and std (ms)\n\n{passes}")
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

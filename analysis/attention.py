#!/usr/bin/env python3
"""The reference attention study's tables, in markdown, from llmhpc --mode attention runs.

    python3 analysis/attention.py results/attention-20261122-103000 [more run directories ...]
    python3 analysis/attention.py DIR --torch torch_attention.json   # + the PyTorch comparison
    python3 analysis/attention.py --torch torch_compile.json         # PyTorch eager against torch.compile only

Prints, from rank 0's records (/attention/<label>, docs/hdf5-schema.md):
  1. one table per implementation, precision, causal, batch and heads, like the reference
     attention study's pytorch_attention table: head dim, sequence length, forward and backward mean +- std
     (sample std, n-1), end-to-end mean, what forward saved for backward (saved_bytes, MiB: its
     "memory before backward" without the inputs), peak memory (MiB), status and the kernels that ran
     (kernel_summary: on a GPU the choices flash makes by shape, which explain its steps);
  2. naive against flash, like its flash_benchmarking table: median forward,
     backward and end-to-end times of both and the speedup naive / flash (N/A where one
     ran out of memory), and both peaks;
  A configuration that ran out of memory shows the peak it had reached: oom (>512.000).
  3. with --torch (the JSON written by analysis/torch_attention.py; once per file that has
     --impl fused records): llmhpc's flash against PyTorch's fused attention on the same shapes,
     median ms and the ratio llmhpc / PyTorch (the issue's target: at most 1.25 for T >= 4096),
     and llmhpc's kernels;
  4. with --torch, once per file that has both --impl naive and --impl compiled records, like the
     reference attention study's torch_compile table (a): PyTorch's naive attention eager against
     the same under torch.compile, per setting, head dim and sequence length: median forward and
     backward ms of both, the speedup eager / compiled (N/A where one did not run, OOM where it
     ran out of memory), and both peaks. Without run directories only this table is printed.
Times are milliseconds per iteration; one iteration is one forward plus one backward.
report_section (analysis/report.py) prints 1 and 2 and draws attention_time.png and
attention_memory.png: each against sequence length, naive and flash, a panel per setting and
head dim.
Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import (MIB, SchemaError, open_run, peak_cell, pooled_status, repeated_across_runs,  # noqa: E402
                       run_directories)
from plotting import legend_above, plain_log_y, ticks_at  # noqa: E402

CONFIG_KEYS = ("impl", "precision", "batch", "heads", "head_dim", "seq", "causal")
GROUP_KEYS = ("precision", "causal", "batch", "heads")


def attention_frame(directories: list) -> pd.DataFrame:
    """One row per attention record of rank 0 of every run: configuration, status, measured (ok,
    or cut short with the steps it kept, which its status counts: Record.measured), and
    mean/std/median of forward_ms, backward_ms, total_ms; peak_mib, saved_mib (NaN where the
    record has no saved_bytes: it failed before allocating it)."""
    rows = []
    for directory in directories:
        run = open_run(directory)
        if run.mode != "attention":
            raise SchemaError(f"{directory}: a '{run.mode}' run, not an attention run")
        for r in run.records("attention", rank=0):
            row = {key: r.attrs.get(key) for key in CONFIG_KEYS}
            row.update(run=directory, name=r.name, status=pooled_status([r]), measured=r.measured,
                       kernels=kernel_summary(r.attrs),
                       peak_mib=r.attrs.get("peak_memory_bytes", 0) / MIB,
                       saved_mib=r.attrs.get("saved_bytes", math.nan) / MIB,
                       flops_forward=r.attrs.get("flops_forward", math.nan),
                       flops_backward=r.attrs.get("flops_backward", math.nan))
            for phase in ("forward", "backward", "total"):
                values = np.asarray(r.arrays.get(f"{phase}_ms", []), dtype=float)
                row[f"{phase}_mean"] = float(values.mean()) if len(values) else math.nan
                row[f"{phase}_std"] = float(values.std(ddof=1)) if len(values) > 1 else (0.0 if len(values) else math.nan)
                row[f"{phase}_median"] = float(np.median(values)) if len(values) else math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def kernel_summary(attrs) -> str:
    """What ran, from the record's variant attributes (docs/hdf5-schema.md): e.g. "tensor cores
    d80, fwd 128 rows, bwd fused in d96 (atomic dQ)"; the CPU's or naive's attention_kernel as it is."""
    impl = attrs.get("flash_impl")
    if impl is None:
        return str(attrs.get("attention_kernel", ""))
    cores = "tensor cores" if impl == "tensor-core" else "CUDA cores"
    text = f"{cores} d{attrs.get('flash_head_dim')}, fwd {attrs.get('flash_fwd_rows')} rows, bwd {attrs.get('flash_bwd')}"
    if attrs.get("flash_bwd_head_dim") not in (None, attrs.get("flash_head_dim")):
        text += f" in d{attrs['flash_bwd_head_dim']}"
    if attrs.get("flash_dq") not in (None, "none"):
        text += f" ({attrs['flash_dq']} dQ)"
    if attrs.get("flash_bwd_chunks") not in (None, "off"):
        text += f", chunks {attrs['flash_bwd_chunks']}"
    return text


def fmt(value, decimals: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


TEXT_COLUMNS = {"status", "dtype", "causal", "torch backend", "kernels", "llmhpc kernels"}


def markdown(header: list, rows: list) -> str:
    """A markdown table; every column but the text ones right-aligned."""
    align = ["---" if h in TEXT_COLUMNS else "---:" for h in header]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def group_keys(df: pd.DataFrame) -> list:
    """A table per setting; per run too where runs measured the same configurations."""
    return list(GROUP_KEYS) + (["run"] if repeated_across_runs(df, CONFIG_KEYS) else [])


def group_title(keys: tuple) -> str:
    precision, causal, batch, heads, *run = keys
    return f"{precision}, {'causal' if causal else 'no mask'}, batch {batch}, {heads} head(s)" + \
        (f", {run[0]}" if run else "")


def per_implementation_tables(df: pd.DataFrame) -> str:
    out = []
    for keys, g in df.groupby(["impl", *group_keys(df)], sort=False):
        rows = []
        for _, r in g.sort_values(["head_dim", "seq"]).iterrows():
            ok = r.measured
            rows.append([str(r.head_dim), str(r.seq),
                         f"{fmt(r.forward_mean)} ± {fmt(r.forward_std)}" if ok else "-",
                         f"{fmt(r.backward_mean)} ± {fmt(r.backward_std)}" if ok else "-",
                         fmt(r.total_mean) if ok else "-", fmt(r.saved_mib), peak_cell(r.status, r.peak_mib, 1.0, 3),
                         r.status, r.kernels])
        out.append(f"### {keys[0]} attention, {group_title(keys[1:])}\n\n" + markdown(
            ["head dim", "seq", "forward ms (mean ± std)", "backward ms (mean ± std)", "fwd+bwd ms (mean)",
             "saved for backward MiB", "peak MiB", "status", "kernels"], rows))
    return "\n\n".join(out)


def ratio(a: float, b: float) -> str:
    return "N/A" if any(math.isnan(x) for x in (a, b)) or b <= 0 else f"{a / b:.2f}"


def naive_vs_flash_tables(df: pd.DataFrame) -> str:
    out = []
    for keys, g in df.groupby(group_keys(df), sort=False):
        naive = {(r.seq, r.head_dim): r for _, r in g[g.impl == "naive"].iterrows()}
        flash = {(r.seq, r.head_dim): r for _, r in g[g.impl == "flash"].iterrows()}
        shapes = sorted(set(naive) & set(flash), key=lambda s: (s[1], s[0]))
        if not shapes:
            continue
        rows = []
        for s in shapes:
            n, f = naive[s], flash[s]
            cell = lambda r, phase: fmt(r[f"{phase}_median"]) if r.measured else ("OOM" if r.status == "oom" else "N/A")
            nv = lambda r, phase: r[f"{phase}_median"] if r.measured else math.nan
            row = [str(s[0]), str(s[1])]
            for phase in ("forward", "backward", "total"):
                row += [cell(n, phase), cell(f, phase), ratio(nv(n, phase), nv(f, phase))]
            row += [peak_cell(r.status, r.peak_mib, 1.0, 3) for r in (n, f)]
            rows.append(row)
        out.append(f"### naive vs flash, {group_title(keys)} (median ms; speedup = naive / flash)\n\n" + markdown(
            ["seq", "head dim", "naive fwd", "flash fwd", "fwd speedup", "naive bwd", "flash bwd", "bwd speedup",
             "naive e2e", "flash e2e", "e2e speedup", "naive peak MiB", "flash peak MiB"], rows))
    return "\n\n".join(out)


TORCH_KEYS = ("precision", "causal", "batch", "heads", "seq", "head_dim", "status")


def read_torch(path: str) -> list:
    """The results of an analysis/torch_attention.py JSON file; SchemaError where it is not one."""
    try:
        with open(path) as f:
            results = json.load(f).get("results")
    except (OSError, ValueError, AttributeError) as e:
        raise SchemaError(f"--torch {path}: cannot be read as analysis/torch_attention.py's JSON ({e})") from None
    if not isinstance(results, list) or any(not isinstance(r, dict) or set(TORCH_KEYS) - set(r) for r in results):
        raise SchemaError(f"--torch {path}: not analysis/torch_attention.py's JSON (a 'results' list of records "
                          f"with {list(TORCH_KEYS)})")
    return results


def torch_impl(record: dict) -> str:
    """A torch_attention.py record's implementation (files from before --impl: fused)."""
    return record.get("impl", "fused")


def torch_table(df: pd.DataFrame, torch_path: str, torch_rows: list) -> str:
    """llmhpc's flash against the file's fused records ("" where it has none)."""
    torch_rows = [t for t in torch_rows if torch_impl(t) == "fused"]
    if not torch_rows:
        return ""
    flash = {(r.precision, int(r.causal), r.batch, r.heads, r.seq, r.head_dim): r
             for _, r in df[df.impl == "flash"].iterrows()}
    rows = []
    for t in torch_rows:
        key = (t["precision"], int(t["causal"]), t["batch"], t["heads"], t["seq"], t["head_dim"])
        f = flash.get(key)
        ours_f = f.forward_median if f is not None and f.measured else math.nan
        ours_b = f.backward_median if f is not None and f.measured else math.nan
        tf = t.get("forward_ms_median", math.nan) if t.get("status") == "ok" else math.nan
        tb = t.get("backward_ms_median", math.nan) if t.get("status") == "ok" else math.nan
        rows.append([t["precision"], "yes" if t["causal"] else "no", str(t["batch"]), str(t["heads"]), str(t["seq"]),
                     str(t["head_dim"]), fmt(ours_f), fmt(tf), ratio(ours_f, tf), fmt(ours_b), fmt(tb), ratio(ours_b, tb),
                     t.get("backend", ""), f.kernels if f is not None else "-"])
    return (f"### llmhpc flash vs PyTorch fused attention ({os.path.basename(torch_path)}; median ms; "
            "ratio = llmhpc / PyTorch, target <= 1.25)\n\n" + markdown(
                ["dtype", "causal", "B", "H", "seq", "head dim", "llmhpc fwd", "torch fwd", "fwd ratio", "llmhpc bwd",
                 "torch bwd", "bwd ratio", "torch backend", "llmhpc kernels"], rows))


def torch_ms(record: dict, phase: str) -> float:
    """A torch_attention.py record's median ms of one phase; NaN where it did not run."""
    value = record.get(f"{phase}_ms_median") if record.get("status") == "ok" else None
    return math.nan if value is None else float(value)


def torch_cell(record: dict, phase: str) -> str:
    if record.get("status") == "ok":
        return fmt(torch_ms(record, phase))
    return "OOM" if record.get("status") == "oom" else "N/A"


def torch_peak(record: dict) -> str:
    """Peak MiB ("-" where not measured: the CPU), marked oom as the llmhpc tables mark it."""
    peak, status = record.get("peak_memory_bytes"), record.get("status", "")
    return "-" if peak is None and status == "ok" else peak_cell(status, peak, MIB, 1)


def compile_tables(torch_path: str, torch_rows: list) -> str:
    """The reference attention study's torch_compile table (a) from one torch_attention.py file:
    per setting, naive attention eager against torch.compile ("" where the file lacks either)."""
    eager = [t for t in torch_rows if torch_impl(t) == "naive"]
    compiled = {(t["precision"], int(t["causal"]), t["batch"], t["heads"], t["head_dim"], t["seq"]): t
                for t in torch_rows if torch_impl(t) == "compiled"}
    groups = {}
    for e in eager:
        key = (e["precision"], int(e["causal"]), e["batch"], e["heads"])
        c = compiled.get(key + (e["head_dim"], e["seq"]))
        if c is not None:
            groups.setdefault(key, {})[(e["head_dim"], e["seq"])] = (e, c)
    out = []
    order = sorted(groups, key=lambda k: (k[0] != "bf16", -k[1], k[2], k[3]))  # bf16 first, causal first
    for key in order:
        rows = []
        for (d, T), (e, c) in sorted(groups[key].items()):
            row = [str(d), str(T)]
            for phase in ("forward", "backward"):
                row += [torch_cell(e, phase), torch_cell(c, phase), ratio(torch_ms(e, phase), torch_ms(c, phase))]
            row += [torch_peak(e), torch_peak(c)]
            rows.append(row)
        out.append(f"### PyTorch naive attention, eager vs torch.compile, {group_title(key)} "
                   f"({os.path.basename(torch_path)}; median ms; speedup = eager / compiled)\n\n" + markdown(
                       ["head dim", "seq", "eager fwd", "compiled fwd", "fwd speedup", "eager bwd", "compiled bwd",
                        "bwd speedup", "eager peak MiB", "compiled peak MiB"], rows))
    return "\n\n".join(out)


def plot_attention(df: pd.DataFrame, quantity: str, path: str) -> str:
    """One quantity against sequence length, log-log: "time" (forward + backward, median ms) or
    "memory" (peak MiB); one panel per setting (precision, mask, batch, heads: a row) and head dim
    (a column), one line per implementation. Out-of-memory points are left out (the tables list
    them). Returns the path, or "" when nothing ran."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    column, y_label = {"time": ("total_median", "fwd+bwd ms (median)"), "memory": ("peak_mib", "peak MiB")}[quantity]
    ok = df[df.measured]
    groups = list(ok.groupby(group_keys(ok), sort=False))
    dims = sorted(ok.head_dim.unique())
    if not groups:
        return ""
    fig, axes = plt.subplots(len(groups), len(dims), figsize=(3.2 * len(dims), 2.8 * len(groups) + 0.6),
                             squeeze=False)
    for gi, (keys, g) in enumerate(groups):
        seqs = sorted(g.seq.unique())
        for di, d in enumerate(dims):
            ax = axes[gi][di]
            for impl, rows in g[g.head_dim == d].groupby("impl", sort=False):
                rows = rows.sort_values("seq")
                ax.plot(rows.seq, rows[column], "o-" if impl == "naive" else "s--", label=impl)
            if gi == 0:
                ax.set_title(f"head dim {d}", fontsize="medium")
            if len(seqs) > 1:
                ax.set(xscale="log", yscale="log")
                ticks_at(ax, seqs)
                ax.tick_params(axis="x", labelsize="x-small", labelrotation=90 if len(seqs) > 6 else 0)
                plain_log_y(ax)
            ax.grid(True, which="both", alpha=0.3)
            if di == 0:
                ax.set_ylabel(f"{group_title(keys)}\n{y_label}", fontsize="small")
            if gi == len(groups) - 1:
                ax.set_xlabel("sequence length")
    legend_above(fig, axes)  # every implementation once, whichever panel has it
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Groups in a fixed order: precision, causal first, batch, heads; naive before flash."""
    df = df.assign(impl_order=df.impl.map({"naive": 0, "flash": 1}))
    return df.sort_values(["precision", "causal", "batch", "heads", "impl_order", "head_dim", "seq"],
                          ascending=[False, False, True, True, True, True, True], kind="stable")


def report_section(runs: list, out_dir: str) -> str:
    """report.py's attention section: the per-implementation and naive-vs-flash tables,
    attention_time.png and attention_memory.png."""
    df = ordered(attention_frame([run.directory for run in runs]))
    parts = [per_implementation_tables(df), naive_vs_flash_tables(df)]
    for quantity, name in (("time", "forward + backward time"), ("memory", "peak memory")):
        if plot_attention(df, quantity, os.path.join(out_dir, f"attention_{quantity}.png")):
            parts.append(f"![attention {name} vs sequence length](attention_{quantity}.png)")
    return "\n\n".join(p for p in parts if p)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="llmhpc --mode attention output directories")
    parser.add_argument("--torch", action="append", default=[],
                        help="JSON from analysis/torch_attention.py to compare with (repeatable: tables for each)")
    args = parser.parse_args(argv)
    if not args.runs and not args.torch:
        parser.error("give llmhpc attention run directories, --torch files, or both")
    try:
        df = attention_frame(run_directories(*args.runs, mode="attention")) if args.runs else pd.DataFrame()
        torch = [(path, read_torch(path)) for path in args.torch]
    except SchemaError as e:
        print(f"attention.py: {e}", file=sys.stderr)
        return 2
    if args.runs and df.empty:
        print("attention.py: no attention records", file=sys.stderr)
        return 2
    sections = []
    if args.runs:
        df = ordered(df)
        sections += [per_implementation_tables(df), naive_vs_flash_tables(df)]
        sections += [torch_table(df, path, rows) for path, rows in torch]
    sections += [compile_tables(path, rows) for path, rows in torch]
    sections = [s for s in sections if s]
    if not sections:
        print("attention.py: nothing to compare: the --torch files have no naive records with compiled ones "
              "of the same shapes (analysis/torch_attention.py --impl naive,compiled)", file=sys.stderr)
        return 2
    print("\n\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())

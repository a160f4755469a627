#!/usr/bin/env python3
"""The reference memory study's tables from `llmhpc --mode memory` runs (docs/hdf5-schema.md, /memory).

    python3 analysis/memory.py DIR [DIR ...]            # markdown tables on stdout
    python3 analysis/memory.py DIR --png OUT_DIR        # + one active-memory timeline PNG per configuration

Tables: (a) peak memory by model x context length, forward and train step, each precision
(the reference memory study's (b)(c)); (b) memory per phase: after init, the peaks of forward,
backward and optimizer, the overall peak ("in backward" where AdamW ran inside backward, without
--separate-optimizer, with a note); (c) what the peak is made of, by category; (d) the
bytes of one residual-stream activation, B x T x d_model x 4 (fp32 in both precisions, as under
autocast), checked against the allocation that holds it; (e) the largest allocations and where
they come from (their tags), as many as the run kept (llmhpc --top). Sizes in GiB, or in MiB in
a table whose values are all below 1 GiB; a configuration that ran out of memory shows what it had
reached: oom (>1.50). Rows in sweep order (models by parameter count, precision fp32 first,
context, batch); custom shapes named by their shape (d64_ff128_L2_H4).
`report_section(runs, out_dir)` returns the same markdown for analysis/report.py and writes the
PNGs into out_dir.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import (MIB, SchemaError, label_precision, model_name, open_run, peak_cell, sweep_key,  # noqa: E402
                       run_directories, unit_of)

PHASES = ("init", "forward", "backward", "optimizer")
# The sweep's nesting (docs/hdf5-schema.md, /memory), sizes by parameter count.
SWEEP_KEYS = ("num_params", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "precision", "attention",
              "context_length", "batch_size", "tp", "phase")


def configs(runs) -> list:
    """One dict per memory record of rank 0 of each run (a directory or an llmhpc_h5.Run), each
    run's in sweep order (SWEEP_KEYS)."""
    out = []
    for run in runs:
        run = open_run(run) if isinstance(run, str) else run
        mine = []
        for rec in run.records("memory", rank=0):
            a = dict(rec.attrs)
            a["label"], a["ok"], a["status"], a["arrays"] = rec.name, rec.ok, rec.status, rec.arrays
            a.setdefault("peak_memory_bytes", 0)  # a record cut short (interrupted) never wrote its peak
            a["run"] = os.path.basename(os.path.normpath(run.directory))
            a["precision"] = label_precision(a)  # --grad-dtype bf16: a column of its own beside plain bf16
            a["model"] = model_name(a)
            if a.get("tp", 1) > 1:  # a rank's tensor-parallel part: a model row of its own
                a["model"] = f"{a['model']} tp{a['tp']}{' sp' if a.get('sequence_parallel') else ''}"
            mine.append(a)
        out += sorted(mine, key=lambda c: sweep_key(c, SWEEP_KEYS))
    labels = [c["label"] for c in out]
    if len(set(labels)) < len(labels):  # runs of the same configurations: every row says its run
        for c in out:
            c["label"], c["by_run"] = f"{c['run']}-{c['label']}", True
    return out


def _size(b, scale) -> str:
    return f"{b / scale:.2f}"


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def peak_table(cs) -> str:
    """(a) Peaks: rows model x context (x batch, attention), columns phase x precision."""
    cols = sorted({(c["phase"], c["precision"]) for c in cs},
                  key=lambda k: sweep_key(dict(phase=k[0], precision=k[1]), ("phase", "precision")))
    unit, scale = unit_of([c["peak_memory_bytes"] for c in cs])
    rows = {}
    by_run = any(c.get("by_run") for c in cs)
    for c in cs:
        key = ((c["run"],) if by_run else ()) + (c["model"], int(c["context_length"]), int(c["batch_size"]),
                                                 c["attention"])
        rows.setdefault(key, {})[(c["phase"], c["precision"])] = peak_cell(c["status"], c["peak_memory_bytes"],
                                                                           scale, 2)
    header = (["Run"] if by_run else []) + ["Model", "Context", "Batch", "Attention"] + \
        [f"{ph} {p} ({unit})" for ph, p in cols]
    return _table(header, [list(k) + [v.get(col, "-") for col in cols] for k, v in rows.items()])


def phase_values(c) -> dict:
    arr = c["arrays"]
    names = list(arr["phase_name"]) if "phase_name" in arr else []
    out = {}
    for i, n in enumerate(names):
        out[n] = (int(arr["phase_live_at_end_bytes"][i]) if n == "init" else int(arr["phase_peak_bytes"][i]))
    return out


def adamw_in_backward(c) -> bool:
    """Whether the configuration's train step ran AdamW inside backward (llmhpc's default plan,
    without --separate-optimizer): no optimizer phase of its own."""
    return c["phase"] == "train-step" and not c.get("separate_optimizer", 0)


ADAMW_NOTE = ("in backward: AdamW updated each layer inside backward (llmhpc's default plan), so backward's peak "
              "includes it and there is no optimizer phase; --separate-optimizer (jobs/memory.sh's default) keeps "
              "every gradient and runs AdamW after backward, as PyTorch's step does.")


def phase_table(cs) -> str:
    """(b) After init and the peaks of each phase of the traced step; a train step whose AdamW ran
    inside backward says so in its optimizer column, with the note under the table."""
    values = {c["label"]: phase_values(c) if c["ok"] else {} for c in cs}
    unit, scale = unit_of([b for c in cs for b in [c["peak_memory_bytes"], *values[c["label"]].values()]])
    rows = []
    for c in cs:
        v = values[c["label"]]
        cells = [_size(v[p], scale) if p in v else "-" for p in PHASES]
        if adamw_in_backward(c) and "optimizer" not in v:
            cells[PHASES.index("optimizer")] = "in backward"
        rows.append([c["label"]] + cells + [peak_cell(c["status"], c["peak_memory_bytes"], scale, 2),
                                            c.get("peak_phase", "-")])
    table = _table(["Configuration"] + [f"{p} ({unit})" for p in ("after init", "forward peak", "backward peak",
                                                                   "optimizer peak", "peak")] + ["peak reached in"],
                   rows)
    return table + ("\n\n" + ADAMW_NOTE if any(adamw_in_backward(c) for c in cs) else "")


def category_table(cs) -> str:
    """(c) The peak by category."""
    ok = [c for c in cs if c["ok"]]
    cats = []
    for c in ok:
        cats += [k for k in c["arrays"]["peak_category"] if k not in cats]
    unit, scale = unit_of([c["peak_memory_bytes"] for c in ok])
    rows = []
    for c in ok:
        v = dict(zip(c["arrays"]["peak_category"], c["arrays"]["peak_category_bytes"]))
        rows.append([c["label"]] + [_size(v.get(k, 0), scale) for k in cats] + [_size(c["peak_memory_bytes"], scale)])
    return _table(["Configuration"] + [f"{k} ({unit})" for k in cats + ["peak"]], rows)


def residual_table(cs) -> str:
    """(d) One residual-stream activation, and the allocation of layer 0's residual input."""
    rows = {}
    for c in cs:
        arr = c["arrays"]
        held = "-"
        if c["ok"]:
            tags, deltas = arr["event_tag"], arr["event_delta_bytes"]
            hit = [int(d) for t, d in zip(tags, deltas) if t == "activations.layers.0.resid" and d > 0]
            held = f"{hit[0] / MIB:.2f}" if hit else "-"
        key = (c["model"], int(c["context_length"]), int(c["batch_size"]), int(c["d_model"]), c["precision"])
        rows[key] = [f"{int(c['residual_activation_bytes']) / MIB:.2f}", held]
    return _table(["Model", "Context", "Batch", "d_model", "Precision", "B*T*d*4 (MiB)", "allocated (MiB)"],
                  [list(k) + v for k, v in rows.items()])


def largest_table(cs) -> str:
    """(e) The largest allocations of each configuration, all the record holds (llmhpc --top)."""
    ok = [c for c in cs if c["ok"]]
    unit, scale = unit_of([b for c in ok for b in c["arrays"]["largest_bytes"]])
    rows = []
    for c in ok:
        a = c["arrays"]
        for i in range(len(a["largest_bytes"])):
            rows.append([c["label"] if i == 0 else "", a["largest_tag"][i], _size(int(a["largest_bytes"][i]), scale),
                         a["largest_category"][i], a["largest_phase"][i]])
    return _table(["Configuration", "tag", unit, "category", "phase"], rows)


def plot_timeline(c, path: str) -> None:
    """The active memory over the trace's events, stacked by category, phases marked (what
    memory_viz's Active Memory Timeline draws, coloured by category)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = c["arrays"]
    cats_seen = list(dict.fromkeys(a["event_category"]))
    order = [k for k in ("parameters", "bf16 weights", "gradients", "optimizer state", "saved activations",
                         "temporaries", "workspaces", "other") if k in cats_seen] + \
            [k for k in cats_seen if k not in ("parameters", "bf16 weights", "gradients", "optimizer state",
                                               "saved activations", "temporaries", "workspaces", "other")]
    # One x step per event and one per phase start (a phase without allocations still shows).
    marks = list(zip(a["phase_name"], a["phase_start_ms"])) if "phase_name" in a else []
    running = {k: 0 for k in order}
    points, starts, m = [], [], 0
    for k, d, t in zip(a["event_category"], a["event_delta_bytes"], a["event_time_ms"]):
        while m < len(marks) and marks[m][1] <= t and k is not None:
            starts.append((len(points), marks[m][0]))
            points.append(dict(running))
            m += 1
        running[k] += int(d)
        points.append(dict(running))
    for name, _ in marks[m:]:
        starts.append((len(points), name))
        points.append(dict(running))
    points.append(dict(running))
    x = np.arange(len(points))
    peak = int(c["peak_memory_bytes"])
    unit, scale = unit_of([peak])  # a tiny test model in MiB, not 0.0025 GiB
    fig, ax = plt.subplots(figsize=(12, 5))
    ax.stackplot(x, [np.array([p[k] for p in points]) / scale for k in order], labels=order, step="post")
    top = max(sum(p.values()) for p in points) / scale
    labels = []  # phases that start within 2% of the axis of each other share one label
    for i, name in starts:
        ax.axvline(i, color="k", lw=0.6, ls=":")
        if labels and i - labels[-1][0] < 0.02 * len(points):
            labels[-1][1].append(name)
        else:
            labels.append((i, [name]))
    for i, names in labels:
        ax.text(i + 0.2, top * 1.02, ", ".join(names), fontsize=8, va="bottom", rotation=60)
    ax.set_ylim(0, top * 1.25)
    ax.axhline(peak / scale, color="r", lw=0.8, ls="--", label="peak")
    ax.set_xlabel("allocation events and phase starts, in order")
    ax.set_ylabel(f"active memory ({unit})")
    ax.set_title(f"{c['label']}: peak {peak / scale:.2f} {unit}")
    # Beside the axes, top down as the stack is drawn bottom up: inside, it hid the layers it names.
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timelines(cs, out_dir: str) -> list:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for c in cs:
        if c["ok"] and len(c["arrays"]["event_delta_bytes"]):
            paths.append(os.path.join(out_dir, f"memory_{c['label']}.png"))
            plot_timeline(c, paths[-1])
    return paths


def markdown(cs, pngs=()) -> str:
    parts = ["### Peak memory by context length and precision", peak_table(cs),
             "### Memory per phase", phase_table(cs)]
    if any(c["ok"] for c in cs):  # the trace's tables: none where no configuration fitted
        parts += ["### The peak by category", category_table(cs),
                  "### One residual-stream activation", residual_table(cs),
                  "### Largest allocations", largest_table(cs)]
    else:
        parts.append("No configuration fitted: nothing traced to split by category or allocation.")
    if pngs:
        parts += ["### Active memory timelines"] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs]
    return "\n\n".join(parts) + "\n"


def report_section(runs: list, out_dir: str) -> str:
    """Markdown of the tables of `runs` (directories or llmhpc_h5.Run of mode memory); the
    timeline PNGs go into out_dir."""
    cs = configs(runs)
    if not cs:
        return ""
    return markdown(cs, plot_timelines(cs, out_dir))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", help="result directories of llmhpc --mode memory")
    p.add_argument("--png", help="write one timeline PNG per configuration into this directory")
    a = p.parse_args()
    try:
        cs = configs(run_directories(*a.dirs, mode="memory"))
    except SchemaError as e:
        print(f"memory.py: {e}", file=sys.stderr)
        return 2
    if not cs:
        print(f"memory.py: no memory records in {', '.join(a.dirs)} (was it a --mode memory run?)", file=sys.stderr)
        return 2
    try:
        pngs = plot_timelines(cs, a.png) if a.png else ()
    except OSError as e:
        print(f"memory.py: --png {a.png}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(markdown(cs, pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""report.py's train section, from llmhpc --mode train runs.

    report_section(runs, out_dir)   markdown: one row per run (model, ranks, strategy, sharding,
                                    steps (where a record the watchdog ended kept none, the step
                                    it hung at), first and last loss (6 decimals), step time mean
                                    and std, exposed sync; where a run used --tp, its tp x dp
                                    layout (sp, --tp-overlap's chunks) and the
                                    step's wait for the tensor-parallel collectives; tokens/s,
                                    global and per GPU, and the largest rank's peak memory), a
                                    line defining each column, the loss every few steps (with
                                    the learning rate where a schedule set it, the gradient norm
                                    where the run clipped); writes train_loss.png

Times are ms of rank 0 (or the rank asked for): mean and sample std (n-1) of the raw per-step
arrays over the steps after the first (after the first two under --cuda-graph), the steps the
terminal's mean and tokens/s take (timed_steps). Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fmt, markdown_table, section_script  # noqa: E402
from llmhpc_h5 import ABORTED, model_name  # noqa: E402
from scaling import gib, unit  # noqa: E402

MAX_LOSS_ROWS = 20  # the loss table shows at most this many steps, evenly spread, the last included


def stats(values) -> tuple:
    values = np.asarray(values, dtype=float)
    if not len(values):
        return float("nan"), float("nan")
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def timed_steps(steps, attrs):
    """The steps the means take, as the terminal's (src/modes/train.cpp): every step after the first,
    which also allocates and warms up, and under --cuda-graph after the second too, which records
    the graph; the one step of a one-step run."""
    skip = max(min(len(steps) - 1, 2 if attrs.get("cuda_graph") else 1), 0)
    return steps.iloc[skip:]


def hang_status(run, rank: int, rec) -> str:
    """The watchdog's sentence, with the step the run hung at, where it ended the record: the rank
    file's own status (the record reads just 'aborted by the watchdog'); else the record's."""
    if rec.status != ABORTED:
        return str(rec.status)
    return next((str(rf.status) for rf in run.files if rf.rank == rank), str(rec.status))


def steps_cell(kept: int, status: str) -> str:
    """The steps a record kept, and where the watchdog ended it at a step, that step: the record
    holds the steps of its last snapshot before the hang, which may be a few steps short of it."""
    hung = re.search(r" at step (\d+)", status)
    return f"{kept} kept (hung at step {hung.group(1)})" if hung else str(kept)


def report_section(runs: list, out_dir: str, rank=0, decimals: int = 2) -> str:
    rank = 0 if rank is None else rank
    rows, curves, parts, stand_ins = [], [], [], []
    # A run without the asked rank's file (one lost or not written) is read from its lowest rank.
    records = []
    for run in runs:
        mine = rank if rank in run.ranks else min(run.ranks)
        if mine != rank:
            stand_ins.append(f"- `{run.directory}` has no file for rank {rank}: its row is rank {mine}'s.")
        records.append((run, mine, run.train_record(mine), run.train_steps(mine)))
    per = unit({"device_name": [run.attrs["device_name"] for run in runs]})
    # Tensor parallelism's columns where a run used it: the tp x dp layout and what the step
    # waited for the tensor-parallel group's collectives (tp_comm_ms).
    any_tp = any(int(rec.attrs.get("tp", 1)) > 1 for _, _, rec, _ in records)
    for run, mine, rec, steps in records:
        a, timed = rec.attrs, timed_steps(steps, rec.attrs)
        step_mean, step_std = stats(timed.get("step_ms", []))
        sync_mean, _ = stats(timed.get("sync_ms", []))
        # The global batch's tokens over the step's wall time, as the terminal's tokens/s.
        tokens = int(a["batch_size"]) * int(a["context_length"]) / (stats(timed.get("wall_ms", []))[0] / 1e3)
        peak = max((r.attrs["peak_memory_bytes"] for r in run.records("train", None) if "peak_memory_bytes" in r.attrs),
                   default=math.nan)
        loss = steps["loss"].to_numpy() if "loss" in steps else np.array([])
        tp = int(a.get("tp", 1))
        overlap = int(a.get("tp_overlap", 1))
        layout = [f"tp {tp} x dp {a.get('dp', a.get('world_size'))}" + (" sp" if a.get("sequence_parallel") else "")
                  + (f", products in {overlap} chunks" if overlap > 1 else "")
                  if tp > 1 else "dp " + str(a.get("world_size"))] if any_tp else []
        tp_wait = [fmt(stats(timed["tp_comm_ms"])[0], decimals) if "tp_comm_ms" in timed else "-"] if any_tp else []
        # Hybrid sharding: the state cut within groups of the data-parallel ranks, replicated across.
        sharding, group = a.get("shard_optimizer", "none"), int(a.get("shard_group", 0) or 0)
        if 0 < group < int(a.get("dp", a.get("world_size", 1))):
            sharding += f" in groups of {group}"
        rows.append([os.path.basename(os.path.normpath(run.directory)), model_name(a), a.get("world_size")] + layout +
                    [str(a.get("ddp")) + (" bf16" if a.get("grad_reduce_dtype") == "bf16" and a.get("grad_dtype") != "bf16"
                                          else ""),
                     sharding, rec.status, steps_cell(len(steps), hang_status(run, mine, rec)),
                     fmt(loss[0], 6) if len(loss) else "-", fmt(loss[-1], 6) if len(loss) else "-",
                     fmt(step_mean, decimals), fmt(step_std, decimals), fmt(sync_mean, decimals)] + tp_wait +
                    ["-" if math.isnan(tokens) else f"{tokens:,.0f}",
                     "-" if math.isnan(tokens) else f"{tokens / int(a['world_size']):,.0f}", gib(peak)])
        if len(steps):  # a record written before its first step (a run that hung or stopped early) has none
            curves.append((os.path.basename(os.path.normpath(run.directory)), steps))
            pick = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), MAX_LOSS_ROWS)).astype(int))
            scheduled = "lr" in steps and (a.get("lr_schedule", "constant") != "constant" or
                                           a.get("lr_warmup_steps", 0) > 0)
            clipped = "grad_norm" in steps
            parts.append(f"### Loss of {run.directory} (rank {mine})\n\n" + markdown_table(
                ["Step", "Loss"] + (["LR"] if scheduled else []) + (["Grad norm"] if clipped else []) + ["Step (ms)"],
                [[int(steps.step.iloc[i]), f"{steps.loss.iloc[i]:.6f}"]
                 + ([f"{steps.lr.iloc[i]:.3e}"] if scheduled else [])
                 + ([f"{steps.grad_norm.iloc[i]:.4f}"] if clipped else [])
                 + [fmt(steps.step_ms.iloc[i], decimals)] for i in pick]))
    table = markdown_table(["Run", "Model", "Ranks"] + (["Layout"] if any_tp else []) +
                           ["DDP", "Sharding", "Status", "Steps", "First loss", "Last loss", "Step Mean (ms)",
                            "Step Std (ms)", "Sync Mean (ms)"] + (["TP wait Mean (ms)"] if any_tp else []) +
                           ["Tokens/s", f"Tokens/s per {per}", "Peak per rank (GiB)"], rows)
    table += "\n\n" + "\n".join([
        f"- Means and Std: rank {rank}'s steps after the first (after the first two under --cuda-graph, whose "
        "second step records the graph), the steps the terminal's mean step and tokens/s take; Steps counts them all.",
        *stand_ins,
        "- Step: the whole step as the rank timed it on its device (step_ms), without the host's part.",
        "- Sync: the gradients' exposed communication, what backward did not hide (sync_ms; '-' without --ddp).",
        *(["- TP wait: what the layers waited for the tensor-parallel group's collectives (tp_comm_ms), inside "
           "forward and backward and so in Step, not added to it; '-' without --tp."] if any_tp else []),
        "- Tokens/s: global batch x context over the mean wall time of a step (wall_ms: the device's step and the "
        "host's part, drawing the batch and reducing the loss), as the terminal's; per "
        f"{per}: that over the ranks.",
        "- Peak per rank: the largest rank's allocator peak (peak_memory_bytes; host memory on the CPU)."])
    if not curves:
        return "\n\n".join([f"### Training runs\n\n{table}", *parts,
                             "No run recorded a step yet: no loss curve to draw."])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, steps) in enumerate(curves):
        color = colors[i % len(colors)]
        # Per-batch losses jump around their trend: drawn faint, with their exponential moving
        # average (what TensorBoard's smoothing shows) drawn over them once there are enough.
        smooth = len(steps) >= 20
        ax.plot(steps["step"], steps["loss"], color=color, lw=0.8, alpha=0.35 if smooth else 1.0,
                label=None if smooth else label)
        if smooth:
            ema = steps["loss"].ewm(alpha=min(0.5, 10.0 / len(steps)), adjust=True).mean()
            ax.plot(steps["step"], ema, color=color, lw=1.8, label=f"{label} (moving average)")
    ax.set(xlabel="step", ylabel="loss (nats)", title="training loss")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "train_loss.png"), dpi=110)
    plt.close(fig)
    return "\n\n".join([f"### Training runs\n\n{table}", *parts, "![training loss](train_loss.png)"])


if __name__ == "__main__":
    section_script("train")

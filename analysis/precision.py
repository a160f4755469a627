"""The reference mixed-precision study's tables from llmhpc --mode precision runs (report.py's precision section).

    report_section(runs, out_dir)   markdown, per run: the accumulation experiment (each way of
                                    summing `additions` copies of `value`: the sum as PyTorch
                                    prints it, the sum, its error) and the dtype of every tensor
                                    under the run's --precision beside torch.autocast's

Rank 0's records (the mode runs the same on every rank). Files are read only through
analysis/llmhpc_h5.py; nothing is drawn.
"""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import markdown_table, section_script  # noqa: E402
from llmhpc_h5 import open_run  # noqa: E402


def torch_print(v: float) -> str:
    """A 0-dim float tensor's value as PyTorch prints it: 4 decimals ("10.0001"), "4." when
    integral, scientific from 1e8 up and below 1e-4 ("3.0000e-05") (llmhpc's torch_print)."""
    if v != 0 and math.isfinite(v) and (abs(v) >= 1e8 or abs(v) < 1e-4):
        return f"{v:.4e}"
    text = f"{v:.4f}"
    return text.rstrip("0") if text.rstrip("0").endswith(".") else text


def accumulation_table(record) -> str:
    a = record.attrs
    exact = float(a["value"]) * int(a["additions"])
    rows = [[experiment, torch_print(float(s)), f"{float(s):.9f}", f"{float(s) - exact:+.6f}"]
            for experiment, s in zip(record.arrays["experiment"], record.arrays["sum"])]
    return (f"{a['additions']} additions of {a['value']:g} on {a['device']} (exact: {exact:g})\n\n" +
            markdown_table(["Experiment", "As PyTorch prints it", "Sum", "Error"], rows))


def dtype_table(record) -> str:
    a, t = record.attrs, record.arrays
    notes = t["note"] if "note" in t else [""] * len(t["tensor"])  # files before the note kept none
    rows = [[tensor, ours, theirs, "yes" if same else f"**no**{': ' + note if note else ''}"]
            for tensor, ours, theirs, same, note in zip(t["tensor"], t["llmhpc_dtype"], t["autocast_dtype"],
                                                        t["same_values"], notes)]
    return (f"--precision {a['precision']}, model {a['model']}, {a['attention']} attention\n\n" +
            markdown_table(["Tensor", "llmhpc", "torch.autocast", "Same values"], rows))


def report_section(runs: list, out_dir: str) -> str:
    parts = []
    for run in runs:
        run = open_run(run) if isinstance(run, str) else run
        records = {r.name: r for r in run.records("precision", rank=0)}
        for name, title, table in (("accumulation", "Accumulation", accumulation_table),
                                   ("dtypes", "The dtype of each tensor", dtype_table)):
            r = records.get(name)
            if r is None:
                continue
            body = table(r) if r.ok else f"not measured: {r.status}"
            parts.append(f"### {title} ({os.path.basename(run.directory.rstrip('/'))})\n\n{body}")
    return "\n\n".join(parts) if parts else "no precision records"


if __name__ == "__main__":  # a section of report.py's, with no command line of its own
    section_script("precision")

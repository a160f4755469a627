#!/usr/bin/env python3
"""The table of one or more comm runs (llmhpc --mode comm) as markdown, like nccl-tests prints it.

    python3 analysis/comm.py results/comm-20261122-103000 [more run directories ...]

One row per run, collective, dtype and size; out-of-place and in-place side by side. As in
the binary's own summary: time is nccl-tests' time, the mean per operation of `iters`
operations issued back to back (time_us_back_to_back) averaged over ranks (files written
before that dataset existed: the mean of the slowest rank's per-iteration times), algbw = bytes / time,
busbw = algbw * bus_factor (nccl-tests' definitions, GB/s = 1e9 B/s), #wrong the sum over
ranks of wrong elements (N/A without --check). Files are read through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import SchemaError, open_run  # noqa: E402

PLACEMENTS = (("outofplace", "oop"), ("inplace", "ip"))
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast")  # the order llmhpc runs them in


def format_us(us: float) -> str:
    """nccl-tests' time format: fewer decimals for longer times."""
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 100 else f"{us:.2f}"


def operation_time_us(records: list) -> float:
    """nccl-tests' time of one operation from every rank's (ok) record of a configuration: the
    back-to-back mean averaged over ranks, or for files without it the mean of the slowest rank's
    per-iteration times."""
    if all("time_us_back_to_back" in r.arrays for r in records):
        return float(np.mean([r.arrays["time_us_back_to_back"][0] for r in records]))
    times = np.max(np.stack([np.asarray(r.arrays["time_us"], dtype=float) for r in records]), axis=0)
    return float(times.mean())


def summarize(records: list) -> dict:
    """One configuration from every rank's record of it: time per operation, bandwidths, #wrong."""
    first = records[0]
    if any(not r.ok for r in records):
        status = "; ".join(sorted({r.status for r in records if not r.ok}))
        return dict(time=status, algbw="-", busbw="-", wrong="-", busbw_value=None)
    time_us = operation_time_us(records)
    algbw = first.attrs["bytes"] / (time_us * 1e3)
    busbw = algbw * first.attrs["bus_factor"]
    wrongs = [int(r.arrays["wrong"][0]) for r in records]
    wrong = "N/A" if any(w < 0 for w in wrongs) else str(sum(wrongs))
    return dict(time=format_us(time_us), algbw=f"{algbw:.2f}", busbw=f"{busbw:.2f}", wrong=wrong, busbw_value=busbw)


def comm_rows(run) -> list:
    """One dict per collective, dtype and size of a run, with both placements' results."""
    if run.mode != "comm":
        raise SchemaError(f"{run.directory}: a '{run.mode}' run, not a comm run")
    rows = {}
    for records in run.records_by_name("comm", rank=None).values():
        a = records[0].attrs
        key = (a["collective"], a["dtype"], a["requested_bytes"])
        row = rows.setdefault(key, dict(backend=a["backend"], ranks=run.world_size, collective=a["collective"],
                                         size=a["bytes"], count=a["count"], type=a["dtype"], redop=a["redop"],
                                         root=a["root"]))
        for placement, short in PLACEMENTS:
            if a["placement"] == placement:
                for k, v in summarize(records).items():
                    row[f"{short} {k}"] = v
    # The files list groups alphabetically; the table follows the binary's order.
    order = lambda key: (COLLECTIVES.index(key[0]) if key[0] in COLLECTIVES else len(COLLECTIVES), key[1], key[2])
    return [rows[key] for key in sorted(rows, key=order)]


def markdown(rows: list) -> str:
    present = [short for _, short in PLACEMENTS if any(f"{short} time" in r for r in rows)]
    columns = [("backend", "backend"), ("ranks", "ranks"), ("collective", "collective"), ("size", "size (B)"),
               ("count", "count"), ("type", "type"), ("redop", "redop"), ("root", "root")]
    for short in present:
        columns += [(f"{short} time", f"{short} time (us)"), (f"{short} algbw", f"{short} algbw (GB/s)"),
                    (f"{short} busbw", f"{short} busbw (GB/s)"), (f"{short} wrong", f"{short} #wrong")]
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "|".join("---" if key in ("backend", "collective", "type", "redop") else "---:"
                            for key, _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(key, "-")) for key, _ in columns) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="--out directories of llmhpc --mode comm runs")
    args = parser.parse_args()
    rows = []
    for directory in args.runs:
        try:
            run = open_run(directory)
            rows += comm_rows(run)
        except SchemaError as e:
            print(f"comm.py: {e}", file=sys.stderr)
            return 2
        print(f"<!-- {directory}: {run.attrs['device_name']} on {run.attrs['hostname']}, {run.world_size} rank(s), "
              f"{run.attrs['start_time']}, git {run.attrs['git_sha']} -->")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

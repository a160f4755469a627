#!/usr/bin/env python3
"""Where a GPU slowed its clock while llmhpc measured: from the device sensors of every record.

    python3 analysis/device_clocks.py results/bench-1234 [more DIRs]     # records that slowed
    python3 analysis/device_clocks.py DIR --all                          # every record with readings

Every sweep record (bench, attention, ddp, profile, memory, precision), comm record and /train
holds the GPU's SM clock, power, temperature and NVML's clock event reasons, read every
--device-sample-ms while it ran (docs/hdf5-schema.md, "Device sensors"). One row per record and rank: the busy readings'
SM clock (min / median / max), the slowdown reasons seen (sw power cap, thermal, ...), and the
highest power and temperature read. A configuration whose GPU slowed was timed at the slower
clock; two that slowed differently do not compare as they would at one clock.
report_section(runs, out_dir) gives the table for analysis/report.py (empty when nothing slowed).
Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import SchemaError, open_run, run_directories  # noqa: E402


def _top(values) -> float:
    finite = [float(v) for v in values if not math.isnan(float(v))] if values is not None else []
    return max(finite) if finite else math.nan


def _fmt(value, decimals: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{decimals}f}"


def rows(runs: list, every: bool = False) -> list:
    """[(run directory, record, rank, clock text, slowdowns, max power W, max temperature C)] of the
    records whose busy readings had a slowdown reason (every: of every record with readings)."""
    out = []
    for run in runs:
        for rec in run.records(rank=None):
            reasons = str(rec.attrs.get("device_slowdowns", ""))
            if not reasons or (reasons == "none" and not every):
                continue
            clocks = " / ".join(_fmt(float(rec.attrs.get(f"device_sm_clock_mhz_{k}", math.nan))) for k in
                                ("min", "median", "max"))
            power = _top(rec.arrays.get("device_power_w"))
            temperature = _top(rec.arrays.get("device_temperature_c"))
            out.append((run.directory, rec.path, rec.rank, clocks, reasons, power, temperature))
    return out


def table(found: list) -> str:
    lines = ["| run | record | rank | SM clock min / median / max (MHz) | slowdowns | power max (W) | temperature max (C) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{d}` | {path} | {rank} | {clocks} | {reasons} | {_fmt(power)} | {_fmt(temp)} |"
              for d, path, rank, clocks, reasons, power, temp in found]
    return "\n".join(lines)


def report_section(runs: list, out_dir: str) -> str:  # noqa: ARG001 (report.py's signature)
    found = rows(runs)
    if not found:
        return ""
    return ("Records whose GPU slowed its clock while they were measured (busy readings only; their times "
            "include the slower clock):\n\n" + table(found))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (llmhpc --out)")
    parser.add_argument("--all", action="store_true", help="every record with readings, not only those that slowed")
    args = parser.parse_args(argv)
    try:
        runs = [open_run(d) for d in run_directories(*args.dirs)]
    except SchemaError as e:
        print(f"device_clocks.py: error: {e}", file=sys.stderr)
        return 2
    found = rows(runs, every=args.all)
    if not found:
        print("no record " + ("has device readings" if args.all else "slowed its clock (or none has readings: "
                                                                       "CPU runs, --device-sample-ms 0)"))
        return 0
    print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

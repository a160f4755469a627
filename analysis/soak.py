#!/usr/bin/env python3
"""Soak verdicts of comm and ddp runs: does the per-iteration time drift, does memory grow?

    python3 analysis/soak.py DIR... [--drift-pct 5] [--growth-mib 16] [--jsonl FILE]

For every record of mode comm (time_us) and ddp (step_ms) on every rank, usually of runs made
with --duration-s: the timed iterations and their summed time; time drift, the median of the
last 10% of iterations against the first 10% in %, and the least-squares slope of the time
(the medians of 50 equal slices) against the elapsed time, in % of the first 10%'s median per
minute; memory from the samples
llmhpc takes between timed iterations (memory_iteration, device_live_bytes, device_used_bytes,
host_rss_bytes): the device allocator's live bytes, last - first and max - first; the driver's
count of device memory in use (GPUs only) and the host's resident set (less the run's own arrays
of times, records_bytes), last - the first sample taken at or after 10% of the iterations
(start-up settles in the first tenth). A record "held"
when |drift| <= --drift-pct, the live bytes ended no higher than they started, and device-used
and RSS growth are at most --growth-mib; otherwise the verdict says what did not hold. One cut
short (a signal, or a kill after a --flush-s write) is measured on the iterations it kept and
does not hold: it did not run its duration. A comm loop past 10 million iterations records 1
in time_us_every of them, evenly over it: its tenths, slices and medians are of those, its
iterations and summed time scaled by time_us_every.

Prints a markdown table; exit status 1 when a record did not hold (each failure also on
stderr), 2 when a folder cannot be read. --jsonl FILE appends one row per record: its numbers
and, to stay small, the time series as medians of 50 equal slices and at most 50 memory
samples. report_section is analysis/report.py's soak section (runs whose records have
duration_s > 0). Each DIR is a run directory or a folder of them; files are read through
analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import SchemaError, open_run, pooled_status, run_directories  # noqa: E402

# The per-iteration time of each mode's records, its unit and seconds per unit.
TIMES = {"comm": ("time_us", "us", 1e-6), "ddp": ("step_ms", "ms", 1e-3)}
MEMORY = ("memory_iteration", "device_live_bytes", "device_used_bytes", "host_rss_bytes")
DRIFT_PCT = 5.0      # |median of the last tenth / the first tenth - 1| at most this
GROWTH_MIB = 16.0    # device-used and RSS growth after the first tenth at most this
MIN_ITERATIONS = 20  # fewer: a tenth is one or two iterations, too few to judge
BINS = 50            # slices of a series: the slope's points, and a series in --jsonl
MIB = float(1 << 20)


def tenth(n: int) -> int:
    """Iterations in a tenth of n, at least 1."""
    return max(1, n // 10)


def time_drift(times: np.ndarray, every: int = 1) -> tuple:
    """Of times in seconds, each standing for `every` iterations: (median of the first tenth, of the
    last tenth, drift in %, slope in % of the first tenth's median per minute). The slope is the
    least-squares line through the medians of BINS equal slices against the elapsed time at each
    slice's middle: medians, as for the drift, so that a few iterations a busy host delayed 100-fold
    do not make the line."""
    k = tenth(len(times))
    first, last = float(np.median(times[:k])), float(np.median(times[-k:]))
    ended_min = np.cumsum(times) * every / 60.0  # about when each iteration ended
    slices = np.array_split(np.arange(len(times)), min(BINS, len(times)))
    x = np.array([ended_min[s[len(s) // 2]] for s in slices])
    y = np.array([np.median(times[s]) for s in slices])
    slope = float(np.polyfit(x, y, 1)[0]) if len(slices) > 1 else math.nan
    return first, last, 100.0 * (last / first - 1.0), slope / first * 100.0


def growth_after_tenth(iteration: np.ndarray, values: np.ndarray, n: int):
    """values[-1] - the first value sampled at or after iteration n/10; None where not measured (-1)."""
    if len(values) == 0 or values.min() < 0:
        return None
    start = int(np.searchsorted(iteration, n // 10))
    return int(values[-1] - values[min(start, len(values) - 1)])


def record_row(run, rec, drift_pct: float = DRIFT_PCT, growth_mib: float = GROWTH_MIB) -> dict:
    """One record's numbers and verdict (a dict; NaN / None where not measured)."""
    kind = rec.kind
    key, unit, unit_s = TIMES[kind]
    row = dict(run=os.path.basename(os.path.normpath(run.directory)), record=rec.path, rank=rec.rank, mode=kind,
               unit=unit, status=rec.status, duration_s_asked=float(rec.attrs.get("duration_s", 0.0)),
               iterations=0, duration_s=math.nan, first=math.nan, last=math.nan, drift_pct=math.nan,
               slope_pct_per_min=math.nan, live_growth_bytes=None, live_max_growth_bytes=None,
               used_growth_bytes=None, rss_growth_bytes=None)
    failed = []
    # One cut short (a signal, a kill after a --flush-s write) is judged on the iterations it kept,
    # and does not hold: it did not run its duration.
    if not rec.ok:
        failed.append(f"cut short: {pooled_status([rec])}" if rec.kept_steps else f"status {rec.status}")
    times = np.asarray(rec.arrays[key], dtype=float) if rec.measured and key in rec.arrays else np.array([])
    every = int(rec.attrs.get(f"{key}_every", 1))  # iterations per recorded time
    n = len(times) * every
    row["iterations"] = n
    if rec.measured and n < MIN_ITERATIONS:
        failed.append(f"{n} iterations, too few to judge (at least {MIN_ITERATIONS})")
    if n:
        row["duration_s"] = float(times.sum() * every * unit_s)
        first, last, drift, slope = time_drift(times * unit_s, every)
        # A slope per minute over well under a second of iterations says nothing: none given.
        row.update(first=first / unit_s, last=last / unit_s, drift_pct=drift,
                   slope_pct_per_min=slope if n >= MIN_ITERATIONS else math.nan)
        if abs(drift) > drift_pct:
            failed.append(f"time drift {drift:+.1f}% (bound ±{drift_pct:g}%)")
    if rec.measured and not all(name in rec.arrays for name in MEMORY):
        failed.append("no memory samples (written by an llmhpc without them)")
    elif rec.measured:
        iteration = np.asarray(rec.arrays["memory_iteration"])
        live = np.asarray(rec.arrays["device_live_bytes"])
        if len(live):
            row["live_growth_bytes"] = int(live[-1] - live[0])
            row["live_max_growth_bytes"] = int(live.max() - live[0])
            if live[-1] > live[0]:
                failed.append(f"device live bytes grew by {(live[-1] - live[0]) / MIB:.2f} MiB")
        # The host's resident set less the run's own arrays of times (records_bytes), which grow
        # where --duration-s re-aims the count upwards.
        records = np.asarray(rec.arrays.get("records_bytes", np.zeros(len(iteration))))
        for name, label in (("device_used_bytes", "device memory in use"), ("host_rss_bytes", "host RSS")):
            values = np.asarray(rec.arrays[name]) - (records if name == "host_rss_bytes" else 0)
            growth = growth_after_tenth(iteration, values, n)
            row["used_growth_bytes" if name == "device_used_bytes" else "rss_growth_bytes"] = growth
            if growth is not None and growth > growth_mib * MIB:
                failed.append(f"{label} grew by {growth / MIB:.1f} MiB after the first tenth (bound {growth_mib:g} MiB)")
    row["held"] = not failed
    row["verdict"] = "held" if not failed else "; ".join(failed)
    return row


def soak_rows(run, drift_pct: float = DRIFT_PCT, growth_mib: float = GROWTH_MIB) -> list:
    """A row per comm and ddp record of every rank of `run`."""
    return [record_row(run, rec, drift_pct, growth_mib)
            for kind in TIMES for rec in run.records(kind, rank=None)]


def is_soak(run) -> bool:
    """True when a comm or ddp record of the run was timed for a duration (--duration-s)."""
    return any(float(r.attrs.get("duration_s", 0.0)) > 0 for kind in TIMES for r in run.records(kind, rank=None))


def mib(value) -> str:
    return "-" if value is None else f"{value / MIB:+.2f}"


def markdown(rows: list) -> str:
    header = ("| run | record | rank | iterations | duration (s) | first 10% → last 10% | drift | slope (%/min) "
              "| device live: last, max − first (MiB) | device used (MiB) | host RSS (MiB) | verdict |\n"
              "|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|")
    lines = []
    for r in rows:
        timing = f"{r['first']:.4g} → {r['last']:.4g} {r['unit']}" if r["iterations"] else "-"
        live = "-" if r["live_growth_bytes"] is None else \
            f"{mib(r['live_growth_bytes'])}, {mib(r['live_max_growth_bytes'])}"
        drift = "-" if math.isnan(r["drift_pct"]) else f"{r['drift_pct']:+.2f}%"
        slope = "-" if math.isnan(r["slope_pct_per_min"]) else f"{r['slope_pct_per_min']:+.3f}"
        duration = "-" if math.isnan(r["duration_s"]) else f"{r['duration_s']:.1f}"
        verdict = "held" if r["held"] else f"**{r['verdict']}**"
        lines.append(f"| {r['run']} | {r['record']} | {r['rank']} | {r['iterations']} | {duration} | {timing} | "
                     f"{drift} | {slope} | {live} | {mib(r['used_growth_bytes'])} | {mib(r['rss_growth_bytes'])} | "
                     f"{verdict} |")
    return "\n".join([header, *lines])


def bounds_text(drift_pct: float = DRIFT_PCT, growth_mib: float = GROWTH_MIB) -> str:
    return (f"held: |drift| ≤ {drift_pct:g}% (median of the last 10% of iterations against the first 10%), "
            f"device live bytes last ≤ first, device memory in use and host RSS growing at most {growth_mib:g} MiB "
            f"from the first sample after 10% of the iterations to the last")


def report_section(runs: list, out_dir: str) -> str:
    """report.py's soak section: the table of every comm and ddp record of `runs`."""
    rows = [row for run in runs for row in soak_rows(run)]
    return f"{bounds_text()}.\n\n{markdown(rows)}"


def binned(values: np.ndarray, bins: int = BINS) -> list:
    """Medians of `bins` equal slices (all values when there are fewer)."""
    if len(values) <= bins:
        return [float(v) for v in values]
    return [float(np.median(part)) for part in np.array_split(values, bins)]


def jsonl_row(run, rec, row: dict) -> dict:
    """--jsonl: the record's configuration, its numbers, and its series made small."""
    a = run.attrs
    config = {k: v for k, v in rec.attrs.items() if isinstance(v, (int, float, str)) and not k.startswith("memory_")}
    out = dict(tool="llmhpc", device=a["device_name"], host=a["hostname"], git_sha=a["git_sha"],
               start_time=a["start_time"], argv=a["argv"], config=config)
    out.update({k: v for k, v in row.items()})
    key, _, _ = TIMES[rec.kind]
    if rec.measured and key in rec.arrays:
        out[f"{key}_binned_medians"] = binned(np.asarray(rec.arrays[key], dtype=float))
    if rec.measured and all(name in rec.arrays for name in MEMORY):
        picks = np.unique(np.linspace(0, len(rec.arrays["memory_iteration"]) - 1, BINS).astype(int))
        out.update({name: [int(v) for v in np.asarray(rec.arrays[name])[picks]] for name in MEMORY})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (llmhpc --out) or a folder of them")
    parser.add_argument("--drift-pct", type=float, default=DRIFT_PCT, help=f"time drift bound in %% ({DRIFT_PCT:g})")
    parser.add_argument("--growth-mib", type=float, default=GROWTH_MIB,
                        help=f"device-used and host RSS growth bound in MiB ({GROWTH_MIB:g})")
    parser.add_argument("--jsonl", help="append one row per record to this file")
    args = parser.parse_args(argv)
    try:
        runs = [open_run(d) for d in run_directories(*args.dirs)]
        pairs = [(run, rec, record_row(run, rec, args.drift_pct, args.growth_mib))
                 for run in runs for kind in TIMES for rec in run.records(kind, rank=None)]
    except SchemaError as e:
        print(f"soak.py: error: {e}", file=sys.stderr)
        return 2
    if not pairs:
        print(f"soak.py: error: no comm or ddp records in {' '.join(args.dirs)}", file=sys.stderr)
        return 2
    print(f"{bounds_text(args.drift_pct, args.growth_mib)}.\n")
    print(markdown([row for _, _, row in pairs]))
    if args.jsonl:
        try:
            with open(args.jsonl, "a") as f:
                for run, rec, row in pairs:
                    f.write(json.dumps(jsonl_row(run, rec, row), separators=(",", ":")) + "\n")
        except OSError as e:
            print(f"soak.py: error: --jsonl {args.jsonl}: {e.strerror or e}", file=sys.stderr)
            return 2
    failed = [row for _, _, row in pairs if not row["held"]]
    for row in failed:
        print(f"soak.py: did not hold: {row['run']} {row['record']} rank {row['rank']}: {row['verdict']}",
              file=sys.stderr)
    print(f"\n{len(pairs) - len(failed)} of {len(pairs)} record(s) held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

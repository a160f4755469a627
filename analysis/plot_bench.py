#!/usr/bin/env python3
"""Plots bench times against model size, one panel per precision and timed phase, as a PNG.

    python3 analysis/plot_bench.py DIR [DIR ...] [-o bench.png] [--rank R | --all-ranks]

Rows: precisions, fp32 first; columns: the timed phases (forward, backward, optimizer, whole
step; backward+AdamW where AdamW ran inside backward, without --separate-optimizer); in each
panel the mean time against the number of parameters (log-log), one line per context length,
error bars the sample standard deviation of the raw per-step times. With fp32 and bf16 runs (or
fp64), bench_speedup_bf16.png beside it: the whole step's speed-up fp32 / bf16 (from CPU runs,
with the caveat that CPU bf16 says nothing of bf16 hardware). Configurations that did not run
(oom, error) are left out, and counted and named under the title (the first 8; the tables of
report.py list them all). The PNG goes beside the results (DIR/bench.png of the first DIR)
unless -o says otherwise. analysis/report.py draws the same.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import other_precisions, plot_speedup, plot_times, summaries  # noqa: E402
from llmhpc_h5 import SchemaError, open_run, run_directories  # noqa: E402
from outputs import unwritable  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR")
    parser.add_argument("-o", "--output", help="PNG to write (default DIR/bench.png of the first DIR)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0)
    which.add_argument("--all-ranks", action="store_true")
    args = parser.parse_args(argv)
    output = args.output or os.path.join(args.dirs[0], "bench.png")
    if os.path.splitext(output)[1].lower() not in (".png", ".pdf", ".svg"):
        print(f"plot_bench.py: error: -o {output}: give a .png, .pdf or .svg file to draw into", file=sys.stderr)
        return 2
    try:
        runs = [open_run(d) for d in run_directories(*args.dirs, mode="bench")]
        summary = summaries(runs, None if args.all_ranks else args.rank)
        if summary.empty:
            raise SchemaError(f"no bench records in {', '.join(args.dirs)}")
    except SchemaError as e:
        print(f"plot_bench.py: error: {e}", file=sys.stderr)
        return 2
    why = unwritable(os.path.dirname(os.path.abspath(output)))  # as report.py: made where it is missing
    if why:
        print(f"plot_bench.py: error: -o {output}: {why}", file=sys.stderr)
        return 2
    who = "all ranks pooled" if args.all_ranks else f"rank {args.rank}"
    title = (f"llmhpc bench on {runs[0].attrs['device_name']}, {who}, batch "
             f"{', '.join(map(str, sorted(summary['batch_size'].unique())))}")
    if not plot_times(summary, title, output):
        print("plot_bench.py: error: no configuration ran (all oom or error)", file=sys.stderr)
        return 2
    print(f"wrote {output}")
    for other in other_precisions(summary):
        speedup = plot_speedup(summary, os.path.join(os.path.dirname(os.path.abspath(output)),
                                                     f"bench_speedup_{other}.png"), other)
        if speedup:
            print(f"wrote {speedup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
